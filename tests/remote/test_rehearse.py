"""`tpulaunch rehearse` end to end, with real processes: the controller (the CLI in a process of its own), the
local Cloud TPU API, TPU VMs as local processes running the node's startup script, and on them `tpulaunch
train` of the quickstart CNN on this machine's CPU (20 steps, a checkpoint every 5, batch 8, 64 records).

The job's builder (staged next to the job file, so staging the job's own code is proven too) pauses 0.2 s a
step, so that the controller reads a step from the run's log while the run still trains it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from paths import REPO

SLOW_MODELS = textwrap.dedent("""\
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


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("quickstart")
    subprocess.run([sys.executable, "-m", "tpulaunch", "data", "synth", "--example", "quickstart", str(root / "data"),
                    "--records", "64"], check=True, cwd=REPO, capture_output=True)
    return root


@pytest.fixture
def job(data, tmp_path) -> Path:
    folder = data / tmp_path.name
    folder.mkdir()
    (folder / "slow_models.py").write_text(SLOW_MODELS)
    (folder / "job.yaml").write_text(JOB)
    return folder / "job.yaml"


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPULAUNCH_TPU", "TPU_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**env, "NO_GCE_CHECK": "True", **extra}


def rehearse(job: Path, *args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpulaunch", "rehearse", str(job), *args], cwd=job.parent,
                          env=_env(**env), capture_output=True, text=True, timeout=300)


def _record(job: Path) -> dict:
    return json.loads((job.parent / "runs/q/tpulaunch-remote/run.json").read_text())


def test_preempted_vm_is_recreated_and_the_run_finishes_with_no_step_lost_beyond_its_checkpoint(job):
    done = rehearse(job, "--preempt-at", "12", "--recreate", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    record = _record(job)
    assert (record["outcome"], record["final_step"], len(record["vms"])) == ("done", 20, 2)
    (recovery,) = record["recoveries"]
    assert recovery["cause"] == "PREEMPTED" and recovery["step"] >= 12
    # The new VM resumed from the newest checkpoint the lost one saved: nothing beyond it was lost.
    assert recovery["resumed_from"] == recovery["checkpoint_step"] == 5 * (recovery["step"] // 5)
    assert recovery["steps_lost"] == recovery["step"] - recovery["checkpoint_step"]
    assert recovery["lease_released"] is True  # the new VM took model_dir's lease at once
    lease = json.loads((job.parent / "runs/q/tpulaunch.lease").read_text())
    assert lease["took_over"] is None
    assert "rehearsal | preempted TPU node 'rehearsal-tpu' at step" in done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("run | done | step 20/20 | 2 VMs | 1 recovery (PREEMPTED at step"), last
    assert f"resumed from step {recovery['resumed_from']}" in last
    assert (job.parent / "runs/q/model.ckpt-20.index").exists()
    assert "train | start | step 0/20" in (job.parent / "runs/q/tpulaunch-remote/attempts/1/worker-0.log").read_text()


def test_the_jobs_own_failure_on_the_vm_is_not_retried(job):
    failed = rehearse(job, "--recreate", "2", "--set", "model.builder=slow_models:broken")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "this builder is broken on purpose" in failed.stderr
    assert "not retried" in failed.stderr
    record = _record(job)
    assert (record["outcome"], len(record["vms"]), record["recoveries"]) == ("failed: exit code 1: the job failed", 1, [])


def test_a_killed_controller_rerun_reattaches_without_creating_a_second_vm(job, tpu_api, tmp_path):
    tpu_api.run_vms(str(tmp_path / "vms"))
    env = {"TPULAUNCH_TPU_API_ENDPOINT": tpu_api.endpoint}
    first = subprocess.Popen([sys.executable, "-m", "tpulaunch", "rehearse", str(job)], cwd=job.parent,
                             env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    reached = threading.Event()

    def read():
        for line in first.stdout:
            seen.append(line)
            if line.startswith("train | step 3/20"):
                reached.set()
    threading.Thread(target=read, daemon=True).start()
    try:
        assert reached.wait(180), "".join(seen)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    again = rehearse(job, **env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "reattached to TPU node 'rehearsal-tpu' (READY), VM 1 of the run" in again.stderr
    assert len(tpu_api.created) == 1  # one VM, created by the first controller
    assert again.stdout.strip().splitlines()[-1].startswith("run | done | step 20/20 | 1 VM |")
    assert _record(job)["outcome"] == "done"
