"""`validate` says OK exactly when `train` works on the keras engine too, on the same user-written models.

The corpus of tests/user_models.py (subclassed, Sequential without Input, Keras Applications,
two inputs, two heads as a list, a named list and a dict, a custom layer, a hand-written model_fn,
and broken jobs), each pinned to `run.engine: keras`: a full validate and a real 2-step train plus
evaluation must agree, and a broken job is refused at the same job key by both.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import user_models as corpus
from tpulaunch.cli import run as cli_run
from tpulaunch.cli import validate as cli_validate

# What differs on the keras engine: a TPUEstimator model_fn is estimator-only, and a TensorFlow 1 metric
# ((value, update_op), tf.compat.v1.metrics) cannot be averaged per batch; a metric returning a tensor is
# averaged, and a functional model's add_loss is traced with the model (both refused by TPUEstimator).
KERAS_JOBS = {
    **corpus.JOBS,
    "add_loss_in_a_functional_model": (corpus.JOBS["add_loss_in_a_functional_model"][0], None),
    "metric_returning_a_tensor": (corpus.JOBS["metric_returning_a_tensor"][0], None),
    # Keras's Model.build() runs a subclassed model's call() outside its call context, where add_loss is refused.
    "add_loss_in_a_subclassed_model": (corpus.JOBS["add_loss_in_a_subclassed_model"][0], "model.builder"),
    "own_model_fn": (corpus.JOBS["own_model_fn"][0], "model.model_fn"),
    "two_outputs_dict_own_loss_and_metric": (corpus.JOBS["two_outputs_dict_own_loss_and_metric"][0],
                                             "model.metrics"),
}


project = corpus.project


@pytest.mark.parametrize("name", list(KERAS_JOBS))
def test_validate_agrees_with_train_on_the_keras_engine(project, name):
    document, broken_at = KERAS_JOBS[name]
    path = corpus.write_job(project, name, document)
    engine = ["--set", "run.engine=keras"]

    validated = CliRunner().invoke(cli_validate.validate, [str(path), *engine], catch_exceptions=False)
    trained = CliRunner().invoke(cli_run.train, [str(path), "--local", *engine], catch_exceptions=False)

    corpus.assert_agreement(name, path, validated, trained, broken_at)
