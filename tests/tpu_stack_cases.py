"""The TPU stack rule's checks (tpu/stack.py's facts, checks/stack.py's located problems), each judging whichever
TensorFlow is installed: the estimator suite runs them under TensorFlow 2.15 (tests/estimator/tpu/test_tpu_stack.py),
the keras suite under 2.21 (tests/keras_engine/test_tpu_stack_keras.py). A check that acts on a node takes
`api`, the `cli_tpu_api` fixture (tests/tpu_api_server.py). `write_job` and `run` serve the jax engine's stack
tests too."""

import json

import pytest
from click.testing import CliRunner

from tpu_api_server import DEFAULT_PROJECT, DEFAULT_ZONE
from tpu_jobs import tpu_job
from tpulaunch.cli.app import cli
from tpulaunch.tpu import stack

TF215 = {"tensorflow-cpu": "2.15.1"}
TF221 = {"tensorflow": "2.21.0"}
TPU219 = {"tensorflow-tpu": "2.19.1", "libtpu": "0.0.10"}


def code(verdict):
    return verdict.code if verdict else None


def this_machines_tensorflow_is_judged_from_its_metadata():
    found = stack.tensorflow_distributions(stack.installed_distributions())
    assert len(found) == 1  # each test environment has one TensorFlow
    (name, version), = found.items()
    # Neither the tensorflow-cpu 2.15 of the estimator environment nor the tensorflow 2.21 of the keras one is a TPU
    # build: the keras engine (PJRT, libtpu in the process) cannot use them; TPUEstimator (its graph sent to the node's
    # own TensorFlow server) can.
    assert code(stack.installed_verdict({name: version}, "pjrt")) == "tensorflow-without-tpu"
    assert code(stack.installed_verdict({name: version}, "se")) is None


INSTALLED_TENSORFLOW_CASES = [
    (TF215, "se", None), (TF215, "pjrt", "tensorflow-without-tpu"),
    (TF221, "pjrt", "tensorflow-without-tpu"), (TPU219, "pjrt", None), ({"tensorflow-tpu": "2.20.0"}, "pjrt", None),
    ({"tensorflow": "2.19.0", "tensorflow-tpu": "2.19.1"}, "pjrt", "tensorflow-clobbered"),
    ({"tensorflow_cpu": "2.15.1", "tensorflow": "2.15.1"}, "se", "tensorflow-clobbered"),
    ({}, "pjrt", None),  # no TensorFlow: nothing to judge
]


def installed_tensorflow(installed, api, expected):
    assert code(stack.installed_verdict(installed, api)) == expected


GENERATIONS_CASES = [
    ("v2", "se", (2, 15, 1), None), ("v3", "se", (2, 15, 1), None), ("v4", "se", (2, 15, 1), None),
    ("v4", "pjrt", (2, 19, 1), None),
    ("v5e", "se", (2, 15, 1), "generation-runtime"), ("v5p", "se", (2, 15, 1), "generation-runtime"),
    ("v6e", "se", (2, 15, 1), "generation-runtime"),
    ("v5e", "pjrt", (2, 19, 1), None), ("v5p", "pjrt", (2, 18, 0), None), ("v6e", "pjrt", (2, 15, 0), None),
    ("v6e", "pjrt", (2, 14, 0), "generation-tensorflow"),
    ("tpu7x", "pjrt", (2, 19, 1), "generation-without-tensorflow"),
]


def generations(generation, api, tf, expected):
    assert code(stack.generation_verdict(generation, api, tf)) == expected


def every_generation_tpulaunch_knows_has_its_tensorflow_facts():
    from tpulaunch.tpu.types import GENERATIONS

    assert set(GENERATIONS) == set(stack.FACTS["generations"])


RUNTIME_VERSIONS_CASES = [
    ("tpu-vm-tf-2.15.0-se", "se", (2, 15, 1), TF215, 1, None),  # 2.15.0 image, 2.15.1 here: same major.minor
    ("tpu-vm-tf-2.15.0-pod-se", "se", (2, 15, 1), TF215, 4, None),
    ("tpu-vm-tf-2.15.0-pod-se", "se", (2, 15, 1), TF215, 1, "runtime-pod-mismatch"),
    ("tpu-vm-tf-2.15.0-pjrt", "se", (2, 15, 1), TF215, 1, "runtime-api-mismatch"),
    ("tpu-vm-tf-2.15.0-pod-pjrt", "se", (2, 15, 1), TF215, 4, "runtime-api-mismatch"),
    ("tpu-vm-tf-2.15.0", "se", (2, 15, 1), TF215, 1, "runtime-api-mismatch"),  # a suffix is required from 2.15
    ("tpu-vm-tf-2.18.0-pjrt", "se", (2, 15, 1), TF215, 1, "runtime-tensorflow-mismatch"),
    ("tpu-vm-tf-2.18.0-pjrt", "pjrt", (2, 19, 1), TPU219, 1, "runtime-tensorflow-mismatch"),
    ("tpu-vm-tf-2.18.0-pjrt", "pjrt", (2, 18, 0), {"tensorflow-tpu": "2.18.0"}, 1, None),
    ("tpu-ubuntu2204-base", "se", (2, 15, 1), TF215, 1, "runtime-without-tensorflow"),
    ("tpu-ubuntu2204-base", "pjrt", (2, 19, 1), TPU219, 1, None),  # tensorflow-tpu brings TensorFlow and libtpu
    ("v2-alpha-tpuv5-lite", "pjrt", (2, 19, 1), TPU219, 1, None),
    ("v2-alpha-tpuv5-lite", "pjrt", (2, 21, 0), TF221, 1, "runtime-without-tensorflow"),
    ("my-own-image", "pjrt", (2, 19, 1), TPU219, 1, "runtime-unknown"),
]


def runtime_versions(runtime, api, tf, installed, hosts, expected):
    assert code(stack.runtime_verdict(runtime, api, tf, installed, hosts=hosts)) == expected


def default_runtime_follows_the_installed_tensorflow():
    assert stack.default_runtime("se", (2, 15, 1), hosts=4) == "tpu-vm-tf-2.15.1-pod-se"
    assert stack.default_runtime("pjrt", (2, 18, 0), hosts=1) == "tpu-vm-tf-2.18.0-pjrt"
    # No image runs TensorFlow 2.19: the pip TPU build goes onto a base image.
    assert stack.default_runtime("pjrt", (2, 19, 1), hosts=1, generation="v5e") == "v2-alpha-tpuv5-lite"
    assert stack.default_runtime("pjrt", (2, 19, 1), hosts=1, generation="v4") == "tpu-ubuntu2204-base"
    # What `up` creates is a runtime the rule accepts.
    for api, tf, installed, hosts in (("se", (2, 15, 1), TF215, 4), ("pjrt", (2, 19, 1), TPU219, 1)):
        assert stack.runtime_verdict(stack.default_runtime(api, tf, hosts=hosts), api, tf, installed, hosts=hosts) is None


# ------------------------------------------------------------------------------------- the verbs
def write_job(tmp_path, tpu_type="v3-8", runtime=None, engine=None):
    lines = f"type: {tpu_type}" + (f"\nruntime_version: {runtime}" if runtime else "")
    return str(tpu_job(tmp_path, lines, name="stack", run=f", engine: {engine}" if engine else ""))


class Ran:
    def __init__(self, result):
        self.exit_code = result.exit_code
        self.output = " ".join(result.output.split())  # one line: the checks below read sentences


def run(*args):
    return Ran(CliRunner().invoke(cli, list(args), catch_exceptions=False, terminal_width=250))


def validate_locates_an_estimator_job_on_a_pjrt_only_generation_and_its_runtime(tmp_path):
    job = write_job(tmp_path, "v6e-8", "tpu-vm-tf-2.15.0-pjrt", engine="estimator")
    result = run("validate", "--static", job)
    assert result.exit_code == 1, result.output
    assert f"{job}:12:9: tpu.type: Cloud TPU runs TensorFlow on v6e only with the pjrt runtime" in result.output
    assert "[tpu-stack-generation-runtime]" in result.output
    assert f"{job}:13:20: tpu.runtime_version: tpu-vm-tf-2.15.0-pjrt names the pjrt runtime; this engine needs se" \
        in result.output
    assert "Traceback" not in result.output
    # Run on this machine (--local), the job has no TPU and nothing to check.
    assert "tpu-stack" not in run("validate", "--static", "--local", job).output


def status_refuses_a_node_whose_runtime_runs_another_tensorflow(api, tmp_path):
    from tpulaunch.seam.registry import default_name, installed

    # The engine this machine's TensorFlow runs, so the node is held to the TensorFlow installed here.
    engine = default_name()
    api.set_node("my-tpu", tensorflow_version="2.15.1")
    node = api.nodes[f"projects/{DEFAULT_PROJECT}/locations/{DEFAULT_ZONE}/nodes/my-tpu"]
    node["runtimeVersion"] = "tpu-vm-tf-2.12.0"
    job = write_job(tmp_path, "v3-8", engine=engine)
    if engine == "keras":  # tensorflow 2.21 here drives no TPU: refused before the node is read, at tpu:
        result = run("status", job)
        assert result.exit_code == 1, result.output
        assert f"{job}:8:1: tpu: the installed TensorFlow (tensorflow " in result.output
        assert "[tpu-stack-tensorflow-without-tpu]" in result.output
        return
    result = run("status", job)
    assert result.exit_code == 1, result.output
    major, minor = installed(engine)
    assert (f"{job}:9:9: tpu.name: TPU node 'my-tpu' runs tpu-vm-tf-2.12.0 runs TensorFlow 2.12, this machine has "
            f"TensorFlow {major}.{minor}") in result.output
    assert "hint: use tpu-vm-tf-" in result.output and "-se: recreate the node" in result.output
    assert "runtime tpu-vm-tf-2.12.0" in result.output  # the node's table is shown too
    doc = json.loads(run("status", job, "--format", "json").output)
    assert [p["code"] for p in doc["problems"]] == ["tpu-stack-node-runtime-tensorflow-mismatch"]


def up_refuses_before_creating_anything_on_a_pjrt_only_generation(api, tmp_path):
    result = run("up", write_job(tmp_path, "v5litepod-8", engine="estimator"))
    assert result.exit_code == 1, result.output
    assert "tpu.type: Cloud TPU runs TensorFlow on v5e only with the pjrt runtime" in result.output
    assert api.created == []


def tpu7x_types_are_refused_as_running_no_tensorflow():
    from tpulaunch.tpu.types import UnknownTpuType, parse_tpu_type

    with pytest.raises(UnknownTpuType) as info:
        parse_tpu_type("tpu7x-8")
    assert str(info.value) == "TPU7x (Ironwood) runs no TensorFlow ('tpu7x-8')"


def train_on_a_tpu_refuses_a_machine_whose_tensorflow_cannot_drive_it_and_validate_warns(api, tmp_path):
    """What `train` refuses about this machine's TensorFlow, it refuses before the TPU API is asked anything;
    validate (run on workstations and in CI) says the same as a warning. Judged for whichever TensorFlow is
    installed: 2.15 (the estimator talks to the node's own TensorFlow server: nothing to refuse) and 2.21
    (no TPU build: refused)."""
    from tpulaunch.seam.registry import about, engine_name

    job = write_job(tmp_path)
    gs = ["--set", "run.model_dir=gs://my-bucket/runs/x", "--set", "data.train=gs://my-bucket/data/train.tfrecord"]
    verdict = stack.installed_verdict(stack.installed_distributions(), about(engine_name(None)).on_tpu.runtime)
    refused = verdict is not None and verdict.severity == "error"
    trained = run("train", job, *gs, "--wait", "0")
    assert (f"[tpu-stack-{verdict.code}]" in trained.output) is refused if verdict else "tpu-stack" not in trained.output
    assert "Traceback" not in trained.output
    if refused:
        assert trained.exit_code == 1, trained.output
        assert "this machine's TensorFlow cannot drive the job's TPU" in trained.output
        assert api.requests == []  # nothing was asked of the Cloud TPU API
        checked = run("validate", job, *gs)
        assert f"tpu: warning: {verdict.message}" in checked.output
        assert "run it where the TPU's TensorFlow is installed" in checked.output
    else:  # it went on (to the model_dir's lease on gs://, which needs credentials here)
        assert "cannot drive the job's TPU" not in trained.output


def down_deletes_a_node_whose_job_the_stack_rule_refuses(api, tmp_path):
    """A node made before the stack rule (or by hand) can always be deleted: `down` goes on past the stack's
    refusal, not past any other mistake."""
    api.set_node("my-tpu", accelerator_type="v5litepod-8")
    job = write_job(tmp_path, "v5litepod-8", engine="estimator")  # v5e runs no TPUEstimator: refused by up
    assert run("up", job).exit_code == 1
    result = run("down", job, "--timeout", "30")
    assert result.exit_code == 0, result.output
    assert f"projects/{DEFAULT_PROJECT}/locations/{DEFAULT_ZONE}/nodes/my-tpu" not in api.nodes
    broken = write_job(tmp_path, "v5litepod-8\nzone_typo: 1", engine="estimator")
    assert run("down", broken).exit_code == 1
