"""`tpulaunch rehearse` end to end, with real processes: the controller (the CLI in a process of its own), the
local Cloud TPU API, TPU VMs as local processes running the node's startup script, and on them `tpulaunch
train` of the quickstart CNN on this machine's CPU (the job: `tests/rehearsals.py`). Reruns in the same
model_dir, and the job's own failure on the VM (not retried; the failed run the first rerun follows):
`test_rerun.py`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rehearsals import rehearsal_env as _env, rehearse, run_record as _record, synth_data, write_job

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return synth_data(tmp_path_factory.mktemp("quickstart"))


@pytest.fixture
def job(data, tmp_path) -> Path:
    return write_job(data / tmp_path.name)


def test_preempted_vm_is_recreated_and_the_run_finishes_with_no_step_lost_beyond_its_checkpoint(job):
    done = rehearse(job, "--preempt-at", "12", "--recreate", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    record = _record(job)
    assert (record["outcome"], record["final_step"], len(record["vms"])) == ("done", 20, 2)
    (recovery,) = record["recoveries"]
    assert recovery["cause"] == "PREEMPTED" and recovery["step"] >= 12
    # The new VM resumed from the newest checkpoint the lost one saved: nothing beyond it was lost.
    assert recovery["resumed_from"] == recovery["checkpoint_step"] == 5 * (recovery["step"] // 5)
    assert recovery["steps_lost"] == recovery["step"] - recovery["checkpoint_step"]
    assert recovery["lease_released"] is True  # the new VM took model_dir's lease at once
    lease = json.loads((job.parent / "runs/q/tpulaunch.lease").read_text())
    assert lease["took_over"] is None
    assert "rehearsal | preempted TPU node 'rehearsal-tpu' at step" in done.stderr
    for vm in record["vms"]:  # each VM's install, as its chief's status says (a rehearsal's: from nowhere)
        chief = json.loads((job.parent / f"runs/q/tpulaunch-remote/attempts/{vm['vm']}/worker-0.json").read_text())
        assert vm["install_s"] == round(chief["installed"] - chief["booted"], 3) and "installed_from" not in vm
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("run | done | step 20/20 | 2 VMs | 1 recovery (PREEMPTED at step"), last
    assert f"resumed from step {recovery['resumed_from']}" in last
    assert (job.parent / "runs/q/model.ckpt-20.index").exists()
    assert "train | start | step 0/20" in (job.parent / "runs/q/tpulaunch-remote/attempts/1/worker-0.log").read_text()


def test_a_killed_controller_rerun_reattaches_without_creating_a_second_vm(job, tpu_api, tmp_path):
    tpu_api.run_vms(str(tmp_path / "vms"))
    tpu_api.stockout("us-central1-a")  # the node is made in the second zone: the rerun must look for it there
    env = {"TPULAUNCH_TPU_API_ENDPOINT": tpu_api.endpoint}
    zones = ("--set", "tpu.zones=[us-central1-a, us-central1-b]")
    first = subprocess.Popen([sys.executable, "-m", "tpulaunch", "rehearse", str(job), *zones], cwd=job.parent,
                             env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    reached = threading.Event()

    def read():
        for line in first.stdout:
            seen.append(line)
            if line.startswith("train | step 3/20"):
                reached.set()
    threading.Thread(target=read, daemon=True).start()
    try:
        assert reached.wait(180), "".join(seen)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    again = rehearse(job, *zones, **env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "reattached to TPU node 'rehearsal-tpu' (READY), VM 1 of the run" in again.stderr
    # one VM, created by the first controller in the second zone after the first refused it
    assert len(tpu_api.created) == 2 and list(tpu_api.nodes) == []  # (deleted when the run ended)
    assert [vm["zone"] for vm in _record(job)["vms"]] == ["us-central1-b"]
    assert again.stdout.strip().splitlines()[-1].startswith("run | done | step 20/20 | 1 VM |")
    assert _record(job)["outcome"] == "done"


def test_a_two_host_slice_preempted_is_recreated_and_finishes_at_exactly_its_steps(job):
    # The estimator engine's hosts: worker 0 trains (its session drives the slice), worker 1 runs nothing.
    done = rehearse(job, "--set", "tpu.type=v4-16", "--hosts", "2", "--preempt-at", "7", "--recreate", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    record = _record(job)
    assert (record["outcome"], record["final_step"], len(record["vms"])) == ("done", 20, 2)
    (recovery,) = record["recoveries"]
    assert recovery["resumed_from"] == recovery["checkpoint_step"] == 5 * (recovery["step"] // 5)
    assert recovery["lease_released"] is True
    assert "on each of its 2 hosts; worker 0 trains" in done.stderr
    attempts = job.parent / "runs/q/tpulaunch-remote/attempts"
    for vm in (1, 2):
        other = json.loads((attempts / str(vm) / "worker-1.json").read_text())
        assert (other["role"], other["hosts"], other["exit_code"]) == ("none", 2, 0)
        assert not (attempts / str(vm) / "worker-1.log").exists()
    lease = json.loads((job.parent / "runs/q/tpulaunch.lease").read_text())
    assert lease["took_over"] is None  # the chief alone held it, and the controller released the lost one's
    assert done.stdout.strip().splitlines()[-1].startswith("run | done | step 20/20 | 2 VMs | 1 recovery")


def test_a_host_whose_install_fails_is_named_with_its_output_and_the_vm_removed(job):
    failed = rehearse(job, "--set", "tpu.type=v4-16", "--recreate", "2", TPULAUNCH_LOCAL_VM_FAIL_INSTALL="1")
    assert failed.returncode == 3, failed.stdout + failed.stderr
    assert "error: worker 1 of TPU node 'rehearsal-tpu' (VM 1 of the run) failed while installing" in failed.stderr
    assert "not retried" in failed.stderr
    # the end of its startup output, as pip would say it, and where the whole of it is
    assert "ERROR: tpulaunch-rehearsal-missing-package is not installed" in failed.stderr
    startup_log = job.parent / "runs/q/tpulaunch-remote/attempts/1/worker-1.startup.log"
    assert str(startup_log) in failed.stderr and "tpulaunch-rehearsal-missing-package" in startup_log.read_text()
    # the hosts' output and statuses, as the stage, are this user's alone (they may quote the job's output)
    remote = job.parent / "runs/q/tpulaunch-remote"
    assert {str(path.relative_to(remote)): oct(path.stat().st_mode & 0o777) for path in remote.rglob("*")
            if path.is_file() and path.stat().st_mode & 0o077} == {}
    assert "deleting TPU node 'rehearsal-tpu': the run is over" in failed.stderr
    record = _record(job)
    assert record["outcome"].startswith("failed: worker 1: installing") and len(record["vms"]) == 1


def test_a_node_left_on_an_error_path_is_named_with_the_command_that_removes_it(job, tpu_api, tmp_path):
    tpu_api.run_vms(str(tmp_path / "vms"), fail_install=[0])
    failed = rehearse(job, "--keep-tpu", TPULAUNCH_TPU_API_ENDPOINT=tpu_api.endpoint)
    assert failed.returncode == 3, failed.stdout + failed.stderr
    assert "worker 0 of TPU node 'rehearsal-tpu' (VM 1 of the run) failed while installing" in failed.stderr
    assert "left: TPU node 'rehearsal-tpu' (READY) in us-central1-a" in failed.stderr
    assert f"hint: `tpulaunch down {job}` removes it" in failed.stderr
    assert len(tpu_api.nodes) == 1


def test_a_stockout_in_the_first_zone_moves_the_run_to_the_second(job):
    done = rehearse(job, "--set", "tpu.zones=[us-central1-a, us-central1-b]", "--set", "train.steps=5",
                    TPULAUNCH_LOCAL_API_STOCKOUT="us-central1-a")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tpu | no TPU in us-central1-a (on-demand): no capacity" in done.stderr
    assert "trying us-central1-b (on-demand) next" in done.stderr
    record = _record(job)
    assert (record["zone"], record["vms"][0]["zone"], record["outcome"], record["final_step"]) == (
        "us-central1-b", "us-central1-b", "done", 5)


def test_a_host_that_never_starts_is_named_within_the_host_timeout(job):
    failed = rehearse(job, "--set", "tpu.type=v4-16", "--host-timeout", "5", TPULAUNCH_LOCAL_VM_HANG="1")
    assert failed.returncode == 3, failed.stdout + failed.stderr
    assert "a host did not start within 5 s (--host-timeout): " in failed.stderr
    assert ("worker 1 wrote no status (it did not run its startup script, or the VM's service account cannot "
            "write") in failed.stderr
    assert "--recreate is 0" in failed.stderr and f"`tpulaunch down {job}`" in failed.stderr


CONN = "postgres://me:c0nn-pw@db.internal/x"  # under a key that does not look secret
TOKEN = "tok-3f9a1c7e-never-written"


def test_a_secret_reaches_the_builder_from_secret_manager_and_is_written_nowhere(job, tpu_api, tmp_path):
    # A key that looks secret, and one that does not: each value came from a ${VAR}, so both are secrets.
    text = job.read_text().replace("builder: slow_models:build", "builder: slow_models:with_token").replace(
        "params: {num_classes: 10}", 'params: {num_classes: 10, api_token: "${API_TOKEN}", conn: "${DB_CONN}"}')
    job.write_text(text)
    secrets = tmp_path / "secrets"  # stands for Secret Manager: the file API_TOKEN is secret API_TOKEN
    secrets.mkdir()
    missing = rehearse(job, "--secrets", str(secrets), "--set", "train.steps=3")
    assert missing.returncode == 1, missing.stdout + missing.stderr
    assert "${API_TOKEN} is read on the TPU VM from secret API_TOKEN, which does not exist" in missing.stderr
    assert "job.yaml:4:" in missing.stderr and "add the file API_TOKEN to --secrets DIR" in missing.stderr
    assert not (job.parent / "runs").exists()  # nothing staged, nothing created

    (secrets / "API_TOKEN").write_text(TOKEN)
    (secrets / "DB_CONN").write_text(CONN)
    tpu_api.secrets_from(str(secrets))
    tpu_api.run_vms(str(tmp_path / "vms"))  # this server's VMs keep their disks after the run, to be searched
    done = rehearse(job, "--set", "train.steps=3", TPULAUNCH_TPU_API_ENDPOINT=tpu_api.endpoint,
                    TPULAUNCH_SECRET_MANAGER_URL=tpu_api.secret_manager_url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "secrets | the VM reads API_TOKEN, DB_CONN from Secret Manager (project 'test-project')" in done.stderr
    import hashlib

    assert f"builder | api_token sha256 {hashlib.sha256(TOKEN.encode()).hexdigest()}" in done.stdout
    assert f"builder | conn sha256 {hashlib.sha256(CONN.encode()).hexdigest()}" in done.stdout
    assert TOKEN not in done.stdout + done.stderr and CONN not in done.stdout + done.stderr
    files = [path for root in (job.parent / "runs", tmp_path / "vms") for path in root.rglob("*") if path.is_file()]
    assert any(path.name == "startup-script" for path in files) and any(p.name == "worker-0.log" for p in files)
    assert any(path.name == "tpulaunch-job.yaml" for path in files) and any(p.name == "run.json" for p in files)
    assert [path for path in files if TOKEN.encode() in path.read_bytes() or CONN.encode() in path.read_bytes()] == []
    node = tpu_api.created[0]["node"]
    assert TOKEN not in json.dumps(node["metadata"]) and CONN not in json.dumps(node["metadata"])
    stage = job.parent / "runs/q/tpulaunch-remote/stages"
    manifest = next(stage.glob("*.json"))
    assert '"API_TOKEN"' in manifest.read_text() and '"DB_CONN"' in manifest.read_text()  # names, no more
    assert manifest.stat().st_mode & 0o777 == 0o600  # the stage's files: this user's alone


@pytest.fixture(scope="module")
def preempted_at_7(data) -> tuple:
    """One rehearsal read by two tests: 10 steps over tpu.zones [us-central1-a, us-central1-b], preempted at step 7
    and recreated in the next zone (--after-preemption next-zone), by a job that logs every 100 steps. (job, the
    finished rehearse)"""
    job = write_job(data / "preempted-at-7")
    done = rehearse(job, "--set", "tpu.zones=[us-central1-a, us-central1-b]", "--set", "train.steps=10",
                    "--preempt-at", "7", "--recreate", "1", "--after-preemption", "next-zone",
                    "--set", "run.log_every_steps=100")
    return job, done


def test_after_a_preemption_next_zone_recreates_the_node_in_the_next_of_tpu_zones(preempted_at_7):
    job, done = preempted_at_7
    assert done.returncode == 0, done.stdout + done.stderr
    assert "trying us-central1-b (on-demand) first (--after-preemption next-zone)" in done.stderr
    record = _record(job)
    assert [vm["zone"] for vm in record["vms"]] == ["us-central1-a", "us-central1-b"]
    assert (record["zone"], record["outcome"], record["final_step"]) == ("us-central1-b", "done", 10)
    (recovery,) = record["recoveries"]
    assert recovery["cause"] == "PREEMPTED" and recovery["resumed_from"] == 5


def test_preempt_at_lands_at_its_step_whatever_the_jobs_log_cadence(preempted_at_7):
    """A job that logs every 100 steps is preempted at step 7 of its own count (the chief holds there until the
    rehearsal preempts it), not at the next log line after it."""
    job, done = preempted_at_7
    assert done.returncode == 0, done.stdout + done.stderr
    (recovery,) = _record(job)["recoveries"]
    assert recovery["step"] == 7 and recovery["resumed_from"] == recovery["checkpoint_step"] == 5
    first = (job.parent / "runs/q/tpulaunch-remote/attempts/1/worker-0.log").read_text()
    assert "train | step 7/10 | held here: the rehearsal preempts now" in first
    assert "train | step 8/10" not in first
    assert "rehearsal | preempted TPU node 'rehearsal-tpu' at step 7:" in done.stderr
