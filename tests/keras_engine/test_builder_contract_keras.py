"""The builder's model is trained as written, or refused, on the keras engine too (tf-keras, TensorFlow 2.16+).

The cases of tests/test_builder_contract.py, each pinned to `run.engine: keras`, plus what only this
TensorFlow has: a builder that does `import keras` returns a Keras 3 model, which is refused at
model.builder with the installed versions and the fix.
"""

from __future__ import annotations

from importlib import metadata

import pytest
import tensorflow as tf

import test_builder_contract as contract
import test_user_models as corpus
from test_builder_contract import (  # noqa: F401  (run here too: the keras engine's replicas)
    test_a_keras_loss_class_or_object_scores_the_batch_as_keras_does,
    test_a_keras_loss_runs_inside_a_tf_distribute_replica)

ENGINE = ("--set", "run.engine=keras")
KERAS3_SAYS = "a Keras 3 model"

REFUSED = {
    **contract.REFUSED,
    "keras3_functional": (corpus.job({"builder": "keras3_model:functional"}), "model.builder", KERAS3_SAYS),
    "keras3_subclassed": (corpus.job({"builder": "keras3_model:subclassed"}), "model.builder", KERAS3_SAYS),
}

project = corpus.project


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_model_that_would_train_otherwise_is_refused_on_the_keras_engine(project, name):
    document, key, words = REFUSED[name]
    path, validated, trained = contract.validate_and_train(project, name, document, *ENGINE)
    contract.assert_refused(path, validated, trained, key, words, contract.HINTS.get(name, ()))


@pytest.mark.parametrize("name", list(contract.TRAINED))
def test_plain_models_and_keras_loss_classes_train_on_the_keras_engine(project, name):
    _, validated, trained = contract.validate_and_train(project, name, contract.TRAINED[name], *ENGINE)
    contract.assert_trained(validated, trained)


def test_the_keras3_refusal_names_the_installed_versions_and_the_fix(project):
    document, _, _ = REFUSED["keras3_functional"]
    _, validated, trained = contract.validate_and_train(project, "keras3_versions", document, *ENGINE)
    versions = [f"keras {metadata.version('keras')}", f"tf-keras {metadata.version('tf_keras')}",
                f"TensorFlow {tf.__version__}"]
    for output in (validated.output, trained.output):
        for words in [*versions, "import tf_keras as keras", "TF_USE_LEGACY_KERAS=1"]:
            assert words in output, (words, output)
