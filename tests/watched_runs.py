"""The job the TPU watchdog's end-to-end tests train with `--local --watch-node` against the local Cloud TPU API
(tests/estimator/run/test_watchdog.py, and pinned to `run.engine: keras`, tests/keras_engine/test_keras_watchdog.py):
a slow classifier and its records (`project`), the API with its READY node 'my-tpu' (`api`), and a preemption
played on that node once a checkpoint is written (`preempt_when_checkpoint_appears`)."""

from __future__ import annotations

import os
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tpu_api_server import DEFAULT_PROJECT, DEFAULT_ZONE


MODELS = textwrap.dedent('''
    import os
    import time

    import tensorflow as tf

    def _pause(x):
        def sleep(value):
            time.sleep(0.01)
            # $WATCHED_HOLD (preempt_when_checkpoint_appears): "CHECKPOINT_INDEX<pathsep>RELEASED": once that
            # checkpoint is written, each step waits until the test has seen the watchdog ask for the preempted
            # node, so the run can never finish before it has noticed, on a fast machine or a loaded one.
            hold = os.environ.get("WATCHED_HOLD", "")
            if hold:
                written, _, released = hold.partition(os.pathsep)
                deadline = time.monotonic() + 300
                while os.path.exists(written) and not os.path.exists(released) and time.monotonic() < deadline:
                    time.sleep(0.005)
            return value
        return tf.ensure_shape(tf.numpy_function(sleep, [x], x.dtype), x.shape)

    def slow_classifier(num_classes=2, input_shape=(4,), **unused):
        inputs = tf.keras.Input(shape=tuple(input_shape), name="x")
        paused = tf.keras.layers.Lambda(_pause)(inputs)
        return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(paused))
''')

JOB = textwrap.dedent(f'''
    name: watched
    model:
      builder: slow_models:slow_classifier
      optimizer: {{name: sgd, learning_rate: 0.1}}
    data:
      train: data/train.tfrecord
      features: {{x: {{shape: [4]}}}}
      labels: {{label: {{shape: [], dtype: int64}}}}
      shuffle_buffer: 16
    train: {{batch_size: 8, steps: 120}}
    tpu: {{name: my-tpu, zone: {DEFAULT_ZONE}, project: {DEFAULT_PROJECT}, type: v3-8}}
    run: {{model_dir: runs/default, save_checkpoints_steps: 20, keep_checkpoint_max: 10, log_every_steps: 1000,
          seed: 1}}
''')

FAST_WATCH = ["--local", "--watch-node", "--watch-interval", "0.1"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("watched")
    (root / "slow_models.py").write_text(MODELS)
    (root / "job.yaml").write_text(JOB)
    rng = np.random.default_rng(0)
    (root / "data").mkdir()
    with tf.io.TFRecordWriter(str(root / "data" / "train.tfrecord")) as writer:
        for _ in range(64):
            label = int(rng.integers(2))
            x = (rng.normal(size=4) + 2 * label - 1).astype(np.float32)
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=x.tolist())),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            })).SerializeToString())
    return root


@pytest.fixture
def api(tpu_api, monkeypatch):
    """The local TPU API with a READY node 'my-tpu', named by $TPULAUNCH_TPU_API_ENDPOINT as a user would."""
    tpu_api.set_node("my-tpu")
    monkeypatch.setenv("WATCHED_HOLD", "")  # preempt_when_checkpoint_appears sets it; put back after the test
    monkeypatch.setenv("TPULAUNCH_TPU_API_ENDPOINT", tpu_api.endpoint)
    monkeypatch.setenv("TPULAUNCH_TPU_DISCOVERY_URL", tpu_api.discovery_url)  # v1: TensorFlow's resolver only
    return tpu_api


def preempt_when_checkpoint_appears(api, model_dir: Path, step: int, back_after_s: float = None) -> threading.Thread:
    """Flip the node to PREEMPTED once model.ckpt-STEP is written; READY/HEALTHY again `back_after_s` later.

    The run's steps (the slow classifier's, in this process: `$WATCHED_HOLD`) wait from that checkpoint on until
    the API has been asked for the node after the flip (a read it answers PREEMPTED), so the watchdog is being told
    while the run is held: no race between the run's remaining steps and the watch interval."""
    written = model_dir / f"model.ckpt-{step}.index"
    released = model_dir.parent / f"{model_dir.name}.watchdog-told"
    os.environ["WATCHED_HOLD"] = f"{written}{os.pathsep}{released}"  # the test's `api` fixture puts it back

    def flip():
        deadline = time.monotonic() + 300
        while not written.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        script = [(0, "PREEMPTED", None)]
        if back_after_s is not None:
            script.append((back_after_s, "READY", "HEALTHY"))
        api.play("my-tpu", script)
        reads = api.node_requests("my-tpu")  # every read counted from here on is answered PREEMPTED
        while api.node_requests("my-tpu") <= reads and time.monotonic() < deadline:
            time.sleep(0.01)
        released.touch()

    thread = threading.Thread(target=flip, daemon=True)
    thread.start()
    return thread


def lines(text: str, prefix: str) -> list:
    return [line for line in text.splitlines() if line.startswith(prefix)]
