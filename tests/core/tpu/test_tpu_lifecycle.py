"""`tpulaunch up` / `down` / `status` through the Cloud TPU API v2, end to end against a local server.

The real google-cloud-tpu (REST transport) talks to tests/tpu_api_server.py, named by
$TPULAUNCH_TPU_API_ENDPOINT as a user would; the server parses every create body with the library's
own message types, and finishes long-running operations after a number of requests, not after a sleep.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpu_api_server import DEFAULT_PROJECT, DEFAULT_ZONE
from tpu_jobs import tpu_job
from tpulaunch.cli.app import cli
from tpulaunch.errors import ExitCode
from tpulaunch.job.schema import Tpu
from tpulaunch.tpu import lifecycle
from tpulaunch.tpu.node import resolve_node
from tpulaunch.tpu.prices import hourly, price_text

FULL = f"projects/{DEFAULT_PROJECT}/locations/{DEFAULT_ZONE}/nodes/my-tpu"


def job_file(tmp_path: Path, tpu: str = "type: v3-8", runtime: str = "tpu-vm-tf-2.15.1-se") -> Path:
    return tpu_job(tmp_path, f"runtime_version: {runtime}\n{tpu}", name="lifecycle")


@pytest.fixture
def api(tpu_api, monkeypatch):
    monkeypatch.setenv("TPULAUNCH_TPU_API_ENDPOINT", tpu_api.endpoint)
    return tpu_api


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_up_creates_the_node_as_the_job_says_then_says_so_on_a_rerun_and_down_is_idempotent(api, tmp_path):
    job = str(job_file(tmp_path, "type: v3-8\n          network: my-vpc"))

    first = run("up", job)
    assert first.exit_code == 0, first.output
    assert f"creating TPU node 'my-tpu' (v3-8, on-demand, tpu-vm-tf-2.15.1-se) as a node in project " \
           f"'{DEFAULT_PROJECT}', zone '{DEFAULT_ZONE}'" in first.output
    assert "TPU node 'my-tpu' is READY after " in first.output
    assert "cost: about $8.00/hour (on-demand list price in us-central1, " in first.output
    # What was asked of the API, as the library sent it (parsed by the server with tpu_v2.Node).
    assert api.created == [{"nodeId": "my-tpu", "node": {
        "acceleratorType": "v3-8", "runtimeVersion": "tpu-vm-tf-2.15.1-se", "labels": {"created-by": "tpulaunch"},
        "schedulingConfig": {}, "networkConfig": {"network": "my-vpc"}}}]
    assert ("POST", f"/v2/projects/{DEFAULT_PROJECT}/locations/{DEFAULT_ZONE}/nodes?nodeId=my-tpu"
                    "&%24alt=json%3Benum-encoding%3Dint") in api.requests
    assert api.nodes[FULL]["state"] == "READY"

    again = run("up", job)
    assert again.exit_code == 0, again.output
    assert "TPU node 'my-tpu' is already READY: nothing to create" in again.output
    assert len(api.created) == 1

    down = run("down", job)
    assert down.exit_code == 0, down.output
    assert "deleting TPU node 'my-tpu' (READY)" in down.output
    assert "TPU node 'my-tpu' deleted after " in down.output
    assert FULL not in api.nodes

    gone = run("down", job)
    assert gone.exit_code == 0, gone.output
    assert gone.output.strip().endswith(
        f"TPU node 'my-tpu' does not exist in project '{DEFAULT_PROJECT}', zone '{DEFAULT_ZONE}': nothing to delete")


def test_a_v5e_spot_node_is_asked_for_as_a_spot_queued_resource_and_down_removes_both(api, tmp_path):
    # v5e runs TensorFlow only under PJRT (no -se image): a keras-engine job.
    job = str(job_file(tmp_path, "type: v5litepod-8\n          spot: true", runtime="tpu-vm-tf-2.18.0-pjrt"))
    up = run("up", job, "--set", "run.engine=keras")
    assert up.exit_code == 0, up.output
    assert "as a queued resource" in up.output
    assert "cost: price unknown (spot prices are not in tpulaunch's table" in up.output
    assert api.created == [{"queuedResourceId": "my-tpu", "queuedResource": {
        "tpu": {"nodeSpec": [{"parent": f"projects/{DEFAULT_PROJECT}/locations/{DEFAULT_ZONE}", "nodeId": "my-tpu",
                              "node": {"acceleratorType": "v5litepod-8", "runtimeVersion": "tpu-vm-tf-2.18.0-pjrt",
                                       "labels": {"created-by": "tpulaunch"}}}]},
        "spot": {}}}]
    assert api.queued_resource("my-tpu")["state"] == {"state": "ACTIVE"}

    down = run("down", job)
    assert down.exit_code == 0, down.output
    assert "deleting queued resource 'my-tpu' and its TPU node" in down.output
    assert api.queued_resource("my-tpu") is None and FULL not in api.nodes


def test_a_stockout_exits_4_leaves_nothing_behind_and_a_rerun_succeeds(api, tmp_path):
    job = str(job_file(tmp_path))
    api.fail_create_operation(1)

    stockout = run("up", job)
    assert stockout.exit_code == ExitCode.NO_CAPACITY == 4, stockout.output
    assert (f"error: no capacity creating TPU node 'my-tpu' in project '{DEFAULT_PROJECT}', zone '{DEFAULT_ZONE}': "
            f'There is no more capacity in the zone "{DEFAULT_ZONE}"') in stockout.output
    assert "left behind" not in stockout.output and FULL not in api.nodes

    retry = run("up", job)
    assert retry.exit_code == 0, retry.output
    assert api.nodes[FULL]["state"] == "READY"


def test_permission_denied_is_one_message_with_exit_code_3(api, tmp_path):
    api.fail_next(1, 403, target="create", message="Permission 'tpu.nodes.create' denied on 'projects/test-project'")
    result = run("up", str(job_file(tmp_path)))
    assert result.exit_code == ExitCode.CLUSTER == 3, result.output
    assert "error: permission denied creating TPU node 'my-tpu' in project 'test-project', zone 'us-central1-a': " \
           in result.output
    assert "Permission 'tpu.nodes.create' denied" in result.output
    assert "hint: the account needs roles/tpu.admin" in result.output
    assert "Traceback" not in result.output and FULL not in api.nodes


def test_an_unknown_zone_is_located_at_tpu_zone_in_the_job_file(api, tmp_path):
    path = job_file(tmp_path)
    api.fail_next(1, 400, target="create", message="Invalid value for field 'parent': zone 'us-central1-z' is unknown")
    result = run("up", str(path))
    assert result.exit_code == ExitCode.PROBLEMS == 1, result.output
    zone_line = path.read_text().splitlines().index(f"  zone: {DEFAULT_ZONE}") + 1
    assert f"{path}:{zone_line}:" in result.output
    assert "zone 'us-central1-z' is unknown" in result.output
    assert "Traceback" not in result.output


def test_an_unknown_type_is_refused_before_the_api_is_asked(api, tmp_path):
    result = run("up", str(job_file(tmp_path, "type: v3-12")))
    assert result.exit_code == 1, result.output
    assert "v3-12 does not exist" in result.output
    assert not any(method == "POST" for method, _ in api.requests)


def test_a_create_that_does_not_finish_in_time_names_the_half_created_node_and_how_to_remove_it(api, tmp_path):
    job = str(job_file(tmp_path))
    api.create_reads = 10_000  # the node stays CREATING
    result = run("up", job, "--timeout", "0.5")
    assert result.exit_code == ExitCode.CLUSTER, result.output
    assert "error: TPU node 'my-tpu' was not READY after 0.5 s (it is CREATING); left behind: TPU node 'my-tpu' " \
           "(CREATING)" in result.output
    assert f"hint: `tpulaunch down {job}` removes it (then wait longer with `tpulaunch up --timeout SECONDS`)" \
           in result.output
    # ... and it does.
    assert run("down", job).exit_code == 0 and FULL not in api.nodes


def test_a_create_request_that_times_out_but_was_accepted_is_waited_for_not_duplicated(api, tmp_path):
    api.delay_next(1, 1.5, target="create")  # the server creates the node, then answers too late
    job_tpu = Tpu(name="my-tpu", zone=DEFAULT_ZONE, project=DEFAULT_PROJECT, type="v3-8",
                  runtime_version="tpu-vm-tf-2.15.1-se")
    said = []
    life = lifecycle.Lifecycle(resolve_node(job_tpu, env={}), lifecycle.spec_for(job_tpu, "estimator"), timeout=0.5, poll_s=0.02,
                               on_progress=said.append)
    outcome = life.create(wait_s=30)
    assert outcome.changed and outcome.status.state == "READY"
    assert any("the create request got no answer (the TPU API did not answer in time), but TPU node 'my-tpu' "
               "(CREATING) exists: waiting for it" == line for line in said), said
    assert len(api.created) == 1


def test_status_reads_the_node_through_v2(api, tmp_path):
    api.set_node("my-tpu", tensorflow_version="2.15.1")
    result = run("status", str(job_file(tmp_path)), "--format", "json")
    assert result.exit_code == 0, result.output
    node = json.loads(result.output)
    assert (node["state"], node["health"], node["runtime_version"], node["api_version"], node["usable"]) == (
        "READY", "HEALTHY", "tpu-vm-tf-2.15.1-se", "V2", True)
    assert ("GET", f"/v2/{FULL}?%24alt=json%3Benum-encoding%3Dint") in api.requests
    assert not any(path.startswith("/v1/") for _, path in api.requests)


def test_spot_and_reserved_together_are_a_located_job_file_error(tmp_path):
    result = run("up", str(job_file(tmp_path, "type: v3-8\n          spot: true\n          reserved: true")))
    assert result.exit_code == 1, result.output
    assert "tpu.spot and tpu.reserved exclude each other" in result.output


def test_the_price_table_knows_on_demand_list_prices_only():
    assert hourly("v3-8", "us-central1-a", "on-demand") == 8.0
    assert hourly("v5litepod-16", "us-central1-a", "on-demand") == 19.2
    assert hourly("v3-8", "us-central1-a", "spot") is None
    assert hourly("v3-8", "europe-west4-a", "on-demand") is None
    assert price_text("v3-8", "europe-west4-a", "on-demand").startswith(
        "price unknown (no list price for v3-8 in europe-west4-a in tpulaunch's table")


def test_the_default_runtime_follows_the_installed_tensorflow_and_the_engine():
    assert lifecycle.default_runtime("v3-8", "estimator", "2.15.1") == "tpu-vm-tf-2.15.1-se"
    assert lifecycle.default_runtime("v3-32", "estimator", "2.15.1") == "tpu-vm-tf-2.15.1-pod-se"
    assert lifecycle.default_runtime("v4-8", "keras", "2.16.1") == "tpu-vm-tf-2.16.1-pjrt"
    assert lifecycle.default_runtime("v4-8", "keras", None) is None
    assert [lifecycle.uses_queued_resource(t) for t in ("v3-8", "v4-8", "v5litepod-8", "v5p-8", "v6e-8")] == [
        False, False, True, True, True]
    assert lifecycle.uses_queued_resource("v4-8", True) is True
