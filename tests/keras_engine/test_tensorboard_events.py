"""TensorBoard events of the keras and jax engines, under the names the estimator engine writes: at each log point
`loss` (the loss `train` prints), `global_step/sec`, `examples/sec` and `train/learning_rate` (the rate the optimizer
applied at that step: here the job's own optimizer's decaying schedule, as Keras evaluates it) in model_dir, and each
evaluation's metrics in model_dir/eval, equal to what the run record holds. Read back with TensorFlow's own events
reader."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import textwrap
from pathlib import Path

import pytest
import tensorflow as tf
import yaml

from jax_runs import TPULAUNCH, run_env
from jax_runs import project  # noqa: F401  (the fixture: the jax engine's small job)


def _scalars(folder: Path) -> dict:
    """{tag: {step: value}} of every events file in `folder` (not below it)."""
    found: dict = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor)) if value.HasField("tensor") else value.simple_value
                found.setdefault(value.tag, {})[event.step] = number
    return found


SCHEDULES = textwrap.dedent('''
    def _sgd(keras, learning_rate):
        return keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(learning_rate, 1, 0.5))


    def keras3_sgd(learning_rate):
        import keras

        return _sgd(keras, learning_rate)


    def tf_keras_sgd(learning_rate):
        import tf_keras

        return _sgd(tf_keras, learning_rate)


    def compiled_classifier(num_classes=3):
        """A Keras 3 classifier its builder compiles with its own decaying SGD (the job sets no optimizer)."""
        import keras

        inputs = keras.Input(shape=(8, 8, 1), name="image")
        model = keras.Model(inputs, keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs)))
        model.compile(optimizer=keras3_sgd(0.05), loss="sparse_categorical_crossentropy")
        return model
''')


@pytest.mark.parametrize("engine", ["keras", "jax"])
def test_train_writes_its_loss_rates_and_evaluation_as_tensorboard_events(project, tmp_path, engine):  # noqa: F811
    """The keras engine trains a tf_keras model with the job's own optimizer (an import path); the jax engine, which
    makes its optimizers by name only, a model its builder compiled with its own."""
    (project / "schedules.py").write_text(SCHEDULES)
    job = yaml.safe_load((project / "job.yaml").read_text())
    keras2 = engine == "keras"  # the keras engine's model here is tf_keras's: its optimizer too
    if keras2:
        job["model"].update(builder="k3models:tf_keras_classifier", optimizer={"name": "schedules:tf_keras_sgd",
                                                                              "learning_rate": 0.05})
    else:
        del job["model"]["optimizer"], job["flags"]  # the flag is k3models's
        job["model"]["builder"] = "schedules:compiled_classifier"
    job["run"].update(engine=engine, log_every_steps=2)
    (project / f"scheduled-{engine}.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    model_dir = tmp_path / engine
    done = subprocess.run([*TPULAUNCH, "train", str(project / f"scheduled-{engine}.yaml"), "--local", "--model-dir",
                           str(model_dir)], capture_output=True, text=True, env=run_env(), timeout=300, cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = {int(m.group(1)): float(m.group(2)) for m in
               re.finditer(r"^train \| step (\d+)/\d+ .*\| loss ([0-9.e+-]+)", done.stdout, re.MULTILINE)}
    train = _scalars(model_dir)
    assert sorted(train["loss"]) == sorted(printed) == [2, 4, 6], (train, printed)
    for step, loss in printed.items():  # printed with four significant digits
        assert train["loss"][step] == pytest.approx(loss, rel=1e-3)
    assert set(train["global_step/sec"]) == set(printed) and all(v > 0 for v in train["examples/sec"].values())
    # Step s applied the schedule's value at iteration s - 1 (0.05 halved at each step), as Keras evaluates it.
    keras = importlib.import_module("tf_keras" if keras2 else "keras")
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, 1, 0.5)
    assert train["train/learning_rate"] == pytest.approx({s: float(schedule(s - 1)) for s in printed}, rel=1e-6)
    (record,) = [json.loads(line) for line in (model_dir / "tpulaunch-runs.jsonl").read_text().splitlines()]
    evaluations = _scalars(model_dir / "eval")
    final = record["evals"][-1]
    assert {tag: values[final["step"]] for tag, values in evaluations.items()} == pytest.approx(final["metrics"],
                                                                                                 rel=1e-6)
