"""The TPU watchdog and --auto-resume, end to end against a local Cloud TPU API.

Training runs on this machine's CPU (`train --local --watch-node`) while the watchdog polls the job's
TPU node on the local API server (tests/tpu_api_server.py) through the real google-cloud-tpu (v2), so the
whole stop / wait for READY / repair checkpoints / resume path runs as it would on a TPU. The node is
flipped to PREEMPTED when a given checkpoint appears in model_dir. The model sleeps a few
milliseconds per step, so training cannot finish before a 0.1 s watch interval notices the change.
"""

from __future__ import annotations

import io
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import tensorflow as tf
from click.testing import CliRunner
from rich.console import Console

from tpu_api_server import DEFAULT_PROJECT, DEFAULT_ZONE
from tpulaunch.cli import run as cli_run
from tpulaunch.engine.estimator import runner
from tpulaunch.engine.core.model_dir import checkpoint_step
from tpulaunch.tpu.node import NodeRef, NodeStatus, resolve_node
from tpulaunch.errors import ExitCode, TpuLaunchError
from tpulaunch.job.schema import Tpu
from tpulaunch.job.load import load_job
from tpulaunch.engine.core.lost_tpu import is_lost_tpu_error
from tpulaunch.run.events import NodeEvent, NodeWaiting, RunRecorder
from tpulaunch.cli.render.run_plain import PlainRenderer
from tpulaunch.run.signals import TrainingStopped
from tpulaunch.run.watchdog import Watchdog, WatchPlan, lost_reason, wait_until_ready
from tpulaunch.plan.build import build_plan
from watched_runs import FAST_WATCH, lines, preempt_when_checkpoint_appears
from watched_runs import api, project  # noqa: F401  (the fixtures)


def train_cli(project: Path, model_dir: Path, *args: str):
    return CliRunner().invoke(cli_run.train, [str(project / "job.yaml"), "--model-dir", str(model_dir), *args],
                              catch_exceptions=False)


def status(state="READY", health="HEALTHY") -> NodeStatus:
    return NodeStatus(name="my-tpu", zone=DEFAULT_ZONE, project=DEFAULT_PROJECT, state=state, health=health,
                      accelerator_type="v3-8", expected_type=None, devices=8, hosts=1, runtime_version="2.15.0",
                      installed_tf=None)


def plan_for(api, **changes) -> WatchPlan:
    job_tpu = Tpu(name="my-tpu", zone=DEFAULT_ZONE, project=DEFAULT_PROJECT, type="v3-8")
    fields = dict(ref=resolve_node(job_tpu, env={}), job_tpu=job_tpu, interval=0.05, api_endpoint=api.endpoint,
                  poll_s=0.05)
    fields.update(changes)
    return WatchPlan(**fields)


# ------------------------------------------------------------------------------------------ the pieces


def test_which_node_states_stop_training():
    assert [lost_reason(status(*pair)) for pair in [
        ("READY", "HEALTHY"), ("READY", None), ("READY", "HEALTH_UNSPECIFIED"),
        ("PREEMPTED", None), ("TERMINATED", None), ("STOPPED", None), ("REPAIRING", "HEALTHY"),
        ("READY", "UNHEALTHY_TENSORFLOW"), ("READY", "UNHEALTHY_MAINTENANCE"), ("READY", "TIMEOUT"),
    ]] == [None, None, None, "PREEMPTED", "TERMINATED", "STOPPED", "REPAIRING",
           "READY/UNHEALTHY_TENSORFLOW", "READY/UNHEALTHY_MAINTENANCE", "READY/TIMEOUT"]


def test_which_tensorflow_errors_mean_a_lost_tpu():
    errors = tf.errors
    assert [is_lost_tpu_error(e) for e in [
        errors.UnavailableError(None, None, "Socket closed"),
        errors.AbortedError(None, None, "Session was closed"),
        errors.DeadlineExceededError(None, None, "Deadline Exceeded"),
        errors.InternalError(None, None, "Failed to connect to TPU worker: connection refused"),
        errors.InternalError(None, None, "Blas GEMM launch failed"),
        errors.InvalidArgumentError(None, None, "Incompatible shapes"),
        ValueError("not a TF error"),
    ]] == [True, True, True, True, False, False, False]


def test_watchdog_trips_on_preemption_and_keeps_the_first_event(api):
    first_seen = threading.Event()  # the watch's first reading of the node, however long the API takes to answer
    dog = Watchdog(plan_for(api), is_lost_error=is_lost_tpu_error, on_status=lambda state: first_seen.set()).start()
    try:
        assert first_seen.wait(timeout=60)
        assert dog.tripped is None and dog.last_status.state == "READY"
        api.patch_node("my-tpu", state="PREEMPTED")
        deadline = time.monotonic() + 10
        while dog.tripped is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert dog.record_error(tf.errors.UnavailableError(None, None, "Socket closed")) is True
        assert dog.record_error(tf.errors.InvalidArgumentError(None, None, "bad shape")) is False
    finally:
        dog.stop()
    assert dog.tripped == NodeEvent(kind="node", detail="PREEMPTED")


def test_a_lost_tpu_error_trips_the_watchdog_without_api():
    dog = Watchdog(WatchPlan(ref=NodeRef("local")), is_lost_error=is_lost_tpu_error).start()
    assert dog.record_error(tf.errors.UnavailableError(None, None, "Socket closed\nmore")) is True
    assert dog.tripped == NodeEvent(kind="error", detail="UnavailableError: Socket closed")


def test_waiting_goes_through_preempted_and_not_found_until_ready(api):
    api.play("my-tpu", [(0, "PREEMPTED", None), (0.4, "CREATING", None), (0.8, "READY", "HEALTHY")])
    api.fail_next(2, 404)
    seen = []
    ready = wait_until_ready(plan_for(api, resume_wait=30),
                             on_wait=lambda s, problem, left: seen.append(problem or s.state))
    assert (ready.state, ready.health, ready.usable) == ("READY", "HEALTHY", True)
    not_found = ("TPU node 'my-tpu' not found in project 'test-project', zone 'us-central1-a' "
                 "(name from tpu.name, zone from tpu.zone, project from tpu.project)")
    assert seen[:2] == [not_found, not_found]
    assert seen[2:] and set(seen[2:]) <= {"PREEMPTED", "CREATING"}


def test_waiting_gives_up_after_resume_wait_with_the_last_state(api):
    api.patch_node("my-tpu", state="PREEMPTED")
    with pytest.raises(TpuLaunchError) as info:
        wait_until_ready(plan_for(api, resume_wait=0.3))
    assert info.value.exit_code == ExitCode.CLUSTER
    assert info.value.message == "TPU node 'my-tpu' was not READY and HEALTHY after waiting 0.3s: TPU node 'my-tpu' is PREEMPTED"


def test_a_node_that_comes_back_as_another_type_is_refused(api):
    api.set_node("my-tpu", accelerator_type="v3-32", hosts=4)
    with pytest.raises(TpuLaunchError) as info:
        wait_until_ready(plan_for(api, resume_wait=30))
    assert (info.value.message, info.value.exit_code) == (
        "TPU node 'my-tpu' is a v3-32, but the job's tpu.type is v3-8", ExitCode.CLUSTER)


def test_waiting_returns_none_when_asked_to_stop(api):
    api.patch_node("my-tpu", state="PREEMPTED")
    started = time.monotonic()
    assert wait_until_ready(plan_for(api, resume_wait=60, poll_s=5), should_stop=lambda: time.monotonic() > started + 0.3) is None
    assert time.monotonic() - started < 3


# ------------------------------------------------------------------------------------------ end to end


def test_preempted_mid_run_waits_resumes_and_ends_at_the_step_with_no_lost_steps(project, api, tmp_path):
    model_dir = tmp_path / "run"
    flip = preempt_when_checkpoint_appears(api, model_dir, 20, back_after_s=1.0)
    result = train_cli(project, model_dir, *FAST_WATCH, "--auto-resume", "2")
    flip.join()

    assert result.exit_code == 0, result.output
    (event,) = lines(result.output, "tpu | PREEMPTED")
    stopped_at = int(re.fullmatch(r"tpu \| PREEMPTED \| step (\d+) \| checkpoint step (\d+) \| 0 steps lost", event)
                     .group(1))
    assert 20 <= stopped_at < 120
    assert event == f"tpu | PREEMPTED | step {stopped_at} | checkpoint step {stopped_at} | 0 steps lost"
    waiting = lines(result.output, "tpu | waiting")
    assert waiting and re.fullmatch(r"tpu \| waiting for READY/HEALTHY \| PREEMPTED \| \d+ s left", waiting[0]), waiting
    assert lines(result.output, "tpu | READY") == [
        f"tpu | READY/HEALTHY | resuming from step {stopped_at} (resume 1 of 2)"]
    (done,) = lines(result.output, "done")
    # 120 steps run in all: nothing after the checkpoint was lost and run twice.
    assert done.startswith("done | step 120/120 | 120 steps in "), done
    assert re.search(rf" \| 1 TPU event \(PREEMPTED at step {stopped_at}, back in \d+\.\d s\) \| 1 resume \| "
                     r"0 steps lost$", done), done
    assert checkpoint_step(str(model_dir)) == 120


def test_without_auto_resume_a_preemption_exits_3_saying_how_to_resume(project, api, tmp_path):
    model_dir = tmp_path / "run"
    flip = preempt_when_checkpoint_appears(api, model_dir, 20)
    result = train_cli(project, model_dir, *FAST_WATCH)
    flip.join()

    assert result.exit_code == ExitCode.CLUSTER == 3, result.output
    stopped_at = checkpoint_step(str(model_dir))
    assert 20 <= stopped_at < 120
    assert lines(result.output, "TPU node 'my-tpu' lost") == [
        f"TPU node 'my-tpu' lost (PREEMPTED) at step {stopped_at}; the last complete checkpoint is at step "
        f"{stopped_at} (0 steps lost)"]
    assert lines(result.output, "hint: ") == [
        "hint: once the node is READY again (`gcloud compute tpus describe` / recreate a preempted node), rerun the "
        "same command to resume from that checkpoint; add --auto-resume N to wait and resume automatically"]
    (done,) = lines(result.output, "stopped (TPU PREEMPTED)")
    assert done.endswith(f" | 1 TPU event (PREEMPTED at step {stopped_at}) | 0 resumes | 0 steps lost"), done

    # What the hint says works: once the node is READY, the same command finishes from that step.
    api.set_node("my-tpu")
    rerun = train_cli(project, model_dir, *FAST_WATCH)
    assert rerun.exit_code == 0, rerun.output
    assert f"resumed from step {stopped_at} ({model_dir})" in rerun.output.splitlines()
    (done,) = lines(rerun.output, "done")
    assert done.startswith(f"done | step 120/120 | {120 - stopped_at} steps in "), done


def test_a_truncated_checkpoint_is_skipped_and_training_resumes_from_the_one_before(project, api, tmp_path):
    model_dir = tmp_path / "run"
    first = train_cli(project, model_dir, "--local", "--set", "train.steps=40")
    assert first.exit_code == 0, first.output
    data = model_dir / "model.ckpt-40.data-00000-of-00001"
    full = data.stat().st_size
    data.write_bytes(data.read_bytes()[:-10])

    result = train_cli(project, model_dir, "--local", "--set", "train.steps=60")

    assert result.exit_code == 0, result.output
    out = [line for line in result.output.splitlines() if not line.startswith("phase | ")]
    assert out[:3] == [
        f"skipping incomplete checkpoint {model_dir}/model.ckpt-40: data shards hold "
        f"{full - 10} bytes, the index lists {full}: truncated",
        f"resuming from {model_dir}/model.ckpt-20 (step 20)",
        f"resumed from step 20 ({model_dir})",
    ]
    (done,) = lines(result.output, "done")
    assert done.startswith("done | step 60/60 | 40 steps in "), done
    assert checkpoint_step(str(model_dir)) == 60


def test_sigterm_while_waiting_for_the_node_exits_143_and_keeps_the_checkpoint(project, api, tmp_path):
    model_dir = tmp_path / "run"
    loaded = load_job(str(project / "job.yaml"), [f"run.model_dir={model_dir}"])
    output = io.StringIO()
    recorder = RunRecorder(total_steps=120, batch_size=8, log_every_steps=1000)
    recorder.subscribe(PlainRenderer(Console(file=output, width=200)))
    flip = preempt_when_checkpoint_appears(api, model_dir, 20)  # and never back

    waiting = threading.Event()  # set by the recorder's first "waiting for the node" event
    recorder.subscribe(lambda event: waiting.set() if isinstance(event, NodeWaiting) else None)

    def terminate_while_waiting():
        waiting.wait(300)
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=terminate_while_waiting, daemon=True)
    killer.start()
    plan = plan_for(api, interval=0.1, auto_resume=3, resume_wait=300, poll_s=0.1)
    with pytest.raises(TrainingStopped) as stopped:
        runner.train(loaded.job, build_plan(loaded.job, local=True), recorder=recorder, search_path=[str(project)], watch=plan)
    killer.join()
    flip.join()

    assert stopped.value.exit_code == ExitCode.TERMINATED == 143
    step = stopped.value.step
    assert 20 <= step < 120
    assert stopped.value.message == (f"stopped while waiting for TPU node 'my-tpu'; the checkpoint at step {step} "
                                     "is kept: rerun the same command to resume")
    assert checkpoint_step(str(model_dir)) == step
    summary = stopped.value.summary
    assert (summary.stopped_by, summary.final_step, summary.resumes, summary.events) == (
        "SIGTERM", step, 0, [NodeEvent("node", "PREEMPTED", step=step, checkpoint_step=step, resumed=False)])
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


# ------------------------------------------------------------------------------------------ --recreate


def when_checkpoint_appears(model_dir: Path, step: int, action, after=lambda: True) -> threading.Thread:
    """Run `action()` once a checkpoint at `step` or later is written while `after()` holds (events of the
    run, not times)."""

    def written() -> bool:
        return after() and any(int(p.name.split("-")[1].split(".")[0]) >= step
                               for p in model_dir.glob("model.ckpt-*.index"))

    def wait_then_act():
        deadline = time.monotonic() + 300
        while not written() and time.monotonic() < deadline:
            time.sleep(0.01)
        action()

    thread = threading.Thread(target=wait_then_act, daemon=True)
    thread.start()
    return thread


def test_recreate_brings_a_preempted_then_deleted_node_back_and_finishes_at_the_step(project, api, tmp_path):
    model_dir = tmp_path / "run"
    preempt = when_checkpoint_appears(model_dir, 20, lambda: api.patch_node("my-tpu", state="PREEMPTED"))
    # Once the node was created again and training went on past a new checkpoint: delete it.
    delete = when_checkpoint_appears(model_dir, 40, lambda: api.delete_node("my-tpu"), after=lambda: api.created)
    result = train_cli(project, model_dir, *FAST_WATCH, "--auto-resume", "2", "--recreate")
    preempt.join()
    delete.join()

    assert result.exit_code == 0, result.output
    events = lines(result.output, "tpu | PREEMPTED") + lines(result.output, "tpu | NOT_FOUND")
    assert len(events) == 2, result.output
    assert lines(result.output, "tpu | deleting TPU node 'my-tpu' (PREEMPTED)"), result.output
    created = lines(result.output, "tpu | creating TPU node 'my-tpu' (v3-8, on-demand, tpu-vm-tf-2.15.1-se) as a node")
    assert len(created) == 2, result.output
    ready = lines(result.output, "tpu | READY/HEALTHY | recreated in ")
    assert len(ready) == 2 and all(re.fullmatch(
        r"tpu \| READY/HEALTHY \| recreated in \d+\.\d s \| resuming from step \d+ \(resume [12] of 2\)", line)
        for line in ready), ready
    (done,) = lines(result.output, "done")
    assert done.startswith("done | step 120/120 | 120 steps in "), done  # nothing run twice
    assert re.search(r"\| 2 TPU events \(PREEMPTED at step \d+, recreated, back in \d+\.\d s; NOT_FOUND at step \d+, "
                     r"recreated, back in \d+\.\d s\) \| 2 resumes \| 0 steps lost$", done), done
    assert checkpoint_step(str(model_dir)) == 120
    # The node was created again exactly as `tpulaunch up` creates it, twice.
    assert [c["node"]["acceleratorType"] for c in api.created] == ["v3-8", "v3-8"]
    assert api.nodes[f"projects/{DEFAULT_PROJECT}/locations/{DEFAULT_ZONE}/nodes/my-tpu"]["state"] == "READY"

    import json
    (record,) = [json.loads(line) for line in (model_dir / "tpulaunch-runs.jsonl").read_text().splitlines()]
    assert [(e["detail"], e["recreated"], e["steps_lost"]) for e in record["events"]] == [
        ("PREEMPTED", True, 0), ("NOT_FOUND", True, 0)]
    assert all(isinstance(e["recovery_s"], float) and e["recovery_s"] > 0 for e in record["events"])
    assert record["steps_lost"] == 0


def test_without_recreate_nothing_is_created(project, api, tmp_path):
    model_dir = tmp_path / "run"
    gone = when_checkpoint_appears(model_dir, 20, lambda: api.delete_node("my-tpu"))
    result = train_cli(project, model_dir, *FAST_WATCH, "--auto-resume", "1", "--resume-wait", "0.5")
    gone.join()
    assert result.exit_code == ExitCode.CLUSTER, result.output
    assert lines(result.output, "tpu | NOT_FOUND"), result.output
    assert api.created == [] and not any(method == "POST" for method, _ in api.requests)
