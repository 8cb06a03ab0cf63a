"""Run events and their renderers without TensorFlow: a whole run driven by hand, with a fake clock.

As rich's own tests/test_progress.py does, the clock is a parameter and the console writes into a
StringIO, so the exact text of a run is checked, not pieces of it.
"""

import ast
import io
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from paths import REPO
from tpulaunch.run import phases
from tpulaunch.run.events import NodeEvent, RunRecorder
from tpulaunch.run.phase_watch import PhaseWatch
from tpulaunch.cli.render.run_plain import PlainRenderer

RUN_PACKAGE = REPO / "tpulaunch" / "run"


class Clock:
    """A hand-stepped clock, as rich's tests use."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def plain_run(**settings):
    clock, out = Clock(), io.StringIO()
    recorder = RunRecorder(get_time=clock, **settings)
    recorder.subscribe(PlainRenderer(Console(file=out, width=80)))
    return recorder, clock, out


def test_plain_lines_of_a_whole_run_with_an_evaluation_a_preemption_and_a_resume():
    recorder, clock, out = plain_run(total_steps=6, batch_size=8, log_every_steps=2, model_dir="runs/cnn")

    recorder.note("resumed from step 2 (runs/cnn)")
    recorder.skip_counting_began()
    recorder.session_began(2)
    recorder.checkpoint_saved(2, "runs/cnn/model.ckpt-2")  # the save as the session opens: no line
    clock.now = 0.5
    recorder.records_skipped(1)
    recorder.steps_run(3, 0.9)
    clock.now = 1.0
    recorder.steps_run(4, 0.7)
    recorder.checkpoint_saved(4, "runs/cnn/model.ckpt-4")
    recorder.records_skipped(1, session_ended=True)
    recorder.session_ended()
    recorder.evaluated(4, {"loss": 0.5, "accuracy": 0.75, "global_step": 4})

    clock.now = 5.0  # evaluation time is not training time
    recorder.skip_counting_began()
    recorder.session_began(4)
    clock.now = 6.0
    recorder.steps_run(5, 0.6)
    recorder.node_lost(NodeEvent(kind="node", detail="PREEMPTED", step=5, checkpoint_step=4))
    recorder.node_waiting("PREEMPTED", 3599.6)
    recorder.node_waiting("PREEMPTED", 3590.0)  # the same state again: the countdown only
    recorder.node_waiting("CREATING", 3580.0)
    recorder.node_ready("READY/HEALTHY", 4, 3)

    clock.now = 10.0
    recorder.skip_counting_began()
    recorder.session_began(4)
    clock.now = 11.0
    recorder.steps_run(6, 0.4)
    recorder.checkpoint_saved(6, "runs/cnn/model.ckpt-6")
    recorder.records_skipped(0, session_ended=True)
    recorder.session_ended()
    recorder.evaluated(6, {"loss": 0.25, "accuracy": 1.0}, records_skipped=0)
    summary = recorder.finish()

    assert out.getvalue() == textwrap.dedent("""\
        resumed from step 2 (runs/cnn)
        train | start | step 2/6 | batch 8 | model_dir runs/cnn
        train | loss: mean of the last 2 steps' losses, each the loss the optimizer minimizes (regularizers included)
        data.skip_corrupt: skipping records that fail to parse (1 so far)
        train | step 4/6 | 2.0 steps/s | 16 examples/s | loss 0.8 | eta 0:00:01 | skipped 1
        checkpoint | step 4 | runs/cnn/model.ckpt-4
        eval | step 4 | accuracy 0.75 | loss 0.5
        tpu | PREEMPTED | step 5 | checkpoint step 4 | 1 steps lost
        tpu | waiting for READY/HEALTHY | PREEMPTED | 3600 s left
        tpu | waiting for READY/HEALTHY | CREATING | 3580 s left
        tpu | READY/HEALTHY | resuming from step 4 (resume 1 of 3)
        train | step 6/6 | 2.0 steps/s | 16 examples/s | loss 0.5 | eta 0:00:00 | skipped 1
        checkpoint | step 6 | runs/cnn/model.ckpt-6
        eval | step 6 | accuracy 1 | loss 0.25 | 0 records skipped (data.skip_corrupt)
        done | step 6/6 | 5 steps in 3.0 s | 1.7 steps/s | 13 examples/s | loss 0.5 | checkpoint runs/cnn/model.ckpt-6 | 1 TPU event (PREEMPTED at step 5, back in 5.0 s) | 1 resume | 1 steps lost | 1 record skipped (data.skip_corrupt)
        """)
    # What the runner decides from: the recorder, not the display.
    assert (recorder.resumes, summary.resumes, summary.steps_run) == (1, 1, 5)
    assert (summary.start_step, summary.final_step) == (2, 6)
    assert [e.step for e in summary.evals] == [4, 6]
    assert summary.events == [NodeEvent("node", "PREEMPTED", step=5, checkpoint_step=4, resumed=True,
                                          recovery_s=5.0)]


def test_plain_lines_of_a_run_stopped_by_a_signal_and_of_one_with_nothing_to_train():
    recorder, clock, out = plain_run(total_steps=400, batch_size=8, log_every_steps=100)
    recorder.session_began(0)
    clock.now = 2.0
    recorder.steps_run(37, None)  # no loss fetched (a job whose model reports none)
    recorder.session_ended()
    recorder.finish(stopped_by="SIGINT")

    idle, _, idle_out = plain_run(total_steps=6, batch_size=8)
    idle.at_step(6)
    idle.note("already at step 6 of 6 in runs/cnn; nothing to train")
    idle.finish()

    assert out.getvalue() == textwrap.dedent("""\
        train | start | step 0/400 | batch 8
        train | loss: mean of the last 100 steps' losses, each the loss the optimizer minimizes (regularizers included)
        stopped (SIGINT) | step 37/400 | 37 steps in 2.0 s | 18.5 steps/s | 148 examples/s | loss -
        """)
    assert idle_out.getvalue() == textwrap.dedent("""\
        already at step 6 of 6 in runs/cnn; nothing to train
        done | step 6/6 | 0 steps in 0.0 s | - steps/s | - examples/s | loss -
        """)


def test_a_stop_right_after_a_rollback_reports_the_step_and_checkpoint_rolled_back_to_not_the_nan_step():
    recorder, clock, out = plain_run(total_steps=40, batch_size=8, log_every_steps=100)
    recorder.session_began(0)
    clock.now = 2.0
    recorder.steps_run(6, float("nan"))
    recorder.checkpoint_saved(6, "runs/m/model.ckpt-6")
    recorder.session_ended()
    recorder.rolled_back(5, "runs/m/model.ckpt-5")  # ckpt-6 held NaN weights: moved aside
    summary = recorder.finish(stopped_by="SIGTERM")
    assert (summary.final_step, summary.last_checkpoint, summary.loss) == (5, "runs/m/model.ckpt-5", None)
    assert out.getvalue().splitlines()[-1].startswith("stopped (SIGTERM) | step 5/40 |"), out.getvalue()
    assert "| loss - |" in out.getvalue().splitlines()[-1] and "model.ckpt-6" not in out.getvalue().splitlines()[-1]


def test_a_recorder_without_renderers_prints_nothing_and_still_keeps_the_run():
    recorder = RunRecorder(total_steps=4, batch_size=2, log_every_steps=2, get_time=Clock())
    recorder.session_began(0)
    recorder.steps_run(4, 1.0)
    assert recorder.finish().final_step == 4


def test_log_points_do_not_depend_on_the_renderer():
    """The hook reads the exact global step (an extra tiny session run) only at log points, whoever listens."""
    recorder = RunRecorder(total_steps=1000, batch_size=2, log_every_steps=100, get_time=Clock())
    recorder.session_began(0)
    asked = []
    for step in range(1, 1001):
        if recorder.wants_exact_step(step):
            asked.append(step)
        recorder.steps_run(step, 1.0)
    assert asked == list(range(100, 1001, 100))


def test_nothing_in_the_run_package_imports_tensorflow_or_the_engine():
    """Run events, renderers, signals and the watchdog are engine-neutral: TensorFlow belongs to engine/."""
    for module in sorted(RUN_PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text(), str(module))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] != "tensorflow", (module.name, node.lineno, name)
                assert not name.startswith("tpulaunch.engine"), (module.name, node.lineno, name)


def test_plain_lines_of_a_run_with_its_phases_from_the_first_moment():
    """The phases of a run as `train` reports them, a slow first step (an XLA compile) included, then
    the input share and the goodput; the seconds per phase add up to the wall time."""
    clock, out = Clock(), io.StringIO()
    recorder = RunRecorder(get_time=clock, started_at=0.0, total_steps=4, batch_size=8, log_every_steps=2,
                           model_dir="runs/cnn", input_help=("store data.features.image raw instead of PNG/JPEG",))
    recorder.subscribe(PlainRenderer(Console(file=out, width=80)))
    watch = PhaseWatch(recorder, on_tpu=True)

    clock.now = 0.3
    recorder.phase_done(phases.CHECK, 0.0)  # the job was checked before anything could be shown
    recorder.phase_began(phases.LOAD)
    clock.now = 3.3
    watch.check()  # usual: nothing to say
    recorder.phase_ended(phases.LOAD)
    with recorder.phase_scope():  # what the runner wraps around one training session
        recorder.phase_began(phases.BUILD)
        clock.now = 4.3
        recorder.phase_switch(phases.INITIALISE)
        recorder.node_seen("READY/HEALTHY")
        clock.now = 5.0
        recorder.phase_began(phases.CHECKPOINT)  # the save as the session opens
        clock.now = 5.5
        recorder.phase_ended(phases.CHECKPOINT)
        recorder.checkpoint_saved(0, "runs/cnn/model.ckpt-0")
        recorder.phase_switch(phases.FIRST_STEP, "XLA compiles the TPU program")
        recorder.session_began(0)
        for now in range(6, 1400):  # the compile takes 23 minutes
            clock.now = float(now)
            watch.check()
        recorder.phase_switch(phases.TRAINING)
        recorder.steps_run(1, 0.9, input_wait=1.0)  # the session's first run does not count
        for step in (2, 3, 4):
            clock.now += 0.5
            recorder.steps_run(step, 0.5, input_wait=0.25)
        recorder.phase_began(phases.CHECKPOINT)
        clock.now += 0.5
        recorder.phase_ended(phases.CHECKPOINT)
        recorder.checkpoint_saved(4, "runs/cnn/model.ckpt-4")
    recorder.session_ended()
    with recorder.phase(phases.EVALUATION):
        clock.now += 2.0
    recorder.evaluated(4, {"loss": 0.5})
    clock.now += 0.5  # nothing covers this: "other"
    summary = recorder.finish()

    assert out.getvalue() == textwrap.dedent("""\
        phase | check the job | 0.3 s
        phase | load TensorFlow
        phase | load TensorFlow | 3.0 s
        phase | build the graph
        phase | build the graph | 1.0 s
        phase | initialise
        phase | initialise | 1.2 s
        phase | first step | XLA compiles the TPU program
        train | start | step 0/4 | batch 8 | model_dir runs/cnn
        train | loss: mean of the last 2 steps' losses, each the loss the optimizer minimizes (regularizers included)
        phase | still first step after 600 s | usually under 600 s | XLA compiles the TPU program before the first step runs: minutes for a big model | TPU node READY/HEALTHY for 602 s (its last reported state)
        phase | still first step after 1200 s | usually under 600 s | XLA compiles the TPU program before the first step runs: minutes for a big model | TPU node READY/HEALTHY for 1202 s (its last reported state)
        phase | first step | 1393.5 s
        train | step 2/4 | 0.0 steps/s | 0.011 examples/s | loss 0.7 | eta 0:23:14
        train | step 4/4 | 2.0 steps/s | 16 examples/s | loss 0.5 | eta 0:00:00
        checkpoint | step 4 | runs/cnn/model.ckpt-4
        phase | evaluation
        phase | evaluation | 2.0 s
        eval | step 4 | loss 0.5
        input | steps waited for input 50 % of 1.5 s of training | input-bound | may help: store data.features.image raw instead of PNG/JPEG
        done | step 4/4 | 4 steps in 1395.0 s | 0.0 steps/s | 0.023 examples/s | loss 0.5 | goodput 0 % | checkpoint runs/cnn/model.ckpt-4
        """)
    # Exclusive seconds: the checkpoints (1.0 s) are not initialisation or training.
    wall, seconds = recorder.phases.snapshot()
    assert wall == clock.now - 0.0
    assert seconds == pytest.approx({phases.CHECK: 0.3, phases.LOAD: 3.0, phases.BUILD: 1.0, phases.INITIALISE: 0.7,
                                     phases.CHECKPOINT: 1.0, phases.FIRST_STEP: 1393.5, phases.TRAINING: 1.5,
                                     phases.EVALUATION: 2.0, phases.OTHER: 0.5})
    assert sum(seconds.values()) == pytest.approx(wall)
    assert summary.goodput == pytest.approx(1.5 / wall)
    assert summary.input_share == pytest.approx(0.5)
