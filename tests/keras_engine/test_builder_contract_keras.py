"""The builder's model is trained as written, or refused, on the keras engine too (tf-keras, TensorFlow 2.16+).

The cases of tests/checks/test_builder_contract.py, each pinned to `run.engine: keras`. The same contract for Keras 3
models (`import keras`), which this engine trains too: tests/keras_engine/test_keras3_models.py.
"""

from __future__ import annotations

import pytest

import test_builder_contract as contract
import test_user_models as corpus
from test_builder_contract import (  # noqa: F401  (run here too: the keras engine's replicas)
    test_a_keras_loss_class_or_object_scores_the_batch_as_keras_does,
    test_a_keras_loss_runs_inside_a_tf_distribute_replica)

ENGINE = ("--set", "run.engine=keras")

project = corpus.project


@pytest.mark.parametrize("name", list(contract.REFUSED))
def test_a_model_that_would_train_otherwise_is_refused_on_the_keras_engine(project, name):
    document, key, words = contract.REFUSED[name]
    path, validated, trained = contract.validate_and_train(project, name, document, *ENGINE)
    contract.assert_refused(path, validated, trained, key, words, contract.HINTS.get(name, ()))


@pytest.mark.parametrize("name", list(contract.TRAINED))
def test_plain_models_and_keras_loss_classes_train_on_the_keras_engine(project, name):
    _, validated, trained = contract.validate_and_train(project, name, contract.TRAINED[name], *ENGINE)
    contract.assert_trained(validated, trained)
