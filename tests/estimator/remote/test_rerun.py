"""Reruns of `tpulaunch rehearse` in the same model_dir, end to end (the job and its helpers:
`tests/rehearsals.py`): the job's own failure on the VM is not retried; each run reads only its own VMs' files,
so a rerun after that failure and a fix trains and a rerun with more steps trains on; an orphan VM left training
by a killed follower is stopped before the rerun's VM starts; model_dir's lease held by another run is
contention, never the job's own failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from rehearsals import checkpoint_step, rehearse, run_record, started, synth_data, write_job

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return synth_data(tmp_path_factory.mktemp("quickstart"))


@pytest.fixture
def job(data, tmp_path) -> Path:
    return write_job(data / tmp_path.name)


@pytest.fixture(scope="module")
def failed_run(data) -> tuple:
    """The job failing on its VM by its own fault (a builder that raises), rehearsed with --recreate 2: one run
    read by two tests, the failure not retried and the rerun after the fix in the same model_dir. (job, the
    finished rehearse, run.json as that run left it)"""
    job = write_job(data / "failed-then-fixed")
    failed = rehearse(job, "--recreate", "2", "--set", "model.builder=slow_models:broken", "--set", "train.steps=5")
    return job, failed, run_record(job)


def test_the_jobs_own_failure_on_the_vm_is_not_retried(failed_run):
    # (train.steps=5: the builder fails before the first step, whatever the steps.)
    _, failed, record = failed_run
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "this builder is broken on purpose" in failed.stderr
    assert "not retried" in failed.stderr
    assert (record["outcome"], len(record["vms"]), record["recoveries"]) == ("failed: exit code 1: the job failed", 1, [])


def test_a_rerun_in_the_same_model_dir_trains_after_a_fix_and_trains_on_with_more_steps(failed_run):
    # Each run reads only the files its own VMs wrote: not the failed run's status, not the shorter run's end.
    job, failed, _ = failed_run
    assert failed.returncode == 1, failed.stdout + failed.stderr
    fixed = rehearse(job, "--set", "train.steps=5")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "this builder is broken on purpose" not in fixed.stdout + fixed.stderr  # not the failed run's lines
    assert fixed.stdout.strip().splitlines()[-1].startswith("run | done | step 5/5 | 1 VM |")
    assert checkpoint_step(job) == 5
    more = rehearse(job, "--set", "train.steps=10")
    assert more.returncode == 0, more.stdout + more.stderr
    assert "train | start | step 5/10" in more.stdout  # on from the shorter run's checkpoint
    assert more.stdout.count("train | start |") == 1  # its own VM's lines only
    assert more.stdout.strip().splitlines()[-1].startswith("run | done | step 10/10 | 1 VM |")
    assert checkpoint_step(job) == 10
    # three runs, three VMs, each with its own attempt folder
    assert [vm["vm"] for vm in run_record(job)["vms"]] == [3]
    attempts = job.parent / "runs/q/tpulaunch-remote/attempts"
    assert sorted(p.name for p in attempts.iterdir()) == ["1", "2", "3"]


def test_a_rerun_after_the_follower_was_killed_stops_its_orphan_vm_and_trains_the_job(job, tmp_path):
    hold = tmp_path / "hold"  # while it exists, the job's steps from the 6th on wait: the orphan stays mid-run
    hold.touch()
    env = {"TMPDIR": str(tmp_path), "REHEARSAL_HOLD": str(hold)}  # TMPDIR: the killed rehearsal's VM disks
    held = ("--set", "model.builder=slow_models:held")
    first, lines, reached = started(job, *held, until="train | step 3/20", **env)
    try:
        assert reached.wait(180) and any(line.startswith("train | step 3/20") for line in lines), "".join(lines)
    finally:
        first.send_signal(signal.SIGKILL)  # the follower and its local TPU API die; its VM trains on, an orphan
        first.wait()
    status = job.parent / "runs/q/tpulaunch-remote/attempts/1/worker-0.json"
    orphan = json.loads(status.read_text())
    assert orphan["phase"] == "training"
    again = None
    try:
        again, lines, stopping = started(job, *held, until="tpu | VM 1 of an earlier run still trains", **env)
        assert stopping.wait(180), "".join(lines)
        hold.unlink()  # the orphan's step ends: it can act on the SIGTERM it was sent
        assert again.wait(300) == 0, "".join(lines)
        said = "".join(lines)
        assert (f"tpu | VM 1 of an earlier run still trains in run.model_dir (train pid {orphan['train_pid']}"
                in said and "stopping it before this run's VM starts" in said), said
        assert "a failure of the job's own" not in said
        assert json.loads(status.read_text())["exit_code"] == 143  # SIGTERM: a checkpoint saved, the lease released
        assert "run | done | step 20/20 | 2 VMs |" in said, said
        assert (run_record(job)["outcome"], run_record(job)["final_step"], checkpoint_step(job)) == ("done", 20, 20)
        log = (job.parent / "runs/q/tpulaunch-remote/attempts/2/worker-0.log").read_text()
        assert "train | start | step 0/20" not in log  # on from the orphan's checkpoint
    finally:  # on a failure: the rerun stopped (Ctrl-C ends its VMs), the orphan's host killed if it runs still
        if hold.exists():
            hold.unlink()
        if again is not None and again.poll() is None:
            again.send_signal(signal.SIGINT)
            again.wait(60)
        if json.loads(status.read_text()).get("phase") != "ended":
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(orphan["train_pid"]), signal.SIGKILL)


def test_a_model_dir_another_run_writes_refuses_the_run_before_a_vm_is_created(job):
    # A live run of this host (this test's own process) holds run.model_dir's lease, as a `train` there would.
    lease = job.parent / "runs/q/tpulaunch.lease"
    lease.parent.mkdir(parents=True)
    now = time.time()
    lease.write_text(json.dumps({"state": "held", "host": socket.gethostname(), "pid": os.getpid(), "run_id": "by-hand",
                                 "command": "train", "started": now, "renewed": now, "renew_every_s": 30.0,
                                 "stale_after_s": 600.0, "took_over": None}))
    refused = rehearse(job)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert (f"error: run.model_dir {job.parent / 'runs/q'} is in use: train by host {socket.gethostname()}, pid "
            f"{os.getpid()}, run by-hand holds its lease") in refused.stderr
    assert "nothing was created" in refused.stderr and "the job's own" not in refused.stderr
    assert "creating TPU node" not in refused.stderr
    assert not (job.parent / "runs/q/tpulaunch-remote/attempts").exists()
    assert run_record(job)["outcome"].startswith("failed: contention: run.model_dir held by host")


def test_a_recreated_vm_refused_the_lease_by_another_run_is_contention_not_the_jobs_failure(job):
    lease = job.parent / "runs/q/tpulaunch.lease"
    run, lines, preempted = started(job, "--preempt-at", "4", "--recreate", "1", until="rehearsal | preempted")
    try:
        assert preempted.wait(180) and any(line.startswith("rehearsal | preempted") for line in lines), "".join(lines)
        # Another run takes model_dir as the first VM is lost (this test's process, live on this host), before the
        # recreated VM boots.
        now = time.time()
        taken = lease.with_name("lease.by-hand")
        taken.write_text(json.dumps({"state": "held", "host": socket.gethostname(), "pid": os.getpid(),
                                     "run_id": "by-hand", "command": "train", "started": now, "renewed": now,
                                     "renew_every_s": 30.0, "stale_after_s": 600.0, "took_over": None}))
        taken.replace(lease)
        assert run.wait(300) == 3, "".join(lines)
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
            run.wait(60)
    said = "".join(lines)
    assert (f"error: VM 2 of the run could not train (worker 0, exit code 1): run.model_dir's lease is held by train "
            f"by host {socket.gethostname()}, pid {os.getpid()}, run by-hand") in said, said
    assert "not a failure of the job's own" in said and "a failure of the job's own is not" not in said
    assert run_record(job)["outcome"].startswith("failed: contention: run.model_dir held by train by host")
