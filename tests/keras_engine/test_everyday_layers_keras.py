"""Batch normalization, dropout, weight regularization and frozen layers on the keras engine: the tests of
tests/estimator/engine/test_everyday_layers.py, each job pinned to `run.engine: keras`."""

import pytest

from test_everyday_layers import (project, test_a_frozen_layer_is_unchanged_by_training,  # noqa: F401
                                  test_batch_norm_updates_its_moving_statistics_and_evaluation_uses_them,
                                  test_dropout_is_off_when_evaluating,
                                  test_weight_regularization_is_part_of_the_minimized_and_reported_loss)


@pytest.fixture
def engine() -> list:
    return ["--set", "run.engine=keras"]
