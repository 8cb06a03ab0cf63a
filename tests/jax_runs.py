"""The jax engine's runs as its suites start them (tests/jax_engine/, and the keras suite's TensorBoard and oracle
tests): `tpulaunch` in a process of its own (`TPULAUNCH`) with XLA's host platform split into `devices` (`run_env`;
Keras chooses its backend once per process), the small Keras 3 job they train (`project`, `KERAS3_MODELS`), and the
variables a checkpoint holds (`checkpoint_variables`), a rehearsed run's against one process's
(`assert_weights_of_one_process`); `HELD`, a classifier that holds a rehearsed slice at a
step."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
import tensorflow as tf
import yaml

import user_models as corpus
from paths import REPO


TPULAUNCH = [sys.executable, "-m", "tpulaunch"]

KERAS3_MODELS = textwrap.dedent('''
    import keras
    from absl import flags

    if "conv_filters" not in flags.FLAGS:
        flags.DEFINE_integer("conv_filters", 4, "the convolution's filters")


    def classifier(num_classes=3, filters=None):
        inputs = keras.Input(shape=(8, 8, 1), name="image")
        filters = filters or flags.FLAGS.conv_filters  # the job's flags: set it, as a FLAGS program's command line would
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(inputs)
        x = keras.layers.GlobalAveragePooling2D()(x)
        return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


    def tf_keras_classifier(num_classes=3):
        import tf_keras

        inputs = tf_keras.Input(shape=(8, 8, 1), name="image")
        x = tf_keras.layers.Flatten()(inputs)
        return tf_keras.Model(inputs, tf_keras.layers.Dense(num_classes)(x))
''')


def run_env(devices: int = 1) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "KERAS_BACKEND")}
    path = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return dict(env, PYTHONUNBUFFERED="1", CI="1", PYTHONPATH=path,
                XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A small Keras 3 classifier on 8x8 images. The training file holds one batch, 8 records, read without
    shuffling: every step trains on the same examples in the same order, whatever order the pipeline's parallel
    parse hands its batches out in (it is not deterministic while training)."""
    root = tmp_path_factory.mktemp("jax_job")
    specs = {**corpus.IMAGE, **corpus.CLASS}
    corpus.write_records(root / "train.tfrecord", specs, 8, seed=1)
    corpus.write_records(root / "eval.tfrecord", specs, 32, seed=2)
    (root / "k3models.py").write_text(KERAS3_MODELS)
    job = {
        "name": "jax-engine",
        "model": {"builder": "k3models:classifier", "params": {"num_classes": 3},
                  "loss": "sparse_categorical_crossentropy", "optimizer": {"name": "sgd", "learning_rate": 0.05},
                  "metrics": ["accuracy"]},
        "data": {"train": "train.tfrecord", "eval": "eval.tfrecord", "features": corpus.IMAGE, "labels": corpus.CLASS,
                 "shuffle_buffer": 0},
        "train": {"batch_size": 8, "steps": 6},
        "eval": {"batch_size": 8, "steps": 2},
        "run": {"model_dir": "runs/j", "save_checkpoints_steps": 3, "log_every_steps": 1, "seed": 3, "engine": "jax"},
        "flags": {"conv_filters": 5},
    }
    (root / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return root


def checkpoint_variables(model_dir: Path, checkpoint: str = "") -> dict:
    reader = tf.train.load_checkpoint(checkpoint or tf.train.latest_checkpoint(str(model_dir)))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name.endswith("/.ATTRIBUTES/VARIABLE_VALUE")}


def assert_weights_of_one_process(project: Path, job_file: str, run_dir: Path, one_dir: Path, env: dict) -> None:
    """The rehearsed run's checkpoint (several hosts, slices, a preemption) holds the weights one `train --local` of
    the same job ends with, after the job's steps (within 1e-5)."""
    import subprocess

    import numpy as np

    alone = subprocess.run([*TPULAUNCH, "train", job_file, "--local", "--model-dir", str(one_dir)],
                           cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    several, one = checkpoint_variables(run_dir), checkpoint_variables(one_dir)
    steps = yaml.safe_load((project / job_file).read_text())["train"]["steps"]
    assert sorted(several) == sorted(one) and one["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == steps
    for name in one:
        np.testing.assert_allclose(several[name], one[name], rtol=1e-5, atol=1e-5, err_msg=name)


# The job's classifier (KERAS3_MODELS's) whose steps past the 4th wait for a folder to appear ($HOLD_UNTIL: the
# second VM's attempt folder), so that the first VM is still at step 4 when the rehearsal preempts it there; the
# second VM's steps find the folder and do not wait, nor do a run's without $HOLD_UNTIL.
HELD = textwrap.dedent("""\
    import os
    import time

    import jax
    import keras

    STEPS = [0]


    def _step():
        STEPS[0] += 1
        until = os.environ.get("HOLD_UNTIL")
        while until and STEPS[0] > 4 and not os.path.exists(until):
            time.sleep(0.05)


    class Hold(keras.layers.Layer):
        def call(self, x):
            jax.debug.callback(_step)
            return x


    def held(num_classes=3):
        inputs = keras.Input(shape=(8, 8, 1), name="image")
        x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(Hold()(inputs))
        x = keras.layers.GlobalAveragePooling2D()(x)
        return keras.Model(inputs, keras.layers.Dense(num_classes)(x))
    """)
