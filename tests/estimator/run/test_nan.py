"""A NaN loss is the job's error, not tpulaunch's: a real `train` of a linear model whose data holds one record of
NaN pixels (record 40 of 64: with no shuffle and batch 8 the loss becomes NaN at step 6, batch 6 of 8 an epoch;
after a rollback the input goes on after the batches that made it NaN, as on the keras engine
(tests/keras_engine/test_keras_nan.py), and meets that batch again in the next epoch; a linear model, as a ReLU may
turn a NaN into 0 on some CPU paths and not on others) ends with exit 1 naming the step and the last good checkpoint, and points
model_dir at it; `train.on_nan: {rollback: N}` restores it and goes on, N times, each in the run record."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lease_runs import Run, cli_env
from records import write_examples
from train_jobs import JOB, MODELS
from tpulaunch.engine.core.checkpoints import NON_FINITE_FOLDER
from tpulaunch.run.record import RECORD_FILE

LINEAR = """

def linear(num_classes=2, input_shape=(8, 8, 1), **unused):
    image = tf.keras.Input(shape=tuple(input_shape), name="image")
    return tf.keras.Model(image, tf.keras.layers.Dense(num_classes)(tf.keras.layers.Flatten()(image)))
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nan")
    (root / "train_models.py").write_text(MODELS + LINEAR)
    (root / "job.yaml").write_text(JOB)
    rng = np.random.default_rng(1)
    examples = []
    for index in range(64):
        label = int(rng.integers(2))
        image = rng.normal(size=64).astype(np.float32) * 0.5 + (2 * label - 1)
        if index == 40:
            image[:] = np.nan
        examples.append({"image": image, "label": label})
    (root / "data").mkdir()
    write_examples(root / "data" / "train.tfrecord", examples)
    return root


def _train(project: Path, model_dir: Path, *args: str) -> Run:
    return Run(["train", str(project / "job.yaml"), "--local", "--model-dir", str(model_dir), "--set", "eval=null",
                "--set", "model.builder=train_models:linear",
                # records in file order, so the NaN record is in step 6's batch (without a seed the parallel reads
                # hand out whichever record is ready first)
                "--set", "data.shuffle_buffer=0", "--set", "run.seed=0", "--set", "train.steps=40",
                "--set", "run.save_checkpoints_steps=2",
                *args], env=cli_env())


def test_a_nan_loss_stops_with_exit_1_naming_the_step_and_the_last_good_checkpoint(project, tmp_path):
    run_dir = tmp_path / "run"
    run = _train(project, run_dir)
    assert run.finish() == 1, run.text()
    err = "\n".join(run.err)
    assert f"error: the loss became NaN at step 6; the last good checkpoint is {run_dir / 'model.ckpt-4'} (step 4)" \
           in err, err
    assert "train.on_nan: {rollback: N}" in err and "unexpected" not in err and "Traceback" not in err, err
    # model.ckpt-6 holds the NaN step's weights: moved aside, model_dir points at the good one.
    state = (run_dir / "checkpoint").read_text()
    assert 'model_checkpoint_path: "model.ckpt-4"' in state and "model.ckpt-6" not in state, state
    aside = run_dir / NON_FINITE_FOLDER
    assert f"a rerun resumes from it (model.ckpt-6 moved to {aside}, for inspection)" in err, err
    assert not list(run_dir.glob("model.ckpt-6.*")) and (aside / "model.ckpt-6.index").exists()
    record = json.loads((run_dir / RECORD_FILE).read_text().splitlines()[-1])
    assert record["outcome"].startswith("failed: the loss became NaN at step 6") and "nan_rollbacks" not in record

    # The rerun the hint promises resumes from the good checkpoint (not the newest, NaN one) and trains on.
    rerun = _train(project, run_dir, "--set", "train.steps=5")
    assert rerun.finish() == 0, rerun.text()
    assert f"resumed from step 4 ({run_dir})" in rerun.out and not [line for line in rerun.out if "repaired" in line]
    assert rerun.out[-1].startswith("done | step 5/5") and "| loss nan" not in rerun.out[-1], rerun.text()

    # Saving every 5 steps, the NaN at step 6 leaves nothing new to move aside: the stop names what the first left.
    again = _train(project, run_dir, "--set", "run.save_checkpoints_steps=5")
    assert again.finish() == 1, again.text()
    err = "\n".join(again.err)
    assert f"the loss became NaN at step 6; the last good checkpoint is {run_dir / 'model.ckpt-5'} (step 5)" in err
    assert f"a rerun resumes from it (the checkpoints moved aside earlier are in {aside})" in err, err


def test_on_nan_rollback_restores_the_last_good_checkpoint_at_most_n_times(project, tmp_path):
    run_dir = tmp_path / "run"
    run = _train(project, run_dir, "--set", "train.on_nan={rollback: 2}")
    assert run.finish() == 1, run.text()
    notes = [line for line in run.out if line.startswith("nan | ")]
    aside = run_dir / NON_FINITE_FOLDER
    assert notes == [
        f"nan | the loss became NaN at step 6; the last good checkpoint is {run_dir / 'model.ckpt-4'} (step 4): "
        f"training goes on from there (rollback 1 of 2, train.on_nan); model.ckpt-6 moved to {aside}, for inspection",
        f"nan | the loss became NaN at step 12; the last good checkpoint is {run_dir / 'model.ckpt-10'} (step 10): "
        f"training goes on from there (rollback 2 of 2, train.on_nan); model.ckpt-12 moved to {aside}, for "
        "inspection"], run.text()
    # Steps 5 on read batches 6, 7, 0, ... (the 2 rolled-back steps' batches read past): batch 5 again at step 12;
    # after the second rollback (2 steps more read past), at step 18.
    assert (f"error: the loss became NaN at step 18 after 2 rollbacks (train.on_nan); the last good checkpoint is "
            f"{run_dir / 'model.ckpt-16'} (step 16)") in "\n".join(run.err), run.text()
    record = json.loads((run_dir / RECORD_FILE).read_text().splitlines()[-1])
    assert [(r["step"], r["to_step"]) for r in record["nan_rollbacks"]] == [(6, 4), (12, 10)]
