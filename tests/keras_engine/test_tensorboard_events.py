"""TensorBoard events of the keras and jax engines, under the names the estimator engine's TPUEstimator writes: at each
log point `loss` (the loss `train` prints), `global_step/sec` and `examples/sec` in model_dir, and each evaluation's
metrics in model_dir/eval, equal to what the run record holds. Read back with TensorFlow's own events reader."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import tensorflow as tf

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


@pytest.mark.parametrize("engine", ["keras", "jax"])
def test_train_writes_its_loss_rates_and_evaluation_as_tensorboard_events(project, tmp_path, engine):  # noqa: F811
    model_dir = tmp_path / engine
    done = subprocess.run([*TPULAUNCH, "train", str(project / "job.yaml"), "--local", "--model-dir", str(model_dir),
                           "--set", f"run.engine={engine}", "--set", "run.log_every_steps=2",
                           *(["--set", "model.builder=k3models:tf_keras_classifier"] if engine == "keras" else [])],
                          capture_output=True, text=True, env=run_env(), timeout=300, cwd=project)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = {int(m.group(1)): float(m.group(2)) for m in
               re.finditer(r"^train \| step (\d+)/\d+ .*\| loss ([0-9.e+-]+)", done.stdout, re.MULTILINE)}
    train = _scalars(model_dir)
    assert sorted(train["loss"]) == sorted(printed) == [2, 4, 6], (train, printed)
    for step, loss in printed.items():  # printed with four significant digits
        assert train["loss"][step] == pytest.approx(loss, rel=1e-3)
    assert set(train["global_step/sec"]) == set(printed) and all(v > 0 for v in train["examples/sec"].values())
    (record,) = [json.loads(line) for line in (model_dir / "tpulaunch-runs.jsonl").read_text().splitlines()]
    evaluations = _scalars(model_dir / "eval")
    final = record["evals"][-1]
    assert {tag: values[final["step"]] for tag, values in evaluations.items()} == pytest.approx(final["metrics"],
                                                                                                 rel=1e-6)
