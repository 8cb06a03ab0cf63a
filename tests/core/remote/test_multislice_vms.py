"""Several slices on TPU VMs: one multislice queued resource (`tpu.slices: 2`), created and deleted through the real
google-cloud-tpu against the local Cloud TPU API, its two nodes' hosts running the real startup script, each told its
slice by its VM's tpu-env metadata; the host runner's environment for each (its place in the run, MEGASCALE_*).
`status` of such a job shows each slice's node, and `down` finds the nodes a gone queued resource left.

The startup script runs as in a rehearsal (this machine's Python, nothing installed) with a Python that records how
the script starts the host runner instead of starting it; the runner's own parser and environment then read those
words. No TensorFlow here.
"""

from __future__ import annotations

import json
import os
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpu_api_server import DEFAULT_PROJECT, DEFAULT_ZONE
from tpu_jobs import tpu_job
from tpulaunch.app.lifecycle import delete
from tpulaunch.cli.app import cli
from tpulaunch.errors import ExitCode
from tpulaunch.job.schema import Tpu
from tpulaunch.remote import host
from tpulaunch.remote.startup import render
from tpulaunch.tpu import multislice
from tpulaunch.tpu.lifecycle import Lifecycle, NotReadyInTime, spec_for
from tpulaunch.tpu.node import resolve_node

RECORDING_PYTHON = """#!/bin/bash
# This machine's Python, except that the host runner is not started: its command line is kept on the host's disk.
if [ "$1" = "-m" ] && [ "$2" = "tpulaunch.remote.host" ]; then
  shift 2
  printf '%s\\n' "$@" > "$HOME/host-args"
  exit 0
fi
exec {python} "$@"
"""


def _host_args(disk: str, seconds: float = 60.0) -> list:
    path = Path(disk) / "host-args"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text().splitlines()
        time.sleep(0.1)
    log = Path(disk) / "startup-script.log"
    raise AssertionError(f"the startup script never started the host runner: {log.read_text() if log.exists() else ''}")


def test_two_slices_are_one_queued_resource_whose_hosts_know_their_slice_and_the_run(tpu_api, tmp_path):
    vms = tpu_api.run_vms(str(tmp_path / "vms"), hosts=2)
    python = tmp_path / "python"
    python.write_text(RECORDING_PYTHON.format(python=sys.executable))
    python.chmod(0o755)
    package = tmp_path / "pkg.tar.gz"
    with tarfile.open(package, "w:gz"):
        pass
    script = render(stage=str(tmp_path / "stage.json"), package=str(package), model_dir=str(tmp_path / "model"),
                    requirements=(), rehearsal_python=str(python))
    job_tpu = Tpu(name="multi", zone=DEFAULT_ZONE, project=DEFAULT_PROJECT, type="v5litepod-16", slices=2,
                  runtime_version="v2-alpha-tpuv5-lite", spot=True)
    spec = replace(spec_for(job_tpu, "jax"), metadata=(("startup-script", script),))
    life = Lifecycle(resolve_node(job_tpu), spec, api_endpoint=tpu_api.endpoint, poll_s=0.05)

    life.create(wait_s=60)

    # One queued resource, asking for two nodes by multislice_params instead of a node_id (parsed by the server
    # with the library's own QueuedResource)
    (asked,) = tpu_api.created
    assert asked["queuedResourceId"] == "multi"
    (node_spec,) = asked["queuedResource"]["tpu"]["nodeSpec"]
    assert node_spec["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": "multi"} and "nodeId" not in node_spec
    assert "spot" in asked["queuedResource"]
    # Cloud TPU's names for its nodes, each READY with a VM of its own
    assert life.node_names == ["multi-0", "multi-1"]
    nodes = life.read_nodes()
    assert [node["state"] for node in nodes] == ["READY", "READY"]
    assert len({vm.node for vm in vms.vms.values()}) == 2

    # Each host: its place among the run's 4 hosts (slice after slice), its slice, the coordinator (slice 0's
    # worker 0); its train's $TF_CONFIG and MEGASCALE_* from the host runner's own reading of that command line
    first = nodes[0]["networkEndpoints"][0]
    coordinator = f"{first['ipAddress']}:{first['port']}"
    seen = {}
    for vm in vms.vms.values():
        for vm_host in vm.hosts:
            args = host.arguments(_host_args(vm_host.disk))
            env = host.place_env(args.worker, args.hosts, "every", args.endpoints.split(","), args.slice,
                                 args.slices, args.coordinator)
            config = json.loads(env["TF_CONFIG"])
            seen[args.worker] = (args.slice, args.hosts, config["task"]["index"], config["cluster"]["worker"][0],
                                 len(config["cluster"]["worker"]), env[multislice.SLICE_ID],
                                 env[multislice.NUM_SLICES], env[multislice.COORDINATOR])
    assert seen == {worker: (worker // 2, 4, worker, coordinator, 4, str(worker // 2), "2", coordinator)
                    for worker in range(4)}

    # down: the queued resource and both nodes, and their VMs' processes
    outcome = life.delete(wait_s=30)
    assert outcome.changed
    assert tpu_api.queued_resource("multi") is None
    assert life.read_nodes() == [None, None]
    assert not any(vm_host.running for vm in vms.vms.values() for vm_host in vm.hosts)
    assert not life.delete(wait_s=30).changed


def _slices_job(tmp_path) -> str:
    return str(tpu_job(tmp_path, "type: v5litepod-16\nslices: 2\nruntime_version: v2-alpha-tpuv5-lite",
                       name="slices", run=", engine: jax"))


def test_status_shows_each_slices_node_and_a_lost_one_makes_the_job_unusable(cli_tpu_api, tmp_path):
    job = _slices_job(tmp_path)
    for name in ("my-tpu-0", "my-tpu-1"):
        cli_tpu_api.set_node(name, accelerator_type="v5litepod-16", hosts=4)
        cli_tpu_api.patch_node(name, runtimeVersion="v2-alpha-tpuv5-lite")
    cli_tpu_api.patch_node("my-tpu-1", state="PREEMPTED")

    shown = CliRunner().invoke(cli, ["status", job], catch_exceptions=False)
    assert shown.exit_code == ExitCode.CLUSTER, shown.output
    rows = {line.split()[1]: line.split()[2:5] for line in shown.output.splitlines() if line.startswith(("0 ", "1 "))}
    assert rows == {"my-tpu-0": ["READY", "HEALTHY", "v5litepod-16"],
                    "my-tpu-1": ["PREEMPTED", "HEALTHY", "v5litepod-16"]}
    assert "error: TPU node 'my-tpu-1' is PREEMPTED" in shown.output
    assert "queued resource my-tpu (2 slices): not usable" in shown.output

    cli_tpu_api.delete_node("my-tpu-1")  # gone with its queued resource's recreation under way
    read = CliRunner().invoke(cli, ["status", job, "--format", "json"], catch_exceptions=False)
    assert read.exit_code == ExitCode.CLUSTER, read.output
    answer = json.loads(read.output)
    assert answer["queued_resource"] == "my-tpu" and answer["usable"] is False
    assert [(node["name"], node["state"], node["hosts"]) for node in answer["slices"]] == [
        ("my-tpu-0", "READY", 4), ("my-tpu-1", "NOT_FOUND", 0)]
    assert [finding["code"] for finding in answer["slices"][1]["findings"]] == ["slice-node-missing"]

    cli_tpu_api.delete_node("my-tpu-0")
    none = CliRunner().invoke(cli, ["status", job], catch_exceptions=False)
    assert none.exit_code == ExitCode.CLUSTER, none.output
    assert "queued resource 'my-tpu' of 2 slices (TPU nodes my-tpu-0, my-tpu-1): none of its nodes exists " \
           f"in project '{DEFAULT_PROJECT}', zone '{DEFAULT_ZONE}'" in none.output

    # A queued resource still waiting for capacity has no node yet: its state says so
    cli_tpu_api.stockout(DEFAULT_ZONE)
    job_tpu = Tpu(name="my-tpu", zone=DEFAULT_ZONE, project=DEFAULT_PROJECT, type="v5litepod-16", slices=2,
                  runtime_version="v2-alpha-tpuv5-lite")
    with pytest.raises(NotReadyInTime):  # `up --timeout` running out: the queued resource is left waiting
        Lifecycle(resolve_node(job_tpu), spec_for(job_tpu, "jax"), poll_s=0.05).create(wait_s=0.1)
    waiting = CliRunner().invoke(cli, ["status", job], catch_exceptions=False)
    assert waiting.exit_code == ExitCode.CLUSTER, waiting.output
    assert "queued resource 'my-tpu' of 2 slices (TPU nodes my-tpu-0, my-tpu-1) is WAITING_FOR_RESOURCES in " \
           f"project '{DEFAULT_PROJECT}', zone '{DEFAULT_ZONE}': none of its nodes exists yet" in waiting.output
    # ... and as JSON, for a script: an answer on stdout, the same error
    as_json = CliRunner().invoke(cli, ["status", job, "--format", "json"], catch_exceptions=False)
    assert as_json.exit_code == ExitCode.CLUSTER, as_json.output
    answer = json.loads(as_json.stdout)
    assert answer["usable"] is False and answer["file"] == job
    assert "is WAITING_FOR_RESOURCES in " in answer["error"]["message"] and "--wait" in answer["error"]["hint"]
    assert "none of its nodes exists yet" in as_json.stderr


def test_status_wait_waits_for_a_queued_resource_to_get_its_nodes_and_says_its_state_meanwhile(cli_tpu_api, tmp_path):
    """`status --wait` on a queued resource still waiting for capacity: each pause says the queued resource's state;
    once Cloud TPU creates its nodes (here, at the first pause) they are read and checked as any slice's; a wait
    that runs out says how long it waited."""
    from tpulaunch.app import status as read

    job = _slices_job(tmp_path)
    cli_tpu_api.stockout(DEFAULT_ZONE)
    job_tpu = Tpu(name="my-tpu", zone=DEFAULT_ZONE, project=DEFAULT_PROJECT, type="v5litepod-16", slices=2,
                  runtime_version="v2-alpha-tpuv5-lite")
    with pytest.raises(NotReadyInTime):  # `up --timeout` running out: the queued resource is left waiting
        Lifecycle(resolve_node(job_tpu), spec_for(job_tpu, "jax"), poll_s=0.05).create(wait_s=0.1)

    ran_out = CliRunner().invoke(cli, ["status", job, "--wait", "0.5"], catch_exceptions=False)
    assert ran_out.exit_code == ExitCode.CLUSTER, ran_out.output
    words = "queued resource 'my-tpu' of 2 slices (TPU nodes my-tpu-0, my-tpu-1)"
    assert f"{words} is WAITING_FOR_RESOURCES: waiting (up to " in ran_out.output
    assert f"{words} is WAITING_FOR_RESOURCES in project '{DEFAULT_PROJECT}', zone '{DEFAULT_ZONE}': none of its " \
           "nodes exists yet after waiting 0.5s" in ran_out.output

    told = []

    def capacity_comes(waiting, seconds_left):  # Cloud TPU finds the capacity while status waits
        told.append(waiting)
        for name in ("my-tpu-0", "my-tpu-1"):
            cli_tpu_api.set_node(name, accelerator_type="v5litepod-16", hosts=4)
            cli_tpu_api.patch_node(name, runtimeVersion="v2-alpha-tpuv5-lite")

    checked = read.checked_for_status(job, ())
    nodes, stack = read.slice_nodes_of(checked, read.node_ref(checked), wait_s=60, on_wait=capacity_comes,
                                       poll_s=0.05)
    assert told == [read.Waiting(words, "WAITING_FOR_RESOURCES")]
    assert [(node.name, node.state, node.usable) for node in nodes] == [("my-tpu-0", "READY", True),
                                                                         ("my-tpu-1", "READY", True)]
    assert stack == []


def test_down_finds_and_deletes_the_slices_nodes_a_gone_queued_resource_left(cli_tpu_api, tmp_path):
    job = _slices_job(tmp_path)
    for name in ("my-tpu-0", "my-tpu-1"):
        cli_tpu_api.set_node(name, accelerator_type="v5litepod-16")
    said, out = [], []

    delete(job, (), wait_s=30, say=said.append, out=out.append)

    assert cli_tpu_api.nodes == {}
    assert [line for line in said if line.startswith("deleting")] == [
        "deleting TPU node 'my-tpu-0' (READY)", "deleting TPU node 'my-tpu-1' (READY)"]
    (done,) = out
    assert done.startswith("TPU nodes 'my-tpu-0', 'my-tpu-1' deleted after "), done
    out.clear()
    delete(job, (), wait_s=30, say=said.append, out=out.append)
    assert out == [f"queued resource 'my-tpu' of 2 slices (TPU nodes my-tpu-0, my-tpu-1) does not exist in project "
                   f"'{DEFAULT_PROJECT}', zone '{DEFAULT_ZONE}': nothing to delete"]


def test_status_wait_on_a_queued_resource_that_fails_meanwhile_says_so_at_once(cli_tpu_api, tmp_path):
    """A queued resource that turns FAILED while `status --wait` waits for its nodes will never make them: the wait
    ends at once, saying so (not that it waited the whole wait, nor to wait longer)."""
    from tpulaunch.app import status as read
    from tpulaunch.tpu import api

    job = _slices_job(tmp_path)
    cli_tpu_api.stockout(DEFAULT_ZONE)
    job_tpu = Tpu(name="my-tpu", zone=DEFAULT_ZONE, project=DEFAULT_PROJECT, type="v5litepod-16", slices=2,
                  runtime_version="v2-alpha-tpuv5-lite")
    with pytest.raises(NotReadyInTime):
        Lifecycle(resolve_node(job_tpu), spec_for(job_tpu, "jax"), poll_s=0.05).create(wait_s=0.1)

    def it_fails(waiting, seconds_left):  # Cloud TPU gives the queued resource up while status waits
        with cli_tpu_api._lock:
            for resource in cli_tpu_api.queued.values():
                resource["state"] = {"state": "FAILED"}

    checked = read.checked_for_status(job, ())
    began = time.monotonic()
    with pytest.raises(api.NodeNotFound) as failed:
        read.slice_nodes_of(checked, read.node_ref(checked), wait_s=600, on_wait=it_fails, poll_s=0.05)
    assert time.monotonic() - began < 60
    assert "is FAILED in project" in str(failed.value) and "after waiting" not in str(failed.value)
    assert "--wait" not in failed.value.hint and "tpulaunch down" in failed.value.hint
