"""The estimator engine's numbers against TensorFlow itself (a differential oracle; the keras and jax engines' are
tests/keras_engine/test_oracle_*.py): the quickstart model (`tpulaunch.models.cnn`, small) on the same records in
the same order (`shuffle_buffer: 0`) from the same seed.

- `tpulaunch train --local` ends with the weights of a hand-written eager loop: the builder's model built after
  `tf.keras.utils.set_random_seed(run.seed)` (what a fresh run starts from), then one `tf.compat.v1.train.AdamOptimizer` step per
  batch of the records in file order, epoch after epoch, on the mean sparse crossentropy of the logits.
- Every metric train's eval line, `tpulaunch evaluate` and the run record hold equals the mean over the whole eval
  set computed by hand with the checkpoint's weights restored by TensorFlow.
- `export`'s SavedModel answers what the checkpoint's model answers.
- An eval set that ends in a partial batch: the metrics are over its whole batches, and the eval line says how
  many examples that is and how many records were left out.
- A run stopped and resumed ends as one that never stopped, on a shuffled input (`shuffle_buffer: 16` and
  `run.seed`: the order changes from batch to batch and epoch to epoch, so only a run that reads on from the
  batch it stopped at matches): one model_dir trained to step 3 by `train.steps`, evaluating every 2 steps (two
  `train` calls of TPUEstimator, each making its input anew: the second, a segment starting at step 2, reads the
  pipeline seeded at step 2, not the first batches again), then rerun without evaluations and stopped by a real
  SIGINT once it trains (the stop's checkpoint at a step k between checkpoints), then rerun to k + 5 (past an
  epoch's end). Its checkpoints at 2, 3, k and k + 5 hold the hand-written loop's weights over those batches in
  that order (the seeded pipeline's order is tests/estimator/engine/test_seeded_input.py's to check).

One `train` run (module scope) is shared by the first assertions, the three of the stopped model_dir by the last.
Tolerances: weights rtol 1e-5, atol 1e-6 (the same float32 steps on the same CPU; only the order of sums may
differ); metrics rtol 1e-5, atol 1e-6; the served logits rtol 1e-5, atol 1e-5.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml

from checkpoint_cases import checkpoint_steps, said, tpulaunch
from lease_runs import Run, cli_env
from records import write_examples
from tpulaunch.engine.pipeline import make_dataset_fn
from tpulaunch.job.load import load_job
from tpulaunch.models.cnn import build
from tpulaunch.run.events import EvalResult, LeftOut
from tpulaunch.cli.render.run_text import eval_text

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

WEIGHTS = dict(rtol=1e-5, atol=1e-6)
METRICS = dict(rtol=1e-5, atol=1e-6)
SERVED = dict(rtol=1e-5, atol=1e-5)

PARAMS = {"num_classes": 3, "input_shape": [8, 8, 3], "filters": 4}
STEPS, BATCH, SEED, LEARNING_RATE = 6, 8, 7, 0.01
TRAIN_RECORDS, EVAL_RECORDS = 32, 40  # 4 batches a training epoch (step 5 starts the second); 5 whole eval batches
SPEC = {"image": tf.io.FixedLenFeature([8, 8, 3], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64)}


def _write_records(path: Path, count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.integers(3, size=count)
    write_examples(path, [{"image": rng.normal(size=(8, 8, 3)).astype(np.float32) + label, "label": int(label)}
                          for label in labels])


def _records(path: Path):
    parsed = [tf.io.parse_single_example(r, SPEC) for r in tf.data.TFRecordDataset(str(path))]
    return np.stack([p["image"].numpy() for p in parsed]), np.stack([p["label"].numpy() for p in parsed])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The project, one `train` of it (an evaluation at the end), `evaluate` and `export` of its checkpoint."""
    root = tmp_path_factory.mktemp("oracle_estimator")
    _write_records(root / "train.tfrecord", TRAIN_RECORDS, seed=11)
    _write_records(root / "eval.tfrecord", EVAL_RECORDS, seed=12)
    _write_records(root / "eval37.tfrecord", EVAL_RECORDS - 3, seed=13)  # 4 whole batches and 5 records more
    job = {
        "name": "oracle-estimator",
        "model": {"builder": "tpulaunch.models.cnn:build", "params": PARAMS,
                  "loss": "sparse_categorical_crossentropy",
                  "optimizer": {"name": "adam", "learning_rate": LEARNING_RATE}, "metrics": ["accuracy"]},
        "data": {"train": "train.tfrecord", "eval": "eval.tfrecord",
                 "features": {"image": {"shape": [8, 8, 3]}}, "labels": {"label": {"shape": [], "dtype": "int64"}},
                 "shuffle_buffer": 0},
        "train": {"batch_size": BATCH, "steps": STEPS},
        "eval": {"batch_size": BATCH, "steps": EVAL_RECORDS // BATCH},
        "run": {"model_dir": "runs/m", "save_checkpoints_steps": 3, "log_every_steps": 1, "seed": SEED},
    }
    (root / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    model_dir = root / "runs" / "m"
    runs = {"train": tpulaunch("train", root / "job.yaml", model_dir)}
    runs["evaluate"] = tpulaunch("evaluate", root / "job.yaml", model_dir)
    runs["export"] = tpulaunch("export", root / "job.yaml", model_dir, str(root / "exported"))
    runs["partial"] = tpulaunch("evaluate", root / "job.yaml", model_dir, "--set", "data.eval=eval37.tfrecord")
    for verb, ran in runs.items():
        assert ran.returncode == 0, f"{verb}:\n{ran.stdout}\n{ran.stderr}"
    return root, model_dir, runs


def _file_order(root: Path, steps: int) -> list:
    """The first `steps` batches of the train records in file order, epoch after epoch (`shuffle_buffer: 0`)."""
    x, y = _records(root / "train.tfrecord")
    return [(x[start:start + BATCH], y[start:start + BATCH]) for start in (s * BATCH % TRAIN_RECORDS for s in range(steps))]


def _hand_trained(batches: list, at: tuple = ()) -> tuple:
    """The model after one hand-written Adam step per batch of `batches` from the builder's seeded values, and its
    weights by name after each step of `at`."""
    tf.keras.utils.set_random_seed(SEED)  # as a Keras user seeds a run: Python's, NumPy's, TensorFlow's, Keras's
    model = build(**PARAMS)
    optimizer = tf.compat.v1.train.AdamOptimizer(learning_rate=LEARNING_RATE)
    snapshots = {}
    for step, (images, labels) in enumerate(batches, start=1):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        if step in at:
            snapshots[step] = {v.name.split(":")[0]: v.numpy() for v in model.weights}
    return model, snapshots


def _restored(model_dir: Path):
    """The model holding the newest checkpoint's weights, read by TensorFlow's checkpoint reader by name."""
    reader = tf.train.load_checkpoint(str(model_dir))
    model = build(**PARAMS)
    model.set_weights([reader.get_tensor(v.name.split(":")[0]) for v in model.weights])
    return model


def _by_hand(model, images: np.ndarray, labels: np.ndarray) -> dict:
    """The eval metrics over every example: the mean crossentropy of the logits, the fraction predicted right."""
    logits = model(images, training=False)
    loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    return {"loss": float(tf.reduce_mean(loss)), "accuracy": float(np.mean(np.argmax(logits, -1) == labels))}


def _recorded(model_dir: Path, command: str) -> list:
    """The last evaluation of each of `command`'s lines in the run record, oldest first."""
    lines = [json.loads(line) for line in (model_dir / "tpulaunch-runs.jsonl").read_text().splitlines()]
    return [line["evals"][-1] for line in lines if line["command"] == command]


def test_train_ends_with_the_weights_of_a_hand_written_loop(trained):
    root, model_dir, _ = trained
    reader = tf.train.load_checkpoint(str(model_dir))
    assert reader.get_tensor("global_step") == STEPS
    hand, _ = _hand_trained(_file_order(root, STEPS))
    for variable in hand.weights:
        name = variable.name.split(":")[0]
        np.testing.assert_allclose(reader.get_tensor(name), variable.numpy(), err_msg=name, **WEIGHTS)


def test_every_eval_number_is_the_mean_over_the_whole_eval_set(trained):
    root, model_dir, runs = trained
    expected = _by_hand(_restored(model_dir), *_records(root / "eval.tfrecord"))
    line = eval_text(EvalResult(step=STEPS, metrics=expected))
    for verb in ("train", "evaluate"):
        assert line in runs[verb].stdout.splitlines(), runs[verb].stdout
        recorded = _recorded(model_dir, verb)[0]
        assert recorded["left_out"] is None
        for name, value in expected.items():
            np.testing.assert_allclose(recorded["metrics"][name], value, err_msg=f"{verb} {name}", **METRICS)


def test_an_eval_set_that_ends_in_a_partial_batch_says_what_it_left_out(trained):
    """37 records at batch 8, eval.steps 5: the set ends first; its 5 last records make no whole batch (every
    engine's batches are whole), so the metrics are the mean over the first 32, and the eval line says so."""
    root, model_dir, runs = trained
    images, labels = _records(root / "eval37.tfrecord")
    expected = _by_hand(_restored(model_dir), images[:32], labels[:32])
    (line,) = [line for line in runs["partial"].stdout.splitlines() if line.startswith("eval |")]
    assert line.endswith(" | over 32 examples: the last 5 records, not a whole batch, left out"), line
    assert line == eval_text(EvalResult(step=STEPS, metrics=expected, left_out=LeftOut(examples=32, records=5)))
    recorded = _recorded(model_dir, "evaluate")[-1]
    assert recorded["left_out"] == {"examples": 32, "records": 5}
    for name, value in expected.items():
        np.testing.assert_allclose(recorded["metrics"][name], value, err_msg=name, **METRICS)


def test_the_exported_savedmodel_answers_what_the_checkpoint_answers(trained):
    root, model_dir, runs = trained
    path = re.search(r"^exported (\S+)$", runs["export"].stdout, re.MULTILINE).group(1)
    images, _ = _records(root / "eval.tfrecord")
    served = tf.saved_model.load(path).signatures["serving_default"](tf.constant(images))["outputs"].numpy()
    np.testing.assert_allclose(served, _restored(model_dir)(images, training=False).numpy(), **SERVED)


# ------------------------------------------------------------------------------------ stopped and resumed

SHUFFLED = ("--set", "data.shuffle_buffer=16", "--set", "run.save_checkpoints_steps=100000",
            "--set", "run.keep_checkpoint_max=10")
STOPPED_AT = 3  # train.steps of the first run; its evaluations every 2 steps make two segments: 0 to 2, 2 to 3


@pytest.fixture(scope="module")
def resumed(trained, tmp_path_factory):
    """One model_dir, three runs of the module's job on a shuffled input (a seeded buffer, reshuffled each epoch),
    checkpoints only where a run stops: to step 3 (`train.steps`), evaluating every 2 steps; a rerun of 1000000
    steps stopped by a real SIGINT once it trains (its stop's checkpoint at a step between checkpoints, k); a rerun
    to k + 5 (more than an epoch of 4 batches). Returns (root, model_dir, k, the runs)."""
    root = trained[0]
    model_dir = tmp_path_factory.mktemp("resumed") / "m"
    runs = {"first": tpulaunch("train", root / "job.yaml", model_dir, *SHUFFLED, "--set", f"train.steps={STOPPED_AT}",
                               "--set", "eval.every_steps=2")}
    assert runs["first"].returncode == 0, said(runs["first"])
    assert checkpoint_steps(model_dir) == [0, 2, STOPPED_AT], said(runs["first"])

    stopped = Run(["train", str(root / "job.yaml"), "--local", "--set", f"run.model_dir={model_dir}", *SHUFFLED,
                   "--set", "train.steps=1000000", "--set", "eval=null"], env=cli_env(), cwd=root)
    try:
        stopped.wait_for_line(lambda line: line.startswith("train | step "))  # the event: it trains
        stopped.process.send_signal(signal.SIGINT)
        assert stopped.finish() == 130, stopped.text()
    finally:
        stopped.end()
    runs["stopped"] = stopped
    (line,) = [line for line in stopped.err if line.startswith("stopped at step ")]
    step = int(re.fullmatch(r"stopped at step (\d+), checkpoint saved; rerun the same command to resume", line).group(1))
    assert checkpoint_steps(model_dir) == [0, 2, STOPPED_AT, step], stopped.text()  # k is no periodic checkpoint

    runs["rerun"] = tpulaunch("train", root / "job.yaml", model_dir, *SHUFFLED, "--set", f"train.steps={step + 5}",
                              "--set", "eval=null")
    assert runs["rerun"].returncode == 0, said(runs["rerun"])
    return root, model_dir, step, runs


def _pipeline_order(root: Path, steps: int, reseed: int = 0) -> list:
    """The first `steps` batches the job's seeded pipeline hands out with the runs' settings, made at step `reseed`
    of a run (its order is tests/estimator/engine/test_seeded_input.py's to check)."""
    loaded = load_job(str(root / "job.yaml"), [SHUFFLED[i + 1] for i in range(0, len(SHUFFLED), 2)])
    assert loaded.problems == []
    tf.random.set_seed(SEED)  # as TPUEstimator seeds its graph (tf_random_seed): the shuffles' seeds are (it, run.seed)
    dataset = make_dataset_fn(loaded.job, "train", use_tpu=False)(BATCH, reseed=reseed)
    return list(dataset.take(steps).as_numpy_iterator())


@pytest.fixture(scope="module")
def never_stopped(resumed):
    """The hand-written loop over the batches the runs read, its weights at every step a checkpoint holds: the
    pipeline made at step 0 for steps 0 and 1, the one made at step 2 (the segment after the evaluation at step 2)
    for step 2, then the pipeline made at step 0 again read on from its batch 3 (the reruns evaluate nothing: one
    segment from step 0, each resume skipping what it trained on)."""
    root, _, step, _ = resumed
    batches = _pipeline_order(root, step + 5)
    (after_evaluation,) = _pipeline_order(root, 1, reseed=2)
    epochs = [np.concatenate([images for images, _ in batches[start:start + 4]]) for start in (0, 4)]
    assert not np.array_equal(epochs[0], _records(root / "train.tfrecord")[0]), "the input is not shuffled"
    assert not np.array_equal(epochs[0], epochs[1]), "the second epoch is not reshuffled"
    assert not any(np.array_equal(after_evaluation[0], images) for images, _ in batches[:3]), \
        "the segment after an evaluation reads a batch the run already read"
    read = batches[:2] + [after_evaluation] + batches[3:]
    return _hand_trained(read, at=(2, STOPPED_AT, step, step + 5))[1]


def _assert_checkpoint_holds(model_dir: Path, step: int, expected: dict) -> None:
    reader = tf.train.load_checkpoint(str(model_dir / f"model.ckpt-{step}"))
    assert reader.get_tensor("global_step") == step
    for name, value in expected.items():
        np.testing.assert_allclose(reader.get_tensor(name), value, err_msg=f"step {step}: {name}", **WEIGHTS)


def test_a_run_that_evaluates_between_its_steps_reads_a_new_order_after_each_evaluation(resumed, never_stopped):
    """Each evaluation ends a segment of training (TPUEstimator's `train` called again, its input made anew): the
    next one reads the pipeline seeded at its first step, not the first batches again."""
    _, model_dir, _, runs = resumed
    assert [line.split(" | ")[:2] for line in runs["first"].stdout.splitlines() if line.startswith("eval |")] == [
        ["eval", "step 2"], ["eval", f"step {STOPPED_AT}"]]
    for step in (2, STOPPED_AT):
        _assert_checkpoint_holds(model_dir, step, never_stopped[step])


def test_a_run_stopped_by_its_train_steps_and_rerun_with_more_reads_on_from_that_step(resumed, never_stopped):
    _, model_dir, step, runs = resumed
    assert f"resumed from step {STOPPED_AT} ({model_dir})" in runs["stopped"].out
    _assert_checkpoint_holds(model_dir, step, never_stopped[step])


def test_a_run_stopped_by_sigint_between_checkpoints_and_rerun_ends_as_one_that_never_stopped(resumed, never_stopped):
    _, model_dir, step, runs = resumed
    assert f"resumed from step {step} ({model_dir})" in runs["rerun"].stdout.splitlines()
    assert checkpoint_steps(model_dir)[-1] == step + 5
    _assert_checkpoint_holds(model_dir, step + 5, never_stopped[step + 5])
