"""The builder contract's cases: the model a job's builder returns is trained as written, or refused at
model.builder, never trained differently. Each engine's suite runs them with the arguments that pick it
(tests/estimator/checks/test_builder_contract.py, tests/keras_engine/test_builder_contract_keras.py, and for Keras 3
models tests/keras_engine/test_keras3_models.py): `REFUSED` (what the estimator engine refuses, with its key and
words), `TRAINED` (what trains everywhere), and the checks of a Keras Loss scored as Keras scores it."""

from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow as tf
from click.testing import CliRunner

import user_models as corpus
from tpulaunch.cli import run as cli_run
from tpulaunch.cli import validate as cli_validate
from tpulaunch.engine.portable import compute_loss
from tpulaunch.job.imports import resolve

job = corpus.job

# name: (job, the job key validate and train refuse it at, words both say)
REFUSED = {
    "own_train_step": (job({"builder": "own_train_step:with_train_step"}),
                       "model.builder", "WithTrainStep, which overrides train_step"),
    "own_test_step": (job({"builder": "own_train_step:with_test_step"}),
                      "model.builder", "WithTestStep, which overrides test_step"),
    "own_compute_loss": (job({"builder": "own_train_step:with_compute_loss"}),
                         "model.builder", "WithComputeLoss, which overrides compute_loss"),
    "inherited_train_step": (job({"builder": "own_train_step:with_inherited_train_step"}),
                             "model.builder", "WithInheritedTrainStep, which overrides train_step"),
    "compiled_with_loss_and_optimizer": (job({"builder": "compiled_in_builder:with_loss_and_optimizer"}),
                                         "model.builder",
                                         "already compiled (optimizer Adam, loss SparseCategoricalCrossentropy)"),
    "compiled_with_loss_only": (job({"builder": "compiled_in_builder:with_loss_only"}),
                                "model.builder", "already compiled (optimizer RMSprop, loss 'mse')"),
    "metric_class": (job({"builder": "subclassed:build", "metrics": ["loss_and_metric_classes:TopClassHits"]}),
                     "model.metrics[0]", "TopClassHits' is a tf.keras.metrics.Metric class"),
    "metric_class_per_label": (job({"builder": "two_outputs:as_dict", "loss": corpus.PER_LABEL_LOSS,
                                    "metrics": {"cls": ["accuracy", "loss_and_metric_classes:TopClassHits"]}},
                                   labels=corpus.CLS_AND_BOX),
                               "model.metrics.cls[1]", "TopClassHits' is a tf.keras.metrics.Metric class"),
    "metric_object": (job({"builder": "subclassed:build", "metrics": ["loss_and_metric_classes:top_class_hits"]}),
                      "model.metrics[0]", "top_class_hits' is a tf.keras.metrics.Metric object"),
    "loss_class_as_metric": (job({"builder": "subclassed:build",
                                  "metrics": ["loss_and_metric_classes:ClassesCrossentropy"]}),
                             "model.metrics[0]", "ClassesCrossentropy' is a tf.keras.losses.Loss class"),
    "loss_class_needing_arguments": (job({"builder": "subclassed:build", "loss": "loss_and_metric_classes:MarginLoss"}),
                                     "model.loss", "the Keras loss class cannot be made without arguments"),
    "metric_class_as_loss": (job({"builder": "subclassed:build", "loss": "loss_and_metric_classes:TopClassHits"}),
                             "model.loss", "TopClassHits' is a tf.keras.metrics.Metric class, not a loss"),
}

# What the hints of some refusals say: where the logic, or compile()'s settings, go instead.
# The keras engine, which trains all three, is the first fix named (tests/keras_engine/test_keras_as_written.py).
HINTS = {"own_train_step": ["run.engine: keras", "model.loss", "model.optimizer", "tpulaunch explain"],
         "compiled_with_loss_and_optimizer": ["run.engine: keras", "remove compile()", "compile=False", "model.loss",
                                              "model.optimizer"],
         "metric_class": ["built-in metric name", "fn(labels, outputs)", "keras engine (which also takes a Keras Metric)"]}

# Jobs that must train: the plain models of the corpus, and Keras loss classes and instances as model.loss.
TRAINED = {
    "subclassed": job({"builder": "subclassed:build", "metrics": ["accuracy"]}),
    "sequential": job({"builder": "sequential:build", "metrics": ["accuracy"]}),
    "functional": job({"builder": "two_inputs:build", "metrics": ["accuracy"]},
                      {"image": {"shape": [8, 8, 1]}, "extra": {"shape": [3]}}),
    "loss_class": job({"builder": "subclassed:build", "loss": "loss_and_metric_classes:ClassesCrossentropy",
                       "metrics": ["accuracy"]}),
    "loss_instance": job({"builder": "subclassed:build", "loss": "loss_and_metric_classes:classes_crossentropy"}),
    "loss_class_per_label": job({"builder": "two_outputs:as_list",
                                 "loss": {"cls": "loss_and_metric_classes:ClassesCrossentropy",
                                          "box": "mean_squared_error"}}, labels=corpus.CLS_AND_BOX),
}


def validate_and_train(root: Path, name: str, document: dict, *options: str):
    path = corpus.write_job(root, name, document)
    validated = CliRunner().invoke(cli_validate.validate, [str(path), *options], catch_exceptions=False)
    trained = CliRunner().invoke(cli_run.train, [str(path), "--local", *options], catch_exceptions=False)
    return path, validated, trained


def assert_refused(path: Path, validated, trained, key: str, words: str, hints=()) -> None:
    """Both commands exit 1 at `key` with `words` and a hint holding `hints`, and neither shows a traceback or
    calls it unexpected."""
    said = f"validate:\n{validated.output}\ntrain:\n{trained.output}"
    assert validated.exit_code == 1 and trained.exit_code == 1, said
    assert f"{path.name}:" in validated.output and f"{key}:" in validated.output, said
    assert f"error: {key}:" in trained.output, said
    assert words in validated.output and words in trained.output, said
    assert "hint:" in validated.output and "hint:" in trained.output, said
    for hint in hints:
        assert hint in validated.output and hint in trained.output, (hint, said)
    assert "unexpected" not in said and "Traceback" not in said, said


def assert_trained(validated, trained) -> None:
    said = f"validate:\n{validated.output}\ntrain:\n{trained.output}"
    assert validated.exit_code == 0 and trained.exit_code == 0, said
    assert "done | step 2/2" in trained.output, said
    assert "unexpected" not in said and "Traceback" not in said, said


LABELS = tf.constant([0, 2, 1, 1], tf.int64)
LOGITS = tf.constant([[2.0, -1.0, 0.5], [0.1, 0.2, 3.0], [-1.0, 1.5, 0.0], [0.3, 0.3, 0.3]])


# The Keras losses of tests/models/loss_and_metric_classes.py, by class and by object.
KERAS_LOSSES = ["ClassesCrossentropy", "classes_crossentropy"]


def own_loss(name: str):
    return resolve(f"loss_and_metric_classes:{name}", search_path=[str(corpus.MODELS)], what="loss")


def keras_own_loss():
    """What Keras's own loss of that name makes of the batch: the mean of its per-example losses."""
    return float(tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(LABELS, LOGITS))


def a_keras_loss_class_or_object_scores_the_batch_as_keras_does(name):
    by_path = compute_loss(f"loss_and_metric_classes:{name}", LABELS, LOGITS, {}, custom_loss=own_loss(name))
    assert float(by_path) == pytest.approx(keras_own_loss(), rel=1e-6)


def a_keras_loss_runs_inside_a_tf_distribute_replica(name):
    """Keras refuses its own batch mean (reduction AUTO) in a replica step; the job's Loss object is not refused."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    custom = own_loss(name)

    @tf.function
    def step():
        return strategy.run(lambda: compute_loss(f"m:{name}", LABELS, LOGITS, {}, custom_loss=custom))

    assert float(strategy.reduce("SUM", step(), axis=None)) == pytest.approx(keras_own_loss(), rel=1e-6)
    if not isinstance(custom, type):
        assert custom.reduction == "auto"  # the job's own object is left as it was
