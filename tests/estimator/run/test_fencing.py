"""Fencing: a `train` whose model_dir lease another run took over writes nothing more there.

Two real `train` processes on one model_dir: the first is frozen (SIGSTOP, as a paused VM or a long stall would
freeze it) right after one of its checkpoints; the second takes the lease over (once it is stale, or at once with
--take-lease) and trains to its end; then the first thaws (SIGCONT). It must find the lease is no longer its own
before its next write: model_dir is byte for byte what the second left (its checkpoints, the `checkpoint` state,
its summaries), the first exits 5 naming the new holder, and its record line says it was fenced. The one
thing it may finish is the step it was frozen in (TensorFlow's summary hooks run before tpulaunch's after a
step): in its own events file, of that step, nothing later.

Every wait is on an event (a line a run printed, the lease file's state), never on a sleep of a guessed length."""

from __future__ import annotations

import hashlib
import json
import signal
import time
from pathlib import Path

import pytest

from lease_runs import Run, check_fenced_mid_save, cli_env, freeze_after
from train_jobs import JOB, MODELS, write_records
from tpulaunch.errors import ExitCode
from tpulaunch.run import lease as leases
from tpulaunch.run.record import RECORD_FILE

FIRST_EVERY = 150  # the frozen run's checkpoints: far apart, so the freeze never lands inside one of its saves


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fencing")
    (root / "train_models.py").write_text(MODELS)
    (root / "job.yaml").write_text(JOB)
    write_records(root / "data" / "train.tfrecord", 64, seed=1)
    write_records(root / "data" / "eval.tfrecord", 32, seed=2)
    return root


def _train(project: Path, model_dir: Path, *args: str, env: dict) -> Run:
    return Run(["train", str(project / "job.yaml"), "--local", "--model-dir", str(model_dir), "--set", "eval=null",
                *args], env=env)


def _files(model_dir: Path) -> dict:
    """Every file in model_dir but the lease and the run record (both shared on purpose): its size and digest."""
    found = {}
    for path in sorted(model_dir.rglob("*")):
        if path.is_file() and path.name not in (leases.LEASE_FILE, RECORD_FILE):
            found[str(path.relative_to(model_dir))] = (path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def _step_of(line: str) -> int:
    return int(line.split()[3].split("/")[0])


def _events(path: Path) -> list:
    import tensorflow as tf

    return [(event.step, event.wall_time) for event in tf.compat.v1.train.summary_iterator(str(path))]


@pytest.mark.parametrize("takeover", ["stale", "take-lease"])
def test_a_run_that_thaws_after_its_lease_was_taken_over_writes_nothing_more(project, tmp_path, takeover):
    run_dir = tmp_path / "run"
    # Unfenced, the first would go on to step 1000 after it thaws, saving every 150 steps over the second's work.
    # Renewed every 0.2 s; stale after 1.5 s (the takeover by staleness) or 600 s (--take-lease takes it at once).
    env = cli_env(TPULAUNCH_LEASE_RENEW_S="0.2", TPULAUNCH_LEASE_STALE_S="1.5" if takeover == "stale" else "600")
    first = _train(project, run_dir, "--set", "train.steps=1000", "--set", "run.log_every_steps=1",
                   "--set", f"run.save_checkpoints_steps={FIRST_EVERY}", env=env)
    second = None
    try:
        line = freeze_after(first, run_dir, lambda line: line.startswith("checkpoint | step ") and _step_of(line) > 0)
        frozen_at = _step_of(line)
        own_events = [path for path in run_dir.glob("events.out.tfevents.*")]  # all the first's, so far
        held = leases.read_lease(str(run_dir))
        assert (held["state"], held["pid"]) == ("held", first.pid)
        if takeover == "stale":
            while leases.lease_state(leases.read_lease(str(run_dir)), time.time()) != "stale":
                time.sleep(0.05)  # the frozen holder renews no more: its lease ages to stale
        # The second trains 25 steps past the first's checkpoint, saving every 10 (its own checkpoints).
        end = frozen_at + 25
        second = _train(project, run_dir, "--set", f"train.steps={end}", "--set", "run.save_checkpoints_steps=10",
                        *(["--take-lease"] if takeover == "take-lease" else []), env=env)
        took = second.wait_for_line(lambda line: line.startswith("lease | took over"), stream="err")
        assert f"pid {first.pid}, run {held['run_id']}" in took, took
        assert second.finish() == 0, second.text()
        assert f"resumed from step {frozen_at} ({run_dir})" in second.out, second.text()
        assert second.out[-1].startswith(f"done | step {end}/{end} | "), second.text()
        before = _files(run_dir)
        state_before = (run_dir / "checkpoint").read_text()
        assert f'model_checkpoint_path: "model.ckpt-{end}"' in state_before, state_before

        events_before = {path.name: _events(path) for path in own_events}
        printed = len(first.out)
        last_step = max(_step_of(line) for line in first.out if line.startswith("train | step "))
        first.process.send_signal(signal.SIGCONT)
        assert first.finish() == ExitCode.LEASE_LOST == 5, first.text()
    finally:
        for run in (first, second):
            if run is not None:
                run.end()

    # Nothing the first could write after the takeover: no checkpoint, no `checkpoint` state, no step after the
    # one it was frozen in (its summaries included).
    mine = {path.name for path in own_events}
    assert {k: v for k, v in _files(run_dir).items() if k not in mine} == {
        k: v for k, v in before.items() if k not in mine}
    assert (run_dir / "checkpoint").read_text() == state_before
    steps_after = [_step_of(line) for line in first.out[printed:] if line.startswith("train | step ")]
    assert all(step <= last_step + 1 for step in steps_after), first.out[printed:]
    for path in own_events:
        added = _events(path)[len(events_before[path.name]):]
        assert all(step <= last_step + 1 for step, _ in added), (path.name, added, last_step)
    new = leases.read_lease(str(run_dir))
    assert new["run_id"] != held["run_id"] and new["state"] == "released"  # the second's, as it left it

    err = "\n".join(first.err)
    assert "Traceback" not in err, err
    assert f"error: lease lost: host {held['host']}, pid {second.pid}, run {new['run_id']} took run.model_dir " \
           f"{run_dir} over while this run held it; this run stopped without writing there again" in err, err
    assert f"its last checkpoint there: {run_dir / f'model.ckpt-{frozen_at}'})" in err, err
    assert not any(line.startswith("checkpoint | step ") and _step_of(line) > frozen_at for line in first.out), \
        first.text()

    records = [json.loads(line) for line in (run_dir / RECORD_FILE).read_text().splitlines()]
    assert [(r["run_id"], r["outcome"]) for r in records] == [
        (new["run_id"], "done"),
        (held["run_id"], f"fenced: lease lost to host {held['host']}, pid {second.pid}, run {new['run_id']}")]


def test_a_run_frozen_in_the_middle_of_a_save_leaves_its_successors_checkpoint_alone(project, tmp_path):
    env = cli_env(TPULAUNCH_LEASE_RENEW_S="0.2", TPULAUNCH_LEASE_STALE_S="600")
    check_fenced_mid_save(lambda run_dir, *args, **extra: _train(project, run_dir, *args, env=dict(env, **extra)),
                          tmp_path / "run")
