"""The jax engine's TPU stack (engine/jax/stack.py): the generations and runtime versions JAX runs on, checked at
tpu.type and tpu.runtime_version with the engine named; `up` creates a jax job's TPU VM with its generation's base
image. Pure Python: no JAX needed."""

import pytest

from tpulaunch.engine.jax import stack
from tpulaunch.tpu.types import GENERATIONS

from tpu_stack_cases import run, write_job


def test_every_generation_it_lists_is_a_tpu_type_tpulaunch_knows_or_one_it_cannot_create():
    assert set(stack.FACTS["generations"]) - set(GENERATIONS) == {"tpu7x"} <= set(stack.FACTS["gke_only"])
    assert stack.installed_verdict({"jax": "0.10.2"}, "pjrt").code == "jax-without-tpu"
    assert stack.installed_verdict({"jax": "0.10.2", "libtpu": "0.0.21"}, "pjrt") is None


@pytest.mark.parametrize("tpu_type, runtime, expected", [
    # a generation JAX runs on, with its base image: only the refusal of a TPU slice itself
    ("v6e-8", "v2-alpha-tpuv6e", []),
    ("v4-8", "tpu-ubuntu2204-base", []),
    ("v5litepod-8", None, []),
    # a generation it does not run on, and a TensorFlow image, each at its key
    ("v3-8", "tpu-vm-tf-2.15.1-pjrt", [
        "tpu.type: the jax engine runs on TPU v4, v5e, v5p, v6e or TPU7x, not v3 [tpu-stack-generation-without-jax]",
        "hint: choose a v4, v5e, v5p, v6e or TPU7x type, or train on this generation with run.engine: estimator "
        "or keras (TensorFlow)",
        "tpu.runtime_version: tpu-vm-tf-2.15.1-pjrt is a TensorFlow image (its own TensorFlow server and libtpu); "
        "the jax engine runs on a base image, where jax[tpu] brings JAX and libtpu [tpu-stack-runtime-tensorflow-image]",
        "^ hint: use tpu-ubuntu2204-base"]),
    ("v5p-8", "tpu-vm-tf-2.18.0-pjrt", ["[tpu-stack-runtime-tensorflow-image]", "^ hint: use v2-alpha-tpuv5 "]),
    # TPU7x runs JAX (not TensorFlow) but only through GKE: said as that, not as "runs no TensorFlow"
    ("tpu7x-8", None, ["tpu.type: TPU7x (Ironwood) is offered through Google Kubernetes Engine only, not as a TPU "
                       "VM that tpulaunch can create [tpu-stack-generation-gke-only]"]),
])
def test_validate_holds_a_jax_job_to_the_generations_and_runtimes_jax_runs_on(tmp_path, tpu_type, runtime, expected):
    result = run("validate", "--static", write_job(tmp_path, tpu_type, runtime, engine="jax"))
    assert result.exit_code == 1, result.output  # the job's local paths, which a TPU VM cannot read
    assert "jax-engine-unsupported" not in result.output  # a TPU slice is the jax engine's to train on
    assert "iterations_per_loop" not in result.output  # one step per call: no TPU loop to warn about
    for said in expected:
        assert said in result.output
    if not expected:
        assert "tpu-stack" not in result.output
    assert "runs no TensorFlow" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("tpu_type, image", [("v6e-8", "v2-alpha-tpuv6e"), ("v4-16", "tpu-ubuntu2204-base")])
def test_up_creates_a_jax_jobs_tpu_vm_with_its_generations_base_image(cli_tpu_api, tmp_path, tpu_type, image):
    """No runtime_version in the job: the generation's base image, whatever TensorFlow this machine has (none)."""
    result = run("up", write_job(tmp_path, tpu_type, engine="jax"))
    assert result.exit_code == 0, result.output
    assert len(cli_tpu_api.created) == 1
    created = cli_tpu_api.created[0]
    node = created["queuedResource"]["tpu"]["nodeSpec"][0]["node"] if "queuedResource" in created else created["node"]
    assert (node["acceleratorType"], node["runtimeVersion"]) == (tpu_type, image)


def test_a_spatial_split_on_a_slice_of_several_hosts_is_refused_at_partition(tmp_path):
    job = write_job(tmp_path, "v4-16\n          cores_per_replica: 4", "tpu-ubuntu2204-base", engine="jax")
    result = run("validate", "--static", job, "--set", "partition.features.image=[1, 2, 2, 1]",
                 "--set", "train.batch_size=16")
    assert result.exit_code == 1, result.output
    assert "partition: the jax engine splits inputs spatially on one host so far; v4-16 has 2 hosts " \
           "[jax-engine-unsupported]" in result.output
    one_host = run("validate", "--static", job, "--set", "partition.features.image=[1, 2, 2, 1]",
                   "--set", "tpu.type=v4-8", "--set", "train.batch_size=16")
    assert "splits inputs spatially on one host so far" not in one_host.output


def test_plan_batches_a_jax_job_per_host_as_its_hosts_read_the_records():
    """Each host of a jax slice reads its share of every global batch in one input pipeline (engine/jax/hosts.py):
    the plan's batch table says so, not TPUEstimator's per-replica params['batch_size']."""
    from tpulaunch.job.schema import Job
    from tpulaunch.plan.build import build_plan

    job = Job.model_validate({
        "name": "jax-hosts", "model": {"builder": "m:build"},
        "data": {"train": "gs://bucket/train-*", "features": {"image": {"shape": [8, 8, 1]}},
                 "labels": {"label": {"shape": [], "dtype": "int64"}}},
        "tpu": {"name": "t", "zone": "us-central2-b", "project": "p", "type": "v4-16"},
        "train": {"batch_size": 64, "steps": 10}, "run": {"model_dir": "gs://bucket/run", "engine": "jax"}})
    plan = build_plan(job)
    (train,) = plan.batches
    assert (plan.slice.hosts, plan.slice.replicas) == (2, 8)
    assert (train.per_replica, train.per_host, train.params_batch_size) == (8, 32, 32)
    assert plan.slice.input_fn_calls_per_host == 1
