"""The builder's model is trained as written, or refused, on the keras engine too (tf-keras, TensorFlow 2.16+).

The cases of tests/builder_contract.py, as tests/estimator/checks/test_builder_contract.py runs them, each pinned to `run.engine: keras`: what the estimator engine
refuses because its model_fn would train otherwise (a compiled model, a model's own train_step, a Keras Metric)
trains here. The same contract for Keras 3
models (`import keras`), which this engine trains too: tests/keras_engine/test_keras3_models.py.
"""

from __future__ import annotations

import pytest

import builder_contract as contract
import user_models as corpus

ENGINE = ("--set", "run.engine=keras")

project = corpus.project


# What the estimator engine refuses and the keras engine trains as fit() would: a model's own train_step, test_step
# or compute_loss, a compiled model, a Keras Metric class or object (tests/keras_engine/test_keras_as_written.py
# checks the numbers).
TRAINED_HERE = ("own_train_step", "own_test_step", "own_compute_loss", "inherited_train_step",
                "compiled_with_loss_and_optimizer", "compiled_with_loss_only", "metric_class", "metric_class_per_label",
                "metric_object")


@pytest.mark.parametrize("name", [name for name in contract.REFUSED if name not in TRAINED_HERE])
def test_a_model_that_would_train_otherwise_is_refused_on_the_keras_engine(project, name):
    document, key, words = contract.REFUSED[name]
    path, validated, trained = contract.validate_and_train(project, name, document, *ENGINE)
    contract.assert_refused(path, validated, trained, key, words, contract.HINTS.get(name, ()))


@pytest.mark.parametrize("name", TRAINED_HERE)
def test_what_the_estimator_engine_refuses_trains_on_the_keras_engine(project, name):
    document = contract.REFUSED[name][0]
    _, validated, trained = contract.validate_and_train(project, name, document, *ENGINE)
    contract.assert_trained(validated, trained)


@pytest.mark.parametrize("name", list(contract.TRAINED))
def test_plain_models_and_keras_loss_classes_train_on_the_keras_engine(project, name):
    _, validated, trained = contract.validate_and_train(project, name, contract.TRAINED[name], *ENGINE)
    contract.assert_trained(validated, trained)


# A Keras Loss scored as Keras scores it, here too: the keras engine's replicas.
@pytest.mark.parametrize("name", contract.KERAS_LOSSES)
def test_a_keras_loss_class_or_object_scores_the_batch_as_keras_does(name):
    contract.a_keras_loss_class_or_object_scores_the_batch_as_keras_does(name)


@pytest.mark.parametrize("name", contract.KERAS_LOSSES)
def test_a_keras_loss_runs_inside_a_tf_distribute_replica(name):
    contract.a_keras_loss_runs_inside_a_tf_distribute_replica(name)
