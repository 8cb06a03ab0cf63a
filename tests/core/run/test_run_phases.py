"""Phases, the slow-phase watch, goodput and the run record, without TensorFlow: a hand-stepped clock."""

import io
import json
import re

import pytest
from rich.console import Console

from tpulaunch.run import phases
from tpulaunch.run.events import NodeEvent, PhaseEnded, PhaseSlow, RunRecorder
from tpulaunch.run.phase_watch import MAX_GAP_S, PhaseWatch
from tpulaunch.run.record import last_training, read_records, record_line, run_record
from tpulaunch.cli.render.run_live import LiveRenderer


class Clock:
    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def recorder_with_events(**settings):
    clock, seen = Clock(), []
    recorder = RunRecorder(get_time=clock, **settings)
    recorder.subscribe(seen.append)
    return recorder, clock, seen


def test_a_slow_phase_is_told_at_growing_intervals_never_more_than_max_gap_apart():
    recorder, clock, seen = recorder_with_events(started_at=0.0)
    watch = PhaseWatch(recorder, usual={phases.BUILD: 60.0})
    recorder.phase_began(phases.BUILD)
    for now in range(0, 3000):
        clock.now = float(now)
        watch.check()
    told = [event.seconds for event in seen if isinstance(event, PhaseSlow)]
    assert told == [60, 120, 240, 480, 960, 960 + MAX_GAP_S, 960 + 2 * MAX_GAP_S, 960 + 3 * MAX_GAP_S]
    assert {event.name for event in seen if isinstance(event, PhaseSlow)} == {phases.BUILD}


def test_a_phase_without_a_usual_time_is_not_watched_and_a_new_phase_starts_afresh():
    recorder, clock, seen = recorder_with_events(started_at=0.0)
    watch = PhaseWatch(recorder, usual={phases.EVALUATION: 10.0})
    recorder.phase_began(phases.EXPORT)  # no usual time given
    clock.now = 1000.0
    watch.check()
    recorder.phase_ended(phases.EXPORT)
    recorder.phase_began(phases.EVALUATION)
    clock.now = 1009.0
    watch.check()
    assert not [e for e in seen if isinstance(e, PhaseSlow)]
    clock.now = 1010.0
    watch.check()
    assert [(e.name, e.seconds) for e in seen if isinstance(e, PhaseSlow)] == [(phases.EVALUATION, 10.0)]


def test_training_is_watched_from_its_last_finished_step():
    """A hung step says so; a long run of steps that keep finishing does not."""
    recorder, clock, seen = recorder_with_events(started_at=0.0, total_steps=10 ** 6, batch_size=1)
    watch = PhaseWatch(recorder)
    recorder.phase_began(phases.TRAINING)
    recorder.session_began(0)
    for step in range(1, 2001):  # 2000 steps of 0.5 s: 1000 s of training, never slow
        clock.now += 0.5
        recorder.steps_run(step, 1.0)
        watch.check()
    assert not [e for e in seen if isinstance(e, PhaseSlow)]
    clock.now += 59.0
    watch.check()
    assert not [e for e in seen if isinstance(e, PhaseSlow)]
    clock.now += 1.0
    watch.check()
    (slow,) = [e for e in seen if isinstance(e, PhaseSlow)]
    assert (slow.name, slow.seconds, slow.last_step) == (phases.TRAINING, 60.0, 2000)


def test_phases_nest_and_a_scope_closes_what_opened_inside_it_however_it_ends():
    recorder, clock, seen = recorder_with_events(started_at=0.0)
    with pytest.raises(RuntimeError):
        with recorder.phase_scope():
            recorder.phase_began(phases.BUILD)
            clock.now = 1.0
            recorder.phase_switch(phases.RESTORE)
            recorder.phase_began(phases.CHECKPOINT)
            clock.now = 3.0
            raise RuntimeError("the session failed")
    assert [(e.name, e.seconds) for e in seen if isinstance(e, PhaseEnded)] == [
        (phases.BUILD, 1.0), (phases.CHECKPOINT, 2.0), (phases.RESTORE, 2.0)]
    assert recorder.phases.open_phases() == []
    wall, seconds = recorder.phases.snapshot()
    assert (wall, seconds) == (3.0, {phases.BUILD: 1.0, phases.RESTORE: 0.0, phases.CHECKPOINT: 2.0, phases.OTHER: 0.0})


def test_goodput_leaves_out_the_steps_run_again_after_a_lost_tpu():
    recorder, clock, _ = recorder_with_events(started_at=0.0, total_steps=10, batch_size=1)
    recorder.phase_began(phases.TRAINING)
    recorder.session_began(0)
    for step in range(1, 6):
        clock.now += 1.0
        recorder.steps_run(step, None)
    recorder.phase_ended(phases.TRAINING)
    recorder.node_lost(NodeEvent("node", "PREEMPTED", step=5, checkpoint_step=3))  # steps 4 and 5 are lost
    clock.now += 5.0  # waiting for the TPU
    recorder.phase_began(phases.TRAINING)
    recorder.session_began(3)
    for step in range(4, 11):
        clock.now += 1.0
        recorder.steps_run(step, None)
    recorder.phase_ended(phases.TRAINING)
    # 12 s stepping over 12 steps, of which 2 were run again; 17 s of wall time.
    assert recorder.finish().goodput == pytest.approx(12 * (10 / 12) / 17)


def test_an_untimed_recorder_has_no_goodput_and_no_input_share():
    recorder, clock, _ = recorder_with_events(total_steps=4, batch_size=1)
    recorder.session_began(0)
    for step in range(1, 5):
        clock.now += 1.0
        recorder.steps_run(step, None)  # no input wait measured
    summary = recorder.finish()
    assert (summary.goodput, summary.input_share) == (None, None)


def test_the_record_adds_its_phases_up_to_its_wall_time_and_is_strict_json():
    recorder, clock, _ = recorder_with_events(started_at=10.0, total_steps=4, batch_size=4)
    clock.now = 10.5
    recorder.phase_done(phases.CHECK, 10.0)
    recorder.phase_began(phases.TRAINING)
    recorder.session_began(0)
    for step in (1, 2, 3, 4):
        clock.now += 1.0
        recorder.steps_run(step, float("nan"), input_wait=0.01)
    recorder.phase_ended(phases.TRAINING)
    recorder.finish()
    clock.now += 0.25
    record = run_record(recorder, command="train", outcome="done", on_tpu=False,
                        job={"name": "tiny", "hash": "sha256:0", "model_dir": "runs/tiny"},
                        versions={"tpulaunch": "0.1.0", "tensorflow": "2.15.1"}, wall_clock=lambda: 1_700_000_000.0)
    line = record_line(record)
    assert line.endswith("\n") and "\n" not in line[:-1]
    parsed = json.loads(line)
    assert parsed["phases"] == {phases.OTHER: 0.25, phases.CHECK: 0.5, phases.TRAINING: 4.0}
    assert sum(parsed["phases"].values()) == pytest.approx(parsed["wall_s"]) == 4.75
    assert (parsed["start"], parsed["end"]) == ("2023-11-14T22:13:15.250Z", "2023-11-14T22:13:20.000Z")
    assert parsed["steps"] == {"from": 0, "to": 4, "run": 4, "total": 4}
    assert parsed["goodput"] == round(4.0 / 4.75, 4)
    # The session's first run is start-up; the 3 others waited 0.01 s of each second.
    assert (parsed["input_wait_share"], parsed["input_bound"]) == (0.01, False)
    assert parsed["examples_per_s"] == 4.0 and parsed["steps_per_s"] == 1.0
    assert parsed["evals"] == [] and parsed["events"] == []


def test_run_records_are_read_back_skipping_a_line_cut_short():
    lines = ['{"command": "train", "examples_per_s": 100.0}', '{"command": "evaluate"}',
             '{"command": "resume", "examples_per_s": 90.0}', '{"command": "resu']
    records = read_records(lines)
    assert [r["command"] for r in records] == ["train", "evaluate", "resume"]
    assert last_training(records)["examples_per_s"] == 90.0
    assert last_training([{"command": "evaluate"}]) is None


def test_the_live_display_shows_the_phase_with_its_time_before_anything_else_exists():
    clock, out = Clock(), io.StringIO()
    recorder = RunRecorder(get_time=clock, started_at=0.0)
    live = recorder.subscribe(LiveRenderer(Console(file=out, force_terminal=True, width=100, no_color=True),
                                           get_time=clock, auto_refresh=False))
    clock.now = 0.3
    recorder.phase_done(phases.CHECK, 0.0)
    recorder.phase_began(phases.LOAD)
    clock.now = 2.4
    live.refresh()
    shown = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.getvalue())
    assert "✓ check the job 0.3 s" in shown
    assert "load TensorFlow 2 s" in shown
    recorder.phase_ended(phases.LOAD)
    recorder.close()
    assert "✓ load TensorFlow 2.1 s" in out.getvalue()
