"""The keras engine's NaN loss: a real `train` of a linear model whose data holds one record of NaN pixels (record
40: no shuffle, batch 8, so the loss is NaN at step 6 (batch 6 of 8 an epoch), and after a rollback to step 4 at step
12, as the input goes on after the batch that made it NaN and meets that batch again in the next epoch;
linear, as a ReLU may turn a NaN into 0 on some CPU paths and not on others) stops with
exit 1 naming the step and the last good checkpoint (the NaN step is never saved), or with `train.on_nan:
{rollback: 1}` restores it once, in the run record, and stops at the next one (tests/estimator/run/test_nan.py is the
estimator engine's)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

import user_models as corpus
from lease_runs import Run, cli_env
from records import write_examples
from tpulaunch.run.record import RECORD_FILE


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("keras_nan")
    rng = np.random.default_rng(1)
    examples = [{"image": np.full(64, np.nan, np.float32) if index == 40 else rng.normal(size=64).astype(np.float32),
                 "label": int(rng.integers(0, 3))} for index in range(64)]
    write_examples(root / "train.tfrecord", examples)
    (root / "nan_models.py").write_text(
        "import tensorflow as tf\n\n\n"
        "def linear(num_classes=3, input_shape=(8, 8, 1), **unused):\n"
        "    image = tf.keras.Input(shape=tuple(input_shape), name='image')\n"
        "    return tf.keras.Model(image, tf.keras.layers.Dense(num_classes)(tf.keras.layers.Flatten()(image)))\n")
    job = {
        "name": "keras-nan",
        "model": {"builder": "nan_models:linear", "params": {"num_classes": 3},
                  "loss": "sparse_categorical_crossentropy", "optimizer": {"name": "sgd", "learning_rate": 0.05}},
        "data": {"train": "train.tfrecord", "features": corpus.IMAGE, "labels": corpus.CLASS, "shuffle_buffer": 0},
        "train": {"batch_size": 8, "steps": 40},
        "run": {"model_dir": "runs/k", "save_checkpoints_steps": 2, "log_every_steps": 1, "seed": 3, "engine": "keras"},
    }
    (root / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return root


def test_a_non_finite_loss_stops_or_rolls_back_once(project, tmp_path):
    run_dir = tmp_path / "run"
    run = Run(["train", str(project / "job.yaml"), "--model-dir", str(run_dir)], env=cli_env())
    assert run.finish() == 1, run.text()
    err = "\n".join(run.err)
    said = re.search(r"error: the loss became (\S+) at step 6; the last good checkpoint is (\S+) \(step 4\)", err)
    assert said and said.group(1) in ("NaN", "inf") and said.group(2) == str(run_dir / "model.ckpt-4"), err
    assert not (run_dir / "model.ckpt-6.index").exists()  # the NaN step's weights were never saved
    assert "unexpected" not in err and "Traceback" not in err

    rolled = tmp_path / "rolled"
    run = Run(["train", str(project / "job.yaml"), "--model-dir", str(rolled), "--set", "train.on_nan={rollback: 1}"],
              env=cli_env())
    assert run.finish() == 1, run.text()
    assert [line.split(";")[0] for line in run.out if line.startswith("nan | ")] == [
        f"nan | the loss became {said.group(1)} at step 6"], run.text()
    assert re.search(r"error: the loss became \S+ at step 12 after 1 rollback \(train.on_nan\); the last good "
                     rf"checkpoint is {re.escape(str(rolled / 'model.ckpt-10'))} \(step 10\)", "\n".join(run.err)), \
        run.text()
    record = json.loads((rolled / RECORD_FILE).read_text().splitlines()[-1])
    assert [(r["step"], r["to_step"]) for r in record["nan_rollbacks"]] == [(6, 4)]
