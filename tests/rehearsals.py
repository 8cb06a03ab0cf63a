"""What the `tpulaunch rehearse` tests share (`tests/estimator/remote/test_rehearse.py`, `tests/estimator/remote/test_rerun.py`): the job
they rehearse, running it, and reading what it left in model_dir.

The job is the quickstart CNN trained by `tpulaunch train` on the rehearsal's TPU VM, on this machine's CPU (20
steps, a checkpoint every 5, batch 8, 64 records). Its builder (staged next to the job file, so staging the job's
own code is proven too) pauses 0.2 s a step, so that the controller reads a step from the run's log while the run
still trains it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from paths import REPO

SLOW_MODELS = textwrap.dedent("""\
    import os
    import time

    import tensorflow as tf

    from tpulaunch.models.cnn import build as cnn


    def _pause(x):
        def sleep(value):
            time.sleep(0.2)
            return value
        return tf.ensure_shape(tf.numpy_function(sleep, [x], x.dtype), x.shape)


    def build(**params):
        model = cnn(**params)
        inputs = tf.keras.Input(shape=(32, 32, 3), name="image")
        return tf.keras.Model(inputs, model(tf.keras.layers.Lambda(_pause)(inputs)))


    def broken(**params):
        raise ValueError("this builder is broken on purpose")


    _calls = []


    def _held(x):
        # From its 6th step on, each step waits while the file $REHEARSAL_HOLD exists: a run that stays mid-training
        # until the test lets it go on.
        _calls.append(1)
        while len(_calls) >= 6 and os.path.exists(os.environ.get("REHEARSAL_HOLD", "")):
            time.sleep(0.05)
        return x


    def held(**params):
        model = build(**params)
        inputs = tf.keras.Input(shape=(32, 32, 3), name="image")
        hold = tf.keras.layers.Lambda(lambda x: tf.ensure_shape(tf.numpy_function(_held, [x], x.dtype), x.shape))
        return tf.keras.Model(inputs, model(hold(inputs)))


    def with_token(api_token, conn, **params):
        import hashlib
        print("builder | api_token sha256", hashlib.sha256(api_token.encode()).hexdigest(), flush=True)
        print("builder | conn sha256", hashlib.sha256(conn.encode()).hexdigest(), flush=True)
        return build(**params)
    """)

JOB = textwrap.dedent("""\
    name: quickstart
    model:
      builder: slow_models:build
      params: {num_classes: 10}
      loss: sparse_categorical_crossentropy
      optimizer: {name: adam, learning_rate: 0.003}
    data:
      train: ../data/train-*.tfrecord
      eval: ../data/eval-*.tfrecord
      features:
        image: {shape: [32, 32, 3], dtype: float32}
      labels:
        label: {shape: [], dtype: int64}
    tpu: {name: rehearsal-tpu, zone: us-central1-a, project: test-project, type: v3-8}
    train: {batch_size: 8, steps: 20}
    eval: {batch_size: 8, steps: 2}
    run: {model_dir: runs/q, save_checkpoints_steps: 5, log_every_steps: 1}
    """)


def rehearsal_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPULAUNCH_TPU", "TPU_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**env, "NO_GCE_CHECK": "True", **extra}


def rehearse(job: Path, *args: str, **env) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "tpulaunch", "rehearse", str(job), *args], cwd=job.parent,
                              env=rehearsal_env(**env), capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as hung:  # say where it stood, and what each host last wrote
        said = [(hung.stdout or b"").decode(errors="replace")[-3000:], (hung.stderr or b"").decode(errors="replace")[-3000:]]
        for log in sorted(job.parent.glob("runs/q/tpulaunch-remote/attempts/*/*")):
            said.append(f"--- {log.relative_to(job.parent)}\n" + log.read_text(errors="replace")[-1500:])
        raise AssertionError("rehearse did not end within 300 s:\n" + "\n".join(said)) from None


def run_record(job: Path) -> dict:
    return json.loads((job.parent / "runs/q/tpulaunch-remote/run.json").read_text())


def synth_data(root: Path) -> Path:
    """The quickstart's records under root/data, for the jobs made under root (their paths are ../data/...)."""
    subprocess.run([sys.executable, "-m", "tpulaunch", "data", "synth", "--example", "quickstart", str(root / "data"),
                    "--records", "64"], check=True, cwd=REPO, capture_output=True)
    return root


def write_job(folder: Path) -> Path:
    folder.mkdir()
    (folder / "slow_models.py").write_text(SLOW_MODELS)
    (folder / "job.yaml").write_text(JOB)
    return folder / "job.yaml"


def checkpoint_step(job: Path) -> int:
    """The step of model_dir's newest checkpoint, as TensorFlow's `checkpoint` index file names it."""
    text = (job.parent / "runs/q/checkpoint").read_text()
    return int(re.search(r'^model_checkpoint_path: ".*-(\d+)"', text, re.M).group(1))


def started(job: Path, *args: str, until: str, **env):
    """`rehearse` started, its output (stdout and stderr together) read into a list; the event is set when a line
    starts with `until`, or when the output ends."""
    process = subprocess.Popen([sys.executable, "-m", "tpulaunch", "rehearse", str(job), *args], cwd=job.parent,
                               env=rehearsal_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, seen = [], threading.Event()

    def read():
        for line in process.stdout:
            lines.append(line)
            if line.startswith(until):
                seen.set()
        seen.set()
    threading.Thread(target=read, daemon=True).start()
    return process, lines, seen
