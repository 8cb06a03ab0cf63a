"""The TPU node check against a local Cloud TPU API, through the real cloud-tpu-client and TPUClusterResolver.

No Google credentials and no network: `tpu_api` (tests/tpu_api_server.py) serves the discovery document
and the node on 127.0.0.1; the client is pointed at it with its discovery URL.
"""

import json
import textwrap
import threading
import time

import pytest
from click.testing import CliRunner

from tpu_api_server import DEFAULT_PROJECT, DEFAULT_ZONE
from tpulaunch.tpu.node import (
    Finding, NodeRef, NodeStatus, check_node, cluster_resolver, installed_tensorflow_version, resolve_node, watch_node,
)
from tpulaunch.errors import ExitCode, TpuLaunchError
from tpulaunch.job.schema import Tpu

TF = installed_tensorflow_version()
FAST = {"backoff_s": 0.02, "poll_s": 0.05}  # keep retry and poll pauses short; the logic is the same


def job_tpu(name="my-tpu", type="v3-8", **kw):
    return Tpu(name=name, zone=DEFAULT_ZONE, project=DEFAULT_PROJECT, type=type, **kw)


def ref_for(tpu):
    return resolve_node(tpu, env={})


def ready_status(**changes):
    fields = dict(name="my-tpu", zone=DEFAULT_ZONE, project=DEFAULT_PROJECT, state="READY", health="HEALTHY",
                  accelerator_type="v3-8", expected_type="v3-8", devices=8, hosts=1, runtime_version="tpu-vm-tf-2.15.0-se",
                  installed_tf=TF, endpoints=["10.0.0.2:8470"], api_version="V2", findings=[])
    fields.update(changes)
    return NodeStatus(**fields)


def without_timing(status: NodeStatus) -> NodeStatus:
    status.waited_s = 0.0
    return status


# ----------------------------------------------------------------------------------------- resolve_node


def test_resolve_from_the_job_records_where_each_part_came_from():
    ref = resolve_node(job_tpu(), env={"TPU_NAME": "ignored"})
    assert ref == NodeRef("my-tpu", DEFAULT_ZONE, DEFAULT_PROJECT,
                          {"name": "tpu.name", "zone": "tpu.zone", "project": "tpu.project"})


def test_resolve_falls_back_to_the_environment():
    env = {"TPU_NAME": "env-tpu", "TPU_ZONE": "europe-west4-a", "GOOGLE_CLOUD_PROJECT": "proj", "NO_GCE_CHECK": "True"}
    ref = resolve_node(Tpu(type="v3-8"), env=env)
    assert ref == NodeRef("env-tpu", "europe-west4-a", "proj",
                          {"name": "$TPU_NAME", "zone": "$TPU_ZONE", "project": "$GOOGLE_CLOUD_PROJECT"})


def test_missing_name_says_which_job_key_or_variable_to_set():
    with pytest.raises(TpuLaunchError) as info:
        resolve_node(Tpu(type="v3-8", zone="z", project="p"), env={})
    assert info.value.message == "no TPU named: set tpu.name in the job file, or $TPU_NAME"
    assert info.value.exit_code == ExitCode.PROBLEMS


def test_missing_zone_off_google_cloud_names_the_key():
    with pytest.raises(TpuLaunchError) as info:
        resolve_node(Tpu(type="v3-8", name="n", project="p"), env={"NO_GCE_CHECK": "True"})
    assert info.value.message == "TPU 'n': no zone given: set tpu.zone in the job file (or $TPU_ZONE)"


def test_local_tpu_vm_needs_no_zone_or_project():
    ref = resolve_node(Tpu(type="v4-8", name="local"), env={})
    assert (ref.local, ref.zone, ref.project) == (True, None, None)
    status = check_node(ref, Tpu(type="v4-8", name="local"))
    assert (status.usable, [f.code for f in status.findings]) == (True, ["no-api-check"])


# ----------------------------------------------------------------------------------------- check_node


def test_ready_and_healthy_node(tpu_api):
    tpu_api.set_node("my-tpu")
    status = check_node(ref_for(job_tpu()), job_tpu(), api_endpoint=tpu_api.endpoint)
    assert without_timing(status) == ready_status()
    assert status.usable


def test_pod_slice_reports_every_host(tpu_api):
    tpu_api.set_node("my-tpu", accelerator_type="v3-32", hosts=4)
    status = check_node(ref_for(job_tpu(type="v3-32")), job_tpu(type="v3-32"), api_endpoint=tpu_api.endpoint)
    assert (status.devices, status.hosts, status.endpoints) == (
        32, 4, ["10.0.0.2:8470", "10.0.0.3:8470", "10.0.0.4:8470", "10.0.0.5:8470"])


def test_megacore_node_counts_one_device_per_chip(tpu_api):
    tpu_api.set_node("my-tpu", accelerator_type="v4-8")
    status = check_node(ref_for(job_tpu(type="v4-8")), job_tpu(type="v4-8"), api_endpoint=tpu_api.endpoint)
    assert (status.accelerator_type, status.devices, status.usable) == ("v4-8", 4, True)


def test_waits_through_creating_until_ready(tpu_api):
    tpu_api.set_node("my-tpu", state="CREATING", health=None)
    tpu_api.play("my-tpu", [(0.6, "READY", "HEALTHY")])
    seen = []
    status = check_node(ref_for(job_tpu()), job_tpu(), wait=20, api_endpoint=tpu_api.endpoint,
                        on_wait=lambda s, left: seen.append((s.state, s.health, left <= 20)), **FAST)
    assert status.usable and status.state == "READY"
    assert seen and set(seen) == {("CREATING", None, True)}
    assert 0.6 <= status.waited_s < 10


def test_ready_but_not_yet_healthy_is_waited_for(tpu_api):
    tpu_api.set_node("my-tpu", health="UNHEALTHY_MAINTENANCE")
    tpu_api.play("my-tpu", [(0.4, "READY", "HEALTHY")])
    status = check_node(ref_for(job_tpu()), job_tpu(), wait=20, api_endpoint=tpu_api.endpoint, **FAST)
    assert (status.state, status.health, status.usable) == ("READY", "HEALTHY", True)


def test_still_creating_after_the_wait_is_not_usable(tpu_api):
    tpu_api.set_node("my-tpu", state="CREATING", health=None)
    status = check_node(ref_for(job_tpu()), job_tpu(), wait=0.3, api_endpoint=tpu_api.endpoint, **FAST)
    assert status.findings == [Finding("error", "node-not-ready", "TPU node 'my-tpu' is still CREATING after waiting 0.3s",
                                       "wait longer with --wait SECONDS, or check `gcloud compute tpus describe`")]
    assert not status.usable


def test_preempted_fails_fast_even_with_a_long_wait(tpu_api):
    tpu_api.set_node("my-tpu", state="PREEMPTED", health=None)
    started = time.monotonic()
    status = check_node(ref_for(job_tpu()), job_tpu(), wait=600, api_endpoint=tpu_api.endpoint)
    assert time.monotonic() - started < 5
    assert tpu_api.node_requests("my-tpu") == 1
    assert status.findings == [Finding(
        "error", "node-not-running", "TPU node 'my-tpu' is PREEMPTED",
        "a preempted node must be recreated: `tpulaunch down JOB.yaml` then `tpulaunch up JOB.yaml` "
        "(or train with --auto-resume N --recreate, which does both)")]
    with pytest.raises(TpuLaunchError) as info:
        status.raise_if_unusable()
    assert (info.value.message, info.value.exit_code) == ("TPU node 'my-tpu' is PREEMPTED", ExitCode.CLUSTER)


def test_stopped_node_says_how_to_start_it(tpu_api):
    tpu_api.set_node("my-tpu", state="STOPPED", health=None)
    status = check_node(ref_for(job_tpu()), job_tpu(), api_endpoint=tpu_api.endpoint)
    assert status.findings == [Finding(
        "error", "node-not-running", "TPU node 'my-tpu' is STOPPED",
        "start it: `gcloud compute tpus tpu-vm start my-tpu --zone us-central1-a --project test-project`")]


def test_accelerator_type_differs_from_the_job(tpu_api):
    tpu_api.set_node("my-tpu", accelerator_type="v2-8")
    status = check_node(ref_for(job_tpu()), job_tpu(type="v3-8"), api_endpoint=tpu_api.endpoint)
    assert status.findings == [Finding(
        "error", "accelerator-type-mismatch", "TPU node 'my-tpu' is a v2-8, but the job's tpu.type is v3-8",
        "set tpu.type: v2-8 (and re-run `tpulaunch plan`), or point tpu.name at a v3-8 node")]


def test_runtime_version_other_than_installed_tensorflow_is_a_warning(tpu_api):
    tpu_api.set_node("my-tpu", tensorflow_version="2.12.0")
    status = check_node(ref_for(job_tpu()), job_tpu(), api_endpoint=tpu_api.endpoint)
    assert [(f.severity, f.code, f.message) for f in status.findings] == [
        ("warning", "runtime-version-mismatch", f"the node runs TensorFlow 2.12 (tpu-vm-tf-2.12.0-se), this machine has {TF}")]
    assert status.usable


def test_server_errors_are_retried_until_the_api_recovers(tpu_api):
    tpu_api.set_node("my-tpu")
    tpu_api.fail_next(2, 503)
    status = check_node(ref_for(job_tpu()), job_tpu(), api_endpoint=tpu_api.endpoint, **FAST)
    assert without_timing(status) == ready_status()
    assert tpu_api.node_requests("my-tpu") == 3


def test_persistent_server_errors_give_up_with_the_cluster_exit_code(tpu_api):
    tpu_api.set_node("my-tpu")
    tpu_api.fail_next(100, 500)
    with pytest.raises(TpuLaunchError) as info:
        check_node(ref_for(job_tpu()), job_tpu(), api_endpoint=tpu_api.endpoint, attempts=3, **FAST)
    assert info.value.exit_code == ExitCode.CLUSTER
    assert info.value.message == ("could not read TPU node 'my-tpu' (projects/test-project/locations/us-central1-a/"
                                  "nodes/my-tpu) after 3 tries: HTTP 500 from the TPU API")
    assert tpu_api.node_requests("my-tpu") == 3


def test_malformed_json_is_retried_then_reported(tpu_api):
    tpu_api.set_node("my-tpu")
    tpu_api.malformed_next(1)
    assert check_node(ref_for(job_tpu()), job_tpu(), api_endpoint=tpu_api.endpoint, **FAST).usable
    tpu_api.malformed_next(100)
    with pytest.raises(TpuLaunchError) as info:
        check_node(ref_for(job_tpu()), job_tpu(), api_endpoint=tpu_api.endpoint, attempts=2, **FAST)
    assert info.value.exit_code == ExitCode.CLUSTER
    assert info.value.message.endswith("after 2 tries: the TPU API answered with malformed JSON")


def test_slow_replies_time_out_and_are_retried(tpu_api):
    tpu_api.set_node("my-tpu")
    tpu_api.delay_next(1, 2.0)
    started = time.monotonic()
    assert check_node(ref_for(job_tpu()), job_tpu(), api_endpoint=tpu_api.endpoint, timeout=0.3, **FAST).usable
    assert time.monotonic() - started < 1.8  # did not sit out the 2 s reply
    tpu_api.delay_next(100, 2.0)
    with pytest.raises(TpuLaunchError) as info:
        check_node(ref_for(job_tpu()), job_tpu(), api_endpoint=tpu_api.endpoint, timeout=0.3, attempts=2, **FAST)
    assert info.value.message.endswith("after 2 tries: the TPU API did not answer in time")


def test_unknown_node_fails_at_once_naming_what_was_tried(tpu_api):
    tpu = job_tpu(name="no-such-tpu")
    with pytest.raises(TpuLaunchError) as info:
        check_node(ref_for(tpu), tpu, api_endpoint=tpu_api.endpoint, **FAST)
    assert (info.value.message, info.value.hint, info.value.exit_code) == (
        "TPU node 'no-such-tpu' not found in project 'test-project', zone 'us-central1-a' "
        "(name from tpu.name, zone from tpu.zone, project from tpu.project)",
        "check the name, zone and project (`gcloud compute tpus tpu-vm list --zone us-central1-a --project "
        "test-project`), or create it: `tpulaunch up JOB.yaml`",
        ExitCode.CLUSTER)
    assert tpu_api.node_requests("no-such-tpu") == 1


def test_permission_denied_is_not_retried(tpu_api):
    tpu_api.set_node("my-tpu")
    tpu_api.fail_next(1, 403, message="Permission 'tpu.nodes.get' denied on resource")
    with pytest.raises(TpuLaunchError) as info:
        check_node(ref_for(job_tpu()), job_tpu(), api_endpoint=tpu_api.endpoint, **FAST)
    assert info.value.message == ("permission denied reading TPU node 'my-tpu' in project 'test-project', "
                                  "zone 'us-central1-a': Permission 'tpu.nodes.get' denied on resource")
    assert info.value.exit_code == ExitCode.CLUSTER
    assert tpu_api.node_requests("my-tpu") == 1


def test_unreachable_api_is_reported_after_bounded_retries(tpu_api):
    url = tpu_api.endpoint
    tpu_api.stop()
    with pytest.raises(TpuLaunchError) as info:
        check_node(ref_for(job_tpu()), job_tpu(), api_endpoint=url, attempts=2, **FAST)
    assert info.value.exit_code == ExitCode.CLUSTER
    assert "after 2 tries: cannot connect to the TPU API" in info.value.message


def test_endpoint_from_the_environment_variable(tpu_api, monkeypatch):
    tpu_api.set_node("my-tpu")
    monkeypatch.setenv("TPULAUNCH_TPU_API_ENDPOINT", tpu_api.endpoint)
    assert check_node(ref_for(job_tpu()), job_tpu()).usable
    assert tpu_api.node_requests("my-tpu") == 1


# ----------------------------------------------------------------------------------------- TensorFlow


def test_cluster_resolver_lists_every_worker_of_the_node(tpu_api):
    tpu_api.set_node("my-tpu", accelerator_type="v3-32", hosts=4)
    resolver = cluster_resolver(ref_for(job_tpu(type="v3-32")), tpu_api.discovery_url)
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["10.0.0.2:8470", "10.0.0.3:8470", "10.0.0.4:8470", "10.0.0.5:8470"]}
    assert resolver.master() == "grpc://10.0.0.2:8470"


# ----------------------------------------------------------------------------------------- watch_node


def test_watch_reports_preemption_and_recovery(tpu_api):
    tpu_api.set_node("my-tpu")
    tpu_api.play("my-tpu", [(0.4, "PREEMPTED", None), (0.9, "READY", "HEALTHY")])
    changes, done = [], threading.Event()

    def on_change(status):
        changes.append((status.state, status.health))
        if len(changes) == 3:
            done.set()

    watch = watch_node(ref_for(job_tpu()), 0.05, on_change, api_endpoint=tpu_api.endpoint)
    try:
        assert done.wait(10)
    finally:
        watch.stop(timeout=5)
    assert changes == [("READY", "HEALTHY"), ("PREEMPTED", None), ("READY", "HEALTHY")]
    assert not watch.running
    polls = tpu_api.node_requests("my-tpu")
    time.sleep(0.2)
    assert tpu_api.node_requests("my-tpu") == polls  # stopped means no more requests


def test_watch_keeps_polling_through_api_errors(tpu_api):
    tpu_api.set_node("my-tpu")
    first, errored = threading.Event(), threading.Event()
    watch = watch_node(ref_for(job_tpu()), 0.05, lambda s: first.set(), api_endpoint=tpu_api.endpoint)
    try:
        assert first.wait(10)
        tpu_api.fail_next(3, 503)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not errored.is_set():
            if watch.last_error is not None:
                errored.set()
            time.sleep(0.01)
        assert errored.is_set()
        while time.monotonic() < deadline and watch.last_error is not None:
            time.sleep(0.01)
        assert watch.last_error is None and watch.last.state == "READY"
    finally:
        watch.stop(timeout=5)


# ----------------------------------------------------------------------------------------- the status command

JOB = textwrap.dedent("""\
    name: status-demo
    model:
      builder: tpulaunch.models.cnn:build
      loss: sparse_categorical_crossentropy
    data:
      train: gs://bucket/train-*.tfrecord
      features:
        image: {shape: [32, 32, 3]}
      labels:
        label: {shape: [], dtype: int64}
    {tpu}
    train: {batch_size: 64, steps: 10}
    run: {model_dir: gs://bucket/runs/demo}
    """)
TPU_SECTION = "tpu: {name: my-tpu, zone: us-central1-a, project: test-project, type: v3-8}"


@pytest.fixture
def run_status(tpu_api, monkeypatch, tmp_path):
    from tpulaunch.cli.app import cli
    monkeypatch.setenv("TPULAUNCH_TPU_API_ENDPOINT", tpu_api.endpoint)
    monkeypatch.setenv("NO_COLOR", "1")

    def run(*args, tpu=TPU_SECTION):
        job = tmp_path / "job.yaml"
        job.write_text(JOB.replace("{tpu}", tpu))
        return CliRunner().invoke(cli, ["status", str(job), *args], terminal_width=200)

    return run


def test_status_text_for_a_healthy_node(run_status, tpu_api):
    tpu_api.set_node("my-tpu", hosts=1)
    result = run_status()
    assert result.exit_code == 0, result.output
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    assert lines == [
        "TPU my-tpu",
        "zone / project us-central1-a / test-project",
        "state READY",
        "health HEALTHY",
        "type v3-8 (job: v3-8)",
        "devices / hosts 8 / 1",
        f"runtime tpu-vm-tf-2.15.0-se (installed TensorFlow: {TF})",
        "endpoints 10.0.0.2:8470",
        "TPU node my-tpu: usable",
        # and who holds model_dir: this machine has no Google Cloud credentials to read a gs:// lease with
        "model_dir lease (gs://bucket/runs/demo): unknown (no Google Cloud credentials to read "
        "gs://bucket/runs/demo/tpulaunch.lease)",
        "last run: unknown (no Google Cloud credentials to read gs://bucket/runs/demo/tpulaunch-runs.jsonl)",
        # the same store as the lease's: not read again (no second wait)
        "remote run: unknown (no Google Cloud credentials to read gs://bucket/runs/demo/tpulaunch.lease)",
    ]


def test_status_json_and_cluster_exit_code_for_a_preempted_node(run_status, tpu_api):
    tpu_api.set_node("my-tpu", state="PREEMPTED", health=None)
    result = run_status("--format", "json", "--wait", "30")
    assert result.exit_code == ExitCode.CLUSTER, result.output
    doc = json.loads(result.stdout)
    assert doc["file"].endswith("job.yaml")
    doc.pop("file"), doc.pop("waited_s")
    assert doc == {
        "name": "my-tpu", "zone": "us-central1-a", "project": "test-project", "state": "PREEMPTED", "health": None,
        "accelerator_type": "v3-8", "expected_type": "v3-8", "devices": 8, "hosts": 1, "runtime_version": "tpu-vm-tf-2.15.0-se",
        "installed_tf": TF, "endpoints": ["10.0.0.2:8470"], "api_version": "V2", "usable": False,
        "findings": [{"severity": "error", "code": "node-not-running", "message": "TPU node 'my-tpu' is PREEMPTED",
                      "hint": "a preempted node must be recreated: `tpulaunch down JOB.yaml` then `tpulaunch up "
                              "JOB.yaml` (or train with --auto-resume N --recreate, which does both)"}],
        "lease": {"model_dir": "gs://bucket/runs/demo", "state": "unknown", "holder": None, "holder_gone": False,
                  "renewed_s_ago": None,
                  "text": "unknown (no Google Cloud credentials to read gs://bucket/runs/demo/tpulaunch.lease)"},
        "last_run": {"state": "unknown", "record": None, "records": 0, "skipped": [],
                     "text": "unknown (no Google Cloud credentials to read gs://bucket/runs/demo/tpulaunch-runs.jsonl)"},
        "remote_run": {"text": "unknown (no Google Cloud credentials to read gs://bucket/runs/demo/tpulaunch.lease)"},
    }


def test_status_set_override_and_unknown_node(run_status, tpu_api):
    tpu_api.set_node("my-tpu")
    result = run_status("--set", "tpu.name=other-tpu")
    assert result.exit_code == ExitCode.CLUSTER
    assert "TPU node 'other-tpu' not found in project 'test-project'" in result.stderr
    assert "Traceback" not in result.output


def test_status_of_a_job_without_tpu_runs_locally(run_status):
    result = run_status("--format", "json", tpu="")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert (doc["tpu"], doc["runs"], doc["usable"]) == (None, "locally", True)
    text = run_status(tpu="")
    assert text.exit_code == 0
    assert "runs locally" in text.stdout
