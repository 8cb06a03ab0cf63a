"""Batch normalization, dropout, weight regularization and frozen layers, trained by tpulaunch and checked
against the trained model run by hand on the same records: the checks each engine's suite runs
(tests/estimator/engine/test_everyday_layers.py, tests/keras_engine/test_everyday_layers_keras.py), given the
arguments that pick the engine (`engine`) and the `project` fixture below (the model code and its records).

The model run by hand is the one `export` writes (inference mode: moving statistics, no dropout), served on
the evaluation records; its cross-entropy, computed here with NumPy, is what `evaluate` must report (plus
the regularization penalty, which the reported loss includes on both engines). The weights are read from
the same export.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml
from click.testing import CliRunner

from paths import MODELS
from records import write_examples
from tpulaunch.cli.app import cli

EVAL_RECORDS = 8


def examples(count: int, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, count)
    images = (rng.normal(size=(count, 8, 8, 1)) + labels[:, None, None, None]).astype(np.float32)
    return images, labels


@pytest.fixture
def project(tmp_path) -> Path:
    shutil.copy(MODELS / "everyday_layers.py", tmp_path / "everyday_layers.py")
    for name, count, seed in (("train", 16, 1), ("eval", EVAL_RECORDS, 2)):
        images, labels = examples(count, seed)
        write_examples(tmp_path / f"{name}.tfrecord", [{"image": i, "label": n} for i, n in zip(images, labels)])
    return tmp_path


def write_job(root: Path, builder: str, params: dict = None, name: str = "layers") -> Path:
    job = {
        "name": name,
        "model": {"builder": f"everyday_layers:{builder}", "params": params or {},
                  "optimizer": {"name": "sgd", "learning_rate": 0.05}},
        "data": {"train": "train.tfrecord", "eval": "eval.tfrecord", "shuffle_buffer": 16,
                 "features": {"image": {"shape": [8, 8, 1]}}, "labels": {"label": {"shape": [], "dtype": "int64"}}},
        "train": {"batch_size": 4, "steps": 6},
        "eval": {"batch_size": EVAL_RECORDS, "steps": 1},  # every evaluation record, once
        "run": {"model_dir": f"runs/{name}", "log_every_steps": 1, "seed": 1},
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def tpulaunch(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def evaluated_loss(job: Path, engine: list) -> float:
    output = tpulaunch("evaluate", str(job), *engine)
    return float(re.search(r"^eval \| step \d+ \| (?:.*\| )?loss ([0-9.e+-]+)", output, re.M).group(1))


def exported(job: Path, engine: list) -> tuple:
    """(serve, {variable name: value}) of the model `export` writes from the newest checkpoint."""
    output = tpulaunch("export", str(job), str(job.parent / "exported"), *engine)
    path = re.search(r"^exported (\S+)$", output, re.M).group(1)
    model = tf.saved_model.load(str(job.parent / path))
    return model.signatures["serving_default"], {v.name.split(":")[0]: v.numpy() for v in model.variables}


def variable(variables: dict, suffix: str) -> np.ndarray:
    (name,) = [n for n in variables if n.endswith(suffix)]
    return variables[name]


def cross_entropy_by_hand(serve) -> float:
    images, labels = examples(EVAL_RECORDS, seed=2)
    (logits,) = serve(image=tf.constant(images)).values()
    logits = logits.numpy().astype(np.float64)
    log_probabilities = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return float(-log_probabilities[np.arange(EVAL_RECORDS), labels].mean())


def batch_norm_updates_its_moving_statistics_and_evaluation_uses_them(project, engine):
    job = write_job(project, "batch_norm")
    tpulaunch("train", str(job), "--local", *engine)
    serve, variables = exported(job, engine)
    assert np.abs(variable(variables, "norm/moving_mean")).max() > 1e-3  # moved from its initial zeros
    assert not np.allclose(variable(variables, "norm/moving_variance"), 1.0)
    assert evaluated_loss(job, engine) == pytest.approx(cross_entropy_by_hand(serve), rel=1e-3)


def dropout_is_off_when_evaluating(project, engine):
    job = write_job(project, "dropout", {"rate": 0.5})
    tpulaunch("train", str(job), "--local", *engine)
    first, second = evaluated_loss(job, engine), evaluated_loss(job, engine)
    assert first == second
    serve, _ = exported(job, engine)
    assert first == pytest.approx(cross_entropy_by_hand(serve), rel=1e-3)


def weight_regularization_is_part_of_the_minimized_and_reported_loss(project, engine):
    penalized = write_job(project, "regularized", {"l2": 1.0}, name="penalized")
    plain = write_job(project, "regularized", {"l2": 0.0}, name="plain")
    for job in (penalized, plain):
        tpulaunch("train", str(job), "--local", *engine)
    serve, variables = exported(penalized, engine)
    kernel = variable(variables, "penalized/kernel")
    penalty = float(np.sum(np.square(kernel.astype(np.float64))))
    # The evaluation's loss is the cross-entropy plus l2 * sum(kernel ** 2), as Keras's L2 defines it.
    assert evaluated_loss(penalized, engine) == pytest.approx(cross_entropy_by_hand(serve) + 1.0 * penalty, rel=1e-3)
    # The optimizer minimized it: the same run without the penalty ends with a larger kernel.
    _, unpenalized = exported(plain, engine)
    assert penalty < 0.9 * float(np.sum(np.square(variable(unpenalized, "penalized/kernel"))))


def a_frozen_layer_is_unchanged_by_training(project, engine):
    job = write_job(project, "frozen_base")
    tpulaunch("train", str(job), "--local", *engine)
    _, variables = exported(job, engine)
    np.testing.assert_array_equal(variable(variables, "frozen/kernel"), np.float32(0.05))  # its constant initial value
    np.testing.assert_array_equal(variable(variables, "frozen/bias"), 0.0)
    assert np.abs(variable(variables, "head/bias")).max() > 0  # the layer after it did train
