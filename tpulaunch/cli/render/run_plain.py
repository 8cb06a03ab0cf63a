"""Run events as fixed-format lines, one per event (pipes, CI logs, files)::

    train | start | step 0/1000 | batch 64 | model_dir runs/quickstart
    train | step 200/1000 | 41.2 steps/s | 2637 examples/s | loss 0.734 | eta 0:00:19
    checkpoint | step 200 | runs/quickstart/model.ckpt-200
    eval | step 200 | accuracy 0.912 | loss 0.301
    tpu | PREEMPTED | step 437 | checkpoint step 437 | 0 steps lost
    tpu | waiting for READY/HEALTHY | PREEMPTED | 3597 s left
    tpu | READY/HEALTHY | resuming from step 437 (resume 1 of 3)
    done | step 1000/1000 | 1000 steps in 24.3 s | 41.2 steps/s | 2637 examples/s | loss 0.1234

A train line is written at each log point (every `log_every_steps` and at the last step), not per step.
Phases get a line as they begin and one with their duration as they end, from the first moment of a
run (training, checkpoints and closing a session excepted); a phase far past its usual time says
so; the input share comes before the final line, which gains the goodput (after the loss)::

    phase | check the job | 0.3 s
    phase | load TensorFlow
    phase | load TensorFlow | 3.1 s
    phase | still first step after 600 s | usually under 600 s | XLA compiles the TPU program ...
    input | steps waited for input 63 % of 12.0 s of training | input-bound | may help: ...
"""

from __future__ import annotations

from functools import singledispatchmethod

from rich.console import Console

from tpulaunch.cli.render import run_text as text
from tpulaunch.run.events import (CheckpointSaved, EvalResult, InputShare, NodeEvent, NodeReady, NodeWaiting, Note,
                                  PhaseEnded, PhaseSlow, PhaseStarted, ProfileCaptured, RecordsSkipped, StepsLogged,
                                  TrainingStarted, TrainSummary)


class PlainRenderer:
    """Subscribe it to a `RunRecorder`: `recorder.subscribe(PlainRenderer(console))`."""

    def __init__(self, console: Console):
        self.console = console

    def _out(self, line: str) -> None:
        self.console.out(line, highlight=False)

    @singledispatchmethod
    def __call__(self, event) -> None:
        """Events without a line (each session run) are not written."""

    @__call__.register
    def _phase_started(self, event: PhaseStarted) -> None:
        if text.phase_shown(event.name):
            self._out(text.phase_started_text(event))

    @__call__.register
    def _phase_ended(self, event: PhaseEnded) -> None:
        if text.phase_shown(event.name):
            self._out(text.phase_ended_text(event))

    @__call__.register
    def _phase_slow(self, event: PhaseSlow) -> None:
        self._out(text.phase_slow_text(event))

    @__call__.register
    def _input(self, event: InputShare) -> None:
        self._out(text.input_text(event))

    @__call__.register
    def _profile(self, event: ProfileCaptured) -> None:
        self._out(text.profile_text(event))

    @__call__.register
    def _started(self, event: TrainingStarted) -> None:
        self._out(text.start_text(event))

    @__call__.register
    def _logged(self, event: StepsLogged) -> None:
        self._out(text.train_text(event))

    @__call__.register
    def _note(self, event: Note) -> None:
        self._out(event.text)

    @__call__.register
    def _skipped(self, event: RecordsSkipped) -> None:
        self._out(text.first_skipped_text(event.count))

    @__call__.register
    def _checkpoint(self, event: CheckpointSaved) -> None:
        self._out(f"checkpoint | step {event.step}" + (f" | {event.path}" if event.path else ""))

    @__call__.register
    def _evaluated(self, event: EvalResult) -> None:
        self._out(text.eval_text(event))

    @__call__.register
    def _node_lost(self, event: NodeEvent) -> None:
        self._out(text.node_lost_text(event))

    @__call__.register
    def _node_waiting(self, event: NodeWaiting) -> None:
        if event.new_state:
            self._out(text.node_waiting_text(event))

    @__call__.register
    def _node_ready(self, event: NodeReady) -> None:
        self._out(text.node_ready_text(event))

    @__call__.register
    def _finished(self, event: TrainSummary) -> None:
        self._out(text.summary_text(event))
