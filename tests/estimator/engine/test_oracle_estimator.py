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

One `train` run (module scope) is shared by every assertion.
Tolerances: weights rtol 1e-5, atol 1e-6 (the same float32 steps on the same CPU; only the order of sums may
differ); metrics rtol 1e-5, atol 1e-6; the served logits rtol 1e-5, atol 1e-5.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml

from checkpoint_cases import tpulaunch
from records import write_examples
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


def _hand_trained(root: Path):
    """The model after STEPS hand-written Adam steps from the builder's seeded values."""
    tf.keras.utils.set_random_seed(SEED)  # as a Keras user seeds a run: Python's, NumPy's, TensorFlow's, Keras's
    model = build(**PARAMS)
    optimizer = tf.compat.v1.train.AdamOptimizer(learning_rate=LEARNING_RATE)
    x, y = _records(root / "train.tfrecord")
    for step in range(STEPS):
        start = step * BATCH % TRAIN_RECORDS
        with tf.GradientTape() as tape:
            logits = model(x[start:start + BATCH], training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y[start:start + BATCH], logits))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return model



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
    hand = _hand_trained(root)
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
