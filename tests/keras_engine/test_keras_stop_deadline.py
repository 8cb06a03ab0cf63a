"""The keras and jax engines: a stop honoured within a stated time whatever the step waits on, a data file that is
not a regular file refused at its key, and the machine's memory limit named (the estimator engine's twins are in
tests/estimator/run/test_stop_deadline.py). Real `tpulaunch` processes, real FIFOs, real signals, a real address-space limit.

The step waits on "a store": a layer of the job's model reads a byte from a FIFO once the test has made it, and
nothing is ever written there. The graceful stop at the next step boundary cannot come; after the grace
($TPULAUNCH_STOP_GRACE_S, 2 s here) the run is stopped where it is: exit 130, its record says why, its lease is
released, and the last checkpoint stays the one to resume from."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

import user_models as corpus
from lease_runs import Run, cli_env
from stop_runs import GRACE_S, STUCK, address_space_limit, assert_ended_whole, records, wait_blocked_opening_a_fifo

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

ENGINES = ["keras", "jax"]

# Each engine's model: a small classifier whose Store layer, while the file store.fifo exists, reads a byte from it in
# every step (inside the step: tf.numpy_function on the keras engine, jax.pure_callback on JAX); `huge` needs 40 GB.
MODELS = {
    "keras": textwrap.dedent('''
        import os

        import tensorflow as tf

        STORE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "store.fifo")


        def wait(value):
            if os.path.exists(STORE):
                with open(STORE, "rb") as store:
                    store.read(1)
            return value


        class Store(tf.keras.layers.Layer):
            def call(self, x):
                return tf.ensure_shape(tf.numpy_function(wait, [x], x.dtype), x.shape)


        def classifier(num_classes=3):
            image = tf.keras.Input(shape=(8, 8, 1), name="image")
            x = tf.keras.layers.Flatten()(Store()(image))
            return tf.keras.Model(image, tf.keras.layers.Dense(num_classes)(x))


        def huge(num_classes=3):
            image = tf.keras.Input(shape=(8, 8, 1), name="image")
            x = tf.keras.layers.Dense(100000)(tf.keras.layers.Dense(100000)(tf.keras.layers.Flatten()(image)))
            return tf.keras.Model(image, tf.keras.layers.Dense(num_classes)(x))
    '''),
    "jax": textwrap.dedent('''
        import os

        import jax
        import keras

        STORE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "store.fifo")


        def wait(value):
            if os.path.exists(STORE):
                with open(STORE, "rb") as store:
                    store.read(1)
            return value


        class Store(keras.layers.Layer):
            def call(self, x):
                return jax.pure_callback(wait, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


        def classifier(num_classes=3):
            image = keras.Input(shape=(8, 8, 1), name="image")
            x = keras.layers.Flatten()(Store()(image))
            return keras.Model(image, keras.layers.Dense(num_classes)(x))


        def huge(num_classes=3):
            image = keras.Input(shape=(8, 8, 1), name="image")
            x = keras.layers.Dense(100000)(keras.layers.Dense(100000)(keras.layers.Flatten()(image)))
            return keras.Model(image, keras.layers.Dense(num_classes)(x))
    '''),
}


def _project(root: Path, engine: str) -> Path:
    specs = {**corpus.IMAGE, **corpus.CLASS}
    (root / "data").mkdir(parents=True)
    corpus.write_records(root / "data" / "train.tfrecord", specs, 64, seed=1)
    (root / "models.py").write_text(MODELS[engine])
    job = {
        "name": f"stop-{engine}",
        "model": {"builder": "models:classifier", "params": {"num_classes": 3},
                  "loss": "sparse_categorical_crossentropy", "optimizer": {"name": "sgd", "learning_rate": 0.05}},
        "data": {"train": "data/train*.tfrecord", "features": corpus.IMAGE, "labels": corpus.CLASS,
                 "shuffle_buffer": 0},
        "train": {"batch_size": 8, "steps": 100000},
        "run": {"model_dir": "runs/s", "save_checkpoints_steps": 100000, "log_every_steps": 1, "seed": 3,
                "engine": engine},
    }
    (root / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return root / "job.yaml"


def _env(**extra) -> dict:
    env = {k: v for k, v in cli_env(**extra).items() if k != "KERAS_BACKEND"}  # each engine sets its own
    return dict(env, XLA_FLAGS="--xla_force_host_platform_device_count=1")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_fifo_among_the_data_files_is_refused_by_validate_and_train_at_its_key(tmp_path, engine):
    """validate read it as an empty file (a warning); train opened it and waited forever for a writer."""
    job = _project(tmp_path / "job", engine)
    os.mkfifo(tmp_path / "job" / "data" / "train-stream.tfrecord")
    said = f"{tmp_path}/job/data/train-stream.tfrecord is a FIFO (named pipe), not a TFRecord file"

    validate = subprocess.run([sys.executable, "-m", "tpulaunch", "validate", str(job)], capture_output=True,
                              text=True, env=_env(), timeout=300)
    assert validate.returncode == 1, validate.stdout + validate.stderr
    assert f"data.train: {said}" in validate.stdout and "[data-not-a-file]" in validate.stdout, validate.stdout

    run_dir = tmp_path / "run"
    train = Run(["train", str(job), "--model-dir", str(run_dir)], env=_env())
    try:
        assert train.finish(limit_s=300) == 1, train.text()
    finally:
        train.end()
    # refused by train's own run of validate's data stage, at its key; the run's record says so, its lease released
    err = " ".join(" ".join(train.err).split())
    assert f"data.train: {said}" in err and "[data-not-a-file]" in err, train.text()
    assert_ended_whole(train, run_dir, f"failed: not running train on {job}: fix the problems above "
                                       f"(tpulaunch validate {job})")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_step_waiting_on_a_store_is_stopped_after_the_grace(tmp_path, engine):
    """The store (a FIFO nobody writes) appears once step 1 is told; SIGINT once a step of the run waits opening
    it. The run ends within the grace, exit 130, saying why; nothing is saved from inside the step."""
    job = _project(tmp_path / "job", engine)
    run_dir = tmp_path / "run"
    run = Run(["train", str(job), "--model-dir", str(run_dir), "--set", "run.save_checkpoints_steps=1"],
              env=_env(TPULAUNCH_STOP_GRACE_S=GRACE_S))
    try:
        run.wait_for_line(lambda line: line.startswith("train | step 1/"))
        os.mkfifo(tmp_path / "job" / "store.fifo")
        wait_blocked_opening_a_fifo(run)
        run.process.send_signal(signal.SIGINT)
        code = run.finish(limit_s=120)  # without the stop's deadline it never ends
    finally:
        run.end()
    assert code == 130, run.text()
    assert f"stopped by SIGINT: {STUCK}; nothing was saved at the stop" in run.err, run.text()
    assert_ended_whole(run, run_dir, f"stopped (SIGINT): {STUCK}")
    saved = [line for line in run.out if line.startswith("checkpoint | step ")]
    assert saved and run.err[-1].endswith(saved[-1].split(" | ")[-1]), run.text()  # the last one, to resume from
    assert "Traceback" not in run.text(), run.text()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("limit_kib, builder", [(400000, "classifier"), (8000000, "huge")],
                         ids=["libraries-not-mapped", "weights-not-allocated"])
def test_out_of_memory_under_ulimit_v_names_the_limit_and_is_recorded(tmp_path, engine, limit_kib, builder):
    """Under `ulimit -v 400000` the framework's libraries cannot even be mapped (it was exit 70, "an internal error,
    report it", and no record line); under 8 GB a model of 40 GB of weights cannot be allocated (it was blamed on
    model.builder). Exit 1 naming the limit and its fix, the record says the same."""
    job = _project(tmp_path / "job", engine)
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "tpulaunch", "train", str(job), "--model-dir", str(run_dir),
                           "--set", f"model.builder=models:{builder}"], capture_output=True, text=True, env=_env(),
                          timeout=300, preexec_fn=address_space_limit(limit_kib))
    assert done.returncode == 1, done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    size = f"{limit_kib * 1024 / 2 ** 30:.1f} GiB" if limit_kib * 1024 >= 2 ** 30 else f"{limit_kib / 1024:.0f} MiB"
    said = f"out of memory under this process's address-space limit of {size} (ulimit -v {limit_kib}): "
    assert error.startswith(f"error: {said}"), done.stderr
    assert f"  hint: raise the limit before running (ulimit -v unlimited, or well above {size})" in done.stderr
    assert records(run_dir)[-1]["outcome"] == "failed: " + error[len("error: "):]
