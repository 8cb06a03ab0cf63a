"""The TPU stack rule (tpu/stack.py's facts, checks/stack.py's located problems): the installed TensorFlow, each
generation and each runtime version, then `validate`, `up` and `status` (against the local Cloud TPU API server)
refusing what cannot run, located at its job key, exit code 1. The checks (tests/tpu_stack_cases.py) judge
whichever TensorFlow is installed: here the estimator engine's 2.15."""

import pytest

import tpu_stack_cases


def test_this_machines_tensorflow_is_judged_from_its_metadata():
    tpu_stack_cases.this_machines_tensorflow_is_judged_from_its_metadata()


@pytest.mark.parametrize("installed, api, expected", tpu_stack_cases.INSTALLED_TENSORFLOW_CASES)
def test_installed_tensorflow(installed, api, expected):
    tpu_stack_cases.installed_tensorflow(installed, api, expected)


@pytest.mark.parametrize("generation, api, tf, expected", tpu_stack_cases.GENERATIONS_CASES)
def test_generations(generation, api, tf, expected):
    tpu_stack_cases.generations(generation, api, tf, expected)


def test_every_generation_tpulaunch_knows_has_its_tensorflow_facts():
    tpu_stack_cases.every_generation_tpulaunch_knows_has_its_tensorflow_facts()


@pytest.mark.parametrize("runtime, api, tf, installed, hosts, expected", tpu_stack_cases.RUNTIME_VERSIONS_CASES)
def test_runtime_versions(runtime, api, tf, installed, hosts, expected):
    tpu_stack_cases.runtime_versions(runtime, api, tf, installed, hosts, expected)


def test_default_runtime_follows_the_installed_tensorflow():
    tpu_stack_cases.default_runtime_follows_the_installed_tensorflow()


def test_validate_locates_an_estimator_job_on_a_pjrt_only_generation_and_its_runtime(tmp_path):
    tpu_stack_cases.validate_locates_an_estimator_job_on_a_pjrt_only_generation_and_its_runtime(tmp_path)


def test_status_refuses_a_node_whose_runtime_runs_another_tensorflow(cli_tpu_api, tmp_path):
    tpu_stack_cases.status_refuses_a_node_whose_runtime_runs_another_tensorflow(cli_tpu_api, tmp_path)


def test_up_refuses_before_creating_anything_on_a_pjrt_only_generation(cli_tpu_api, tmp_path):
    tpu_stack_cases.up_refuses_before_creating_anything_on_a_pjrt_only_generation(cli_tpu_api, tmp_path)


def test_tpu7x_types_are_refused_as_running_no_tensorflow():
    tpu_stack_cases.tpu7x_types_are_refused_as_running_no_tensorflow()


def test_train_on_a_tpu_refuses_a_machine_whose_tensorflow_cannot_drive_it_and_validate_warns(cli_tpu_api, tmp_path):
    tpu_stack_cases.train_on_a_tpu_refuses_a_machine_whose_tensorflow_cannot_drive_it_and_validate_warns(cli_tpu_api, tmp_path)


def test_down_deletes_a_node_whose_job_the_stack_rule_refuses(cli_tpu_api, tmp_path):
    tpu_stack_cases.down_deletes_a_node_whose_job_the_stack_rule_refuses(cli_tpu_api, tmp_path)
