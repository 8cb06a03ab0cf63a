"""The lease when its store fails: a full disk leaves no temporary file of the lease behind, and `status` says
within seconds that a gs:// model_dir's bucket cannot be reached (naming it), instead of retrying for minutes."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gcs_fake import free_port
from lease_runs import cli_env
from tpulaunch import store
from tpulaunch.run import lease as leases

JOB = """\
name: tiny
model: {builder: tpulaunch.models.cnn:build, params: {num_classes: 2}}
data:
  train: data/train.tfrecord
  features: {image: {shape: [8, 8, 1]}}
  labels: {label: {shape: [], dtype: int64}}
train: {batch_size: 8, steps: 2}
run: {model_dir: runs/tiny}
"""


@pytest.fixture
def full_disk(tmp_path):
    """(a directory on a full disk, how): a 64 KiB tmpfs filled to the last byte where this machine lets us mount
    one (root); elsewhere a directory whose fsync fails with ENOSPC (what a full disk says at the flush)."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)], capture_output=True).returncode == 0
    if not mounted:
        yield mount_point, "injected"
        return
    try:
        yield mount_point, "tmpfs"
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(directory: Path) -> None:
    fd = os.open(directory / f"filler-{len(list(directory.iterdir()))}", os.O_CREAT | os.O_WRONLY)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def _disk_full(directory: Path, how: str, monkeypatch) -> None:
    if how == "tmpfs":
        _fill(directory)
    else:
        def no_space(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "fsync", no_space)


def _leftovers(directory: Path) -> list:
    return sorted(path.name for path in directory.iterdir() if path.name.startswith(leases.LEASE_FILE + "."))


def test_a_full_disk_leaves_no_temporary_lease_file(full_disk, monkeypatch):
    directory, how = full_disk
    model_dir = directory / "run"
    # A renewal and a release that cannot be written: the lease stays as it was, and no temporary file is left.
    lease = leases.acquire(str(model_dir), run_id="r-1", command="train")
    _disk_full(directory, how, monkeypatch)
    with pytest.raises(OSError) as failed:
        lease.renew()
    assert failed.value.errno == errno.ENOSPC
    with pytest.raises(OSError):
        lease.release()
    assert _leftovers(model_dir) == [], how
    assert leases.read_lease(str(model_dir))["state"] == "held"

    # Taking a lease on a full disk: refused, naming the cause, nothing left behind.
    (model_dir / leases.LEASE_FILE).unlink()
    _disk_full(directory, how, monkeypatch)  # what the lease file held is free again: fill it
    with pytest.raises(leases.LeaseRefused) as refused:
        leases.acquire(str(model_dir), run_id="r-2", command="train")
    assert "No space left on device" in refused.value.message, refused.value.message
    assert _leftovers(model_dir) == [] and not (model_dir / leases.LEASE_FILE).exists(), how


def test_status_says_within_seconds_that_a_gs_bucket_cannot_be_reached(tmp_path):
    """A closed local port stands for an unreachable Cloud Storage: without a timeout the client retries for two
    minutes; `status` answers within the store's timeout for each of its two reads (the lease, the run record) and
    Python's start, naming the bucket."""
    (tmp_path / "job.yaml").write_text(JOB)
    closed = free_port()  # nothing listens there
    env = cli_env(STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{closed}")
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tpulaunch", "status", str(tmp_path / "job.yaml"),
                           "--set", "run.model_dir=gs://far-bucket/runs/tiny"],
                          capture_output=True, text=True, env=env, timeout=120)
    took = time.monotonic() - began
    assert done.returncode == 0, done.stdout + done.stderr
    line = [line for line in done.stdout.splitlines() if line.startswith("model_dir lease ")]
    assert line and line[0].startswith("model_dir lease (gs://far-bucket/runs/tiny): unknown (could not reach Cloud "
                                       "Storage bucket gs://far-bucket to read gs://far-bucket/runs/tiny/"
                                       f"{leases.LEASE_FILE} within {store.TIMEOUT_S:g} s"), done.stdout
    assert "Connection refused" in line[0], line
    last_run = [line for line in done.stdout.splitlines() if line.startswith("last run: ")]
    assert last_run and last_run[0].startswith("last run: unknown (could not reach Cloud Storage bucket gs://far-bucket"), \
        done.stdout
    assert "Traceback" not in done.stderr
    assert took < 2 * store.TIMEOUT_S + 15, took


def test_a_lease_file_removed_under_a_live_run_is_made_again_not_taken_as_a_takeover(tmp_path):
    """model_dir (or the lease file) removed by hand while a run holds it: no other run holds it, so the run is
    not fenced; its next renewal makes the lease again, and a second run is refused as before."""
    model_dir = tmp_path / "run"
    lease = leases.acquire(str(model_dir), run_id="r-1", command="train")
    try:
        (model_dir / leases.LEASE_FILE).unlink()
        lease.ensure_held()  # no LeaseLost
        assert leases.read_lease(str(model_dir))["run_id"] == "r-1"
        for path in model_dir.iterdir():
            path.unlink()
        model_dir.rmdir()
        assert lease.renew() is True and lease.lost is None
        assert leases.read_lease(str(model_dir))["run_id"] == "r-1"
        with pytest.raises(leases.LeaseRefused, match="is in use"):
            leases.acquire(str(model_dir), run_id="r-2", command="train")
    finally:
        lease.release()
    assert leases.read_lease(str(model_dir))["state"] == "released"


HOLD = """import sys, time
from tpulaunch.run import lease
lease.acquire(sys.argv[1], run_id="holder-run", command="train")
print("held", flush=True)
time.sleep(600)
"""


def _held_by_a_child(model_dir: Path) -> subprocess.Popen:
    """A child process that took model_dir's lease and holds it (waited for: it says so)."""
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(model_dir)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(leases.__file__).parents[2])})
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_killed_holder_not_yet_reaped_is_gone_and_its_lease_taken_over_at_once(tmp_path):
    """A train killed with SIGKILL whose parent has not reaped it yet (a zombie: signal 0 still reaches it) holds
    nothing: the next run takes its lease at once, not after the stale time (a JobSet's restarted chief met it)."""
    model_dir = tmp_path / "m"
    child = _held_by_a_child(model_dir)
    child.kill()
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child.pid}/stat").read_bytes().split(b") ")[1][:1] != b"Z":  # the event: it died
        assert time.monotonic() < deadline, "the killed holder never ended"
        time.sleep(0.01)
    try:
        taken = leases.acquire(str(model_dir), run_id="next-run", command="train")
        assert taken.took_over["pid"] == child.pid and taken.took_over["gone"] is True
        taken.release()
    finally:
        child.wait()


def test_a_restarted_jobsets_chief_releases_the_replaced_chiefs_lease_and_only_that(tmp_path):
    """The host runner of a JobSet's restart (attempt 2): the lease of attempt 1's chief (its host and train pid,
    as its status said) is released, so the new train takes it at once; a lease some other run holds is left."""
    from tpulaunch.remote import layout
    from tpulaunch.remote.host import release_replaced_chief

    model_dir = tmp_path / "m"
    child = _held_by_a_child(model_dir)
    try:
        status = layout.host_status(str(model_dir), 1, 0)
        store.write(status, json.dumps({"host": "some-other-pod", "train_pid": child.pid}).encode())
        assert release_replaced_chief(str(model_dir), 2) == ""  # not that holder: left alone
        assert leases.read_lease(str(model_dir))["state"] == "held"
        with pytest.raises(leases.LeaseRefused, match="is in use"):  # what the restarted chief's train met
            leases.acquire(str(model_dir), run_id="restarted", command="train")

        import socket

        store.write(status, json.dumps({"host": socket.gethostname(), "train_pid": child.pid}).encode())
        assert release_replaced_chief(str(model_dir), 2) == \
            "released the lease the replaced chief's train held on run.model_dir"
        released = leases.read_lease(str(model_dir))
        assert released["state"] == "released" and "the JobSet restarted" in released["released_by"]
        leases.acquire(str(model_dir), run_id="restarted", command="train").release()  # taken at once
    finally:
        child.kill()
        child.wait()


LEADER_GONE = """import ctypes, sys, threading, time
from tpulaunch.run import lease
lease.acquire(sys.argv[1], run_id="holder-run", command="train")
threading.Thread(target=time.sleep, args=(600,)).start()  # the process runs on in this thread
print("held", flush=True)
ctypes.CDLL(None).pthread_exit(None)  # its first thread ends: /proc shows the process's state as Z
"""


def test_a_holder_whose_first_thread_ended_while_others_run_is_not_gone(tmp_path):
    """A process whose leader thread exited while its other threads run shows Z in /proc/<pid>/stat, yet it runs
    (and holds its lease): it is not a zombie, and its lease is not taken over."""
    model_dir = tmp_path / "m"
    child = subprocess.Popen([sys.executable, "-c", LEADER_GONE, str(model_dir)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(leases.__file__).parents[2])})
    try:
        assert child.stdout.readline().strip() == "held"
        deadline = time.monotonic() + 30
        while Path(f"/proc/{child.pid}/stat").read_bytes().split(b") ")[1][:1] != b"Z":  # the event: its leader ended
            assert time.monotonic() < deadline, "the leader thread never ended"
            time.sleep(0.01)
        with pytest.raises(leases.LeaseRefused, match="is in use"):
            leases.acquire(str(model_dir), run_id="next-run", command="train")
    finally:
        child.kill()
        child.wait()


def test_a_restarted_chief_leaves_the_lease_of_another_jobsets_chief_whose_attempt_took_the_same_number(
        tmp_path, monkeypatch):
    """Two JobSets on one model_dir: A's pods attempt 1, B's (submitted while A ran) attempt 2; A restarts, its pods
    attempt 2 as well, its chief's status written over B's, its new train holding the lease. B's restarted chief
    (attempt 3) reads attempt 2's chief: A's, live. It is not B's replaced chief: its lease is left held."""
    import socket

    from tpulaunch.remote import layout
    from tpulaunch.remote.host import release_replaced_chief

    model_dir = tmp_path / "m"
    a_train = _held_by_a_child(model_dir)
    try:
        store.write(layout.host_status(str(model_dir), 2, 0),
                    json.dumps({"host": socket.gethostname(), "train_pid": a_train.pid, "jobset": "a"}).encode())
        monkeypatch.setenv("TPULAUNCH_JOBSET", "b")
        assert release_replaced_chief(str(model_dir), 3) == ""
        assert leases.read_lease(str(model_dir))["state"] == "held"
        monkeypatch.setenv("TPULAUNCH_JOBSET", "a")  # A's own restart: its replaced chief's lease is released
        assert release_replaced_chief(str(model_dir), 3) == \
            "released the lease the replaced chief's train held on run.model_dir"
    finally:
        a_train.kill()
        a_train.wait()


def test_a_holder_in_another_pid_namespace_on_this_host_is_not_judged_gone_by_its_pid(tmp_path):
    """Containers on one node share its host name (GKE's hostNetwork pods) but not their pids: a lease whose holder
    ran in another PID namespace is not taken over because no process here has its pid; in this namespace, it is."""
    from tpulaunch.store.local import pid_namespace

    model_dir = tmp_path / "m"
    leases.acquire(str(model_dir), run_id="first", command="train").release()
    held = {**leases.read_lease(str(model_dir)), "state": "held", "pid": 2 ** 22 + 7, "run_id": "other-pod-run",
            "holder": "other", "renewed": time.time()}
    for namespace, taken in (("pid:[1]", False), (pid_namespace(), True)):
        store.write(leases.lease_path(str(model_dir)), json.dumps({**held, "pid_ns": namespace}).encode())
        if taken:
            lease = leases.acquire(str(model_dir), run_id="next", command="train")
            assert lease.took_over["gone"] is True
            lease.release()
        else:
            with pytest.raises(leases.LeaseRefused, match="is in use"):
                leases.acquire(str(model_dir), run_id="next", command="train")
