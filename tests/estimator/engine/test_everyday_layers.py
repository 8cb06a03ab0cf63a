"""Batch normalization, dropout, weight regularization and frozen layers on the estimator engine: the checks of
tests/everyday_layer_runs.py (tpulaunch's training against the trained model run by hand on the same records)."""

import everyday_layer_runs
from everyday_layer_runs import project  # noqa: F401  (the fixture: the model code and its records)

ENGINE: list = []  # the job's own engine: the estimator


def test_batch_norm_updates_its_moving_statistics_and_evaluation_uses_them(project):
    everyday_layer_runs.batch_norm_updates_its_moving_statistics_and_evaluation_uses_them(project, ENGINE)


def test_dropout_is_off_when_evaluating(project):
    everyday_layer_runs.dropout_is_off_when_evaluating(project, ENGINE)


def test_weight_regularization_is_part_of_the_minimized_and_reported_loss(project):
    everyday_layer_runs.weight_regularization_is_part_of_the_minimized_and_reported_loss(project, ENGINE)


def test_a_frozen_layer_is_unchanged_by_training(project):
    everyday_layer_runs.a_frozen_layer_is_unchanged_by_training(project, ENGINE)
