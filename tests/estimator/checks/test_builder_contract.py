"""The model the job's builder returns is trained as written, or refused: never trained differently.

The estimator engine trains a builder's model with the job's model.loss and model.optimizer in its
model_fn, so a model that brings its own train_step, test_step or compute_loss, or that the builder
compile()d, would silently train otherwise than its author wrote. Both are refused by `validate` and
by `train --local` alike, at model.builder, with the fix (the keras engine, which trains them as fit()
would). A Keras Loss (class or object) given as model.loss trains, scored as Keras's own losses are;
a Keras Metric (class or object), or a Loss given as a metric, is refused at its key. The same cases
on the keras engine, which trains what it can: tests/keras_engine/test_builder_contract_keras.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import builder_contract
import user_models as corpus
from builder_contract import HINTS, REFUSED, TRAINED, assert_refused, assert_trained, validate_and_train

project = corpus.project


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_model_that_would_train_otherwise_is_refused_by_validate_and_train(project, name):
    document, key, words = REFUSED[name]
    path, validated, trained = validate_and_train(project, name, document)
    assert_refused(path, validated, trained, key, words, HINTS.get(name, ()))


@pytest.mark.parametrize("name", list(TRAINED))
def test_plain_models_and_keras_loss_classes_train(project, name):
    _, validated, trained = validate_and_train(project, name, TRAINED[name])
    assert_trained(validated, trained)


@pytest.mark.parametrize("name", builder_contract.KERAS_LOSSES)
def test_a_keras_loss_class_or_object_scores_the_batch_as_keras_does(name):
    builder_contract.a_keras_loss_class_or_object_scores_the_batch_as_keras_does(name)


@pytest.mark.parametrize("name", builder_contract.KERAS_LOSSES)
def test_a_keras_loss_runs_inside_a_tf_distribute_replica(name):
    builder_contract.a_keras_loss_runs_inside_a_tf_distribute_replica(name)


def test_the_explained_program_trains_a_keras_loss_class_as_train_does(project):
    """explain's program runs portable.py verbatim, so a Loss class by path trains there as in `train`."""
    from explained_programs import explain, run

    path = corpus.write_job(project, "explained_loss_class", TRAINED["loss_class"])
    program = explain(path)
    assert "CUSTOM_LOSSES = {'loss_and_metric_classes:ClassesCrossentropy': " in Path(program).read_text()
    printed = run(program, "train") + run(program, "evaluate")
    assert "'accuracy'" in printed, printed[-2000:]
