"""The keras and jax engines keep every good checkpoint and touch only their own model_dir: real `tpulaunch`
processes on real checkpoints of each engine (tests/checkpoint_cases.py; the estimator engine runs the same cases in
tests/estimator/run/test_keep_checkpoints.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import checkpoint_cases as cases

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

ENGINES = ["keras", "jax"]


@pytest.fixture(scope="module", params=ENGINES)
def project(request, tmp_path_factory) -> tuple:
    """(the job file, a model_dir trained to cases.STEPS with a checkpoint at each step), per engine: copied by each
    test."""
    root = tmp_path_factory.mktemp(f"keep_{request.param}")
    job = cases.make_project(root, request.param)
    trained = root / "trained"
    result = cases.train(job, trained, cases.STEPS)
    assert result.returncode == 0, cases.said(result)
    return job, trained


def test_a_copied_repaired_model_dir_leaves_the_original_alone_and_a_moved_one_resumes(project, tmp_path: Path):
    cases.a_copied_repaired_model_dir_leaves_the_original_alone_and_a_moved_one_resumes(*project, tmp_path)


def test_a_state_naming_only_a_deleted_step_resumes_from_the_newest_complete_checkpoint(project, tmp_path: Path):
    cases.a_state_naming_only_a_deleted_step_resumes_from_the_newest_complete_checkpoint(*project, tmp_path)


def test_checkpoints_none_of_which_restores_are_refused_not_trained_over(project, tmp_path: Path):
    cases.checkpoints_none_of_which_restores_are_refused_not_trained_over(*project, tmp_path)


def test_evaluate_and_export_fall_back_past_a_truncated_index_and_a_truncated_data_shard(project, tmp_path: Path):
    cases.evaluate_and_export_fall_back_past_a_truncated_index_and_a_truncated_data_shard(*project, tmp_path)


def test_evaluate_and_export_fall_back_past_a_data_shard_short_of_its_last_bytes(project, tmp_path: Path):
    cases.evaluate_and_export_fall_back_past_a_data_shard_short_of_its_last_bytes(*project, tmp_path)
