"""What happens during a run, as plain data, and the recorder that keeps the run's state.

The engine's hooks and the runner tell a `RunRecorder` what happened (a training session began at
step 0, a session run ended at step 37 with loss 0.61, a checkpoint was written, an evaluation
finished, the TPU was lost...). The recorder accumulates the run's state — steps, rates, the
smoothed loss, evaluations, TPU events and resumes, skipped records — which the runner asks for its
decisions, and hands each event below to its subscribers: the renderers (`cli/render/run_plain.py`,
`run_live.py`). A quiet run has no subscriber. Nothing here knows about TensorFlow or a console;
the clock is a parameter, as in rich's Progress, so a test can drive a whole run by hand.

The recorder also keeps the run's phases (`run.phases`): the CLI, the runner and the engine's hooks
open and close them, each change is an event, and the exclusive seconds per phase add up to the
run's wall time, for the run record and the goodput.
"""

from __future__ import annotations

import collections
import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from tpulaunch.run.phases import TRAINING, PhaseClock

# The share of training time spent waiting for input above which a run is input-bound, and the share
# below which input does not matter: TensorFlow's profiler draws the same lines ("HIGHLY" /
# "MODERATELY input-bound", kHighlyInfeedBoundThresholdInPercent = 20, kModerately... = 5).
INPUT_BOUND_SHARE = 0.20
INPUT_MATTERS_SHARE = 0.05
# Session runs (after each session's first) needed before the share says anything.
INPUT_MIN_RUNS = 3

# ------------------------------------------------------------------------------------------ events


@dataclass(frozen=True)
class TrainingStarted:
    """The run's first training session opened at `step` (after restoring any checkpoint)."""

    step: int
    total_steps: int
    batch_size: int
    model_dir: Optional[str] = None
    loss_window: int = 1  # the progress lines' loss is the mean of the last this many steps' losses


@dataclass(frozen=True)
class PhaseStarted:
    """The run entered a phase (`run.phases`); `detail` says what happens in it when that helps."""

    name: str
    detail: Optional[str] = None


@dataclass(frozen=True)
class PhaseEnded:
    """A phase ended after `seconds` (phases inside it included)."""

    name: str
    seconds: float


@dataclass(frozen=True)
class PhaseSlow:
    """A phase runs far past what is usual: it has run `seconds` (in training: `seconds` without a
    finished step since `last_step`), where it usually takes under `usual_s`; `known`: what else is known."""

    name: str
    seconds: float
    usual_s: float
    known: Tuple[str, ...] = ()
    last_step: Optional[int] = None


@dataclass(frozen=True)
class InputShare:
    """How much of the training time the steps waited for their input (the end of training).

    `share` of `seconds` measured; `bound`: share >= INPUT_BOUND_SHARE; `help`: what would help the job.
    """

    share: float
    seconds: float
    bound: bool
    help: Tuple[str, ...] = ()


@dataclass(frozen=True)
class ProfileCaptured:
    """A TensorBoard profile of global steps `first` to `last` was written under `logdir` (at `path`)."""

    first: int
    last: int
    logdir: str
    path: str


@dataclass(frozen=True)
class RunClosed:
    """Nothing more will happen in this run (live displays stop)."""


@dataclass(frozen=True)
class Note:
    """A one-line message between progress output (where training resumes, a skipped checkpoint...)."""

    text: str


@dataclass(frozen=True)
class StepProgress:
    """Where training is: `step`, its rates, the smoothed loss.

    `eta_s` is 0 once `step` reaches `total_steps` and None while no rate is known; `skipped` is the
    records dropped under data.skip_corrupt so far (None: nobody counts them).
    """

    step: int
    total_steps: int
    steps_per_sec: Optional[float]
    examples_per_sec: Optional[float]
    loss: Optional[float]
    eta_s: Optional[float]
    skipped: Optional[int]


@dataclass(frozen=True)
class StepsRun(StepProgress):
    """A session run finished; rates over the current session."""


@dataclass(frozen=True)
class StepsLogged(StepProgress):
    """A log point (every `log_every_steps`, and the last step); rates since the previous log point."""


@dataclass(frozen=True)
class CheckpointSaved:
    """A checkpoint was written at `step` (not the save that only restates where a session began)."""

    step: int
    path: Optional[str] = None


@dataclass(frozen=True)
class RecordsSkipped:
    """The input pipelines dropped the run's first records under data.skip_corrupt (`count` so far).

    Later counts ride on `StepsRun.skipped` and the summary.
    """

    count: int


@dataclass(frozen=True)
class LeftOut:
    """An evaluation that read the whole eval set but its last records, too few for a whole batch (every engine
    evaluates whole batches: a TPU's shapes are static): its metrics are the mean over `examples`, not over all."""

    examples: int  # the examples evaluated
    records: int  # the eval set's records after its last whole batch, not evaluated


@dataclass(frozen=True)
class EvalResult:
    """One evaluation: the global step it scored and its metrics (loss included)."""

    step: int
    metrics: Dict[str, float]
    records_skipped: Optional[int] = None  # eval records dropped under data.skip_corrupt; None: not counted
    left_out: Optional[LeftOut] = None  # the eval set's partial last batch, not evaluated; None: nothing left out


@dataclass
class NodeEvent:
    """The TPU was lost during training (the API reported it, or TensorFlow raised a lost-TPU error).

    Attributes:
        kind: "node" (the TPU API's state/health) or "error" (a TensorFlow error).
        detail: "PREEMPTED", "READY/UNHEALTHY_TENSORFLOW", "UnavailableError: Socket closed", ...
        step: the global step training had reached when it stopped.
        checkpoint_step: the step of the last complete checkpoint after the stop (0: none).
        resumed: whether training resumed after it.
        recreated: whether the TPU was deleted and created again to resume (`train --recreate`).
        recovery_s: seconds from noticing the loss to the first step trained after it (None: not resumed).
        noticed_at: time.monotonic() when the loss was noticed (not shown; what recovery_s counts from).
    """

    kind: str
    detail: str
    step: Optional[int] = None
    checkpoint_step: Optional[int] = None
    resumed: bool = False
    recreated: bool = False
    recovery_s: Optional[float] = None
    noticed_at: Optional[float] = field(default=None, compare=False, repr=False)

    @property
    def steps_lost(self) -> int:
        """Steps trained after the last complete checkpoint: they are run again after a resume."""
        if self.step is None or self.checkpoint_step is None:
            return 0
        return max(0, self.step - self.checkpoint_step)


@dataclass(frozen=True)
class NodeWaiting:
    """Waiting for the TPU to be usable again; `state` is what it is now ("PREEMPTED", an API error...).

    `new_state`: the first wait in this state (a line is worth writing; otherwise only the countdown moved).
    """

    state: str
    seconds_left: float
    new_state: bool


@dataclass(frozen=True)
class NodeReady:
    """The TPU is usable again; training resumes from the checkpoint at `step` (resume `resume` of `allowed`)."""

    state: str
    step: int
    resume: int
    allowed: int
    recreated_in_s: Optional[float] = None  # the node was created again, in this many seconds


@dataclass(frozen=True)
class TrainSummary:
    """What a training run did (the last event of a run). Rates count only time spent in training sessions."""

    start_step: int
    final_step: int
    total_steps: int
    steps_run: int
    seconds: float
    steps_per_sec: Optional[float]
    examples_per_sec: Optional[float]
    loss: Optional[float]
    last_checkpoint: Optional[str]
    evals: List[EvalResult] = field(default_factory=list)
    stopped_by: Optional[str] = None  # "SIGINT" / "SIGTERM" / "TPU PREEMPTED" when training was interrupted
    events: List[NodeEvent] = field(default_factory=list)  # TPU losses, in order
    resumes: int = 0  # automatic resumes after them
    records_skipped: Optional[int] = None  # records dropped under data.skip_corrupt; None: not counted
    goodput: Optional[float] = None  # share of the run's wall time spent stepping; None: the run was not timed
    input_share: Optional[float] = None  # share of training time the steps waited for input; None: not measured

    @property
    def steps_lost(self) -> int:
        return sum(event.steps_lost for event in self.events)


Subscriber = Callable[[object], None]

# ---------------------------------------------------------------------------------------- recorder


class RunRecorder:
    """The state of one `train` (possibly several sessions, with evaluations and resumes in between) or `evaluate`.

    Args:
        total_steps: the global step training stops at.
        batch_size: global batch size (for examples/s).
        log_every_steps: a log point every this many steps (and the loss smoothing window).
        model_dir: where checkpoints go (named by the start event).
        get_time: the clock, in seconds. Defaults to time.monotonic.
        started_at: when the run began on that clock (its wall time, phases and goodput count from
            there). None: when its first phase opens.
        input_help: what would help this job's input pipeline (shown when training is input-bound).
    """

    def __init__(self, *, total_steps: int = 0, batch_size: int = 0, log_every_steps: int = 100,
                 model_dir: Optional[str] = None, get_time: Callable[[], float] = time.monotonic,
                 started_at: Optional[float] = None, input_help: Tuple[str, ...] = ()):
        if log_every_steps < 1:
            raise ValueError(f"`log_every_steps` must be >= 1, got {log_every_steps}")
        self.total_steps = total_steps
        self.batch_size = batch_size
        self.log_every_steps = log_every_steps
        self.model_dir = model_dir
        self.get_time = get_time
        self._subscribers: List[Subscriber] = []
        self._losses: collections.deque = collections.deque(maxlen=log_every_steps)
        self.start_step: Optional[int] = None
        self.step = 0
        self.last_checkpoint: Optional[str] = None
        self.evals: List[EvalResult] = []
        self.events: List[NodeEvent] = []
        self.resumes = 0
        self._recovering: Optional[NodeEvent] = None  # resumed, waiting for its first step (recovery_s)
        self._seconds = 0.0  # training time over finished segments
        self._steps_run = 0
        self._segment: Optional[tuple] = None  # (step, time) when the current session began
        self._last_update: Optional[tuple] = None
        self._logged: Optional[tuple] = None  # (step, time) of the last log point, for the interval rate
        self._next_log = 0
        self._waiting: Optional[str] = None  # the state the last wait for the TPU reported
        self._skipped_before: Optional[int] = None  # records skipped in finished sessions (None: not counted)
        self._skipped_now = 0  # ... and in the current one
        self.phases = PhaseClock(get_time, started_at)
        self.input_help = tuple(input_help)
        self._first_run = False  # the next session run is its session's first (start-up, not steady state)
        self._input_wait = 0.0  # seconds the measured session runs waited for input ...
        self._input_timed = 0.0  # ... out of these seconds
        self._input_runs = 0
        self._steady = [0, 0.0]  # steps and seconds of session runs after each session's first
        self.node_state: Optional[Tuple[str, float]] = None  # the TPU node's last reported state, and since when
        self.profile: Optional[str] = None  # where a profile of this run went
        self.stopped_by: Optional[str] = None  # what stopped training, once finished
        self._closed = False

    def subscribe(self, subscriber: Subscriber) -> Subscriber:
        """Hand every later event to `subscriber` (a renderer)."""
        self._subscribers.append(subscriber)
        return subscriber

    def _emit(self, event) -> None:
        for subscriber in self._subscribers:
            subscriber(event)

    # ------------------------------------------------------------------------------- training

    def session_began(self, step: int) -> None:
        """A training session starts at global step `step` (after restoring any checkpoint)."""
        now = self.get_time()
        first = self.start_step is None
        if first:
            self.start_step = step
        self.step = max(self.step, step)
        self._segment = self._logged = self._last_update = (step, now)
        self._first_run = True
        self._next_log = (step // self.log_every_steps + 1) * self.log_every_steps
        if first:
            self._emit(TrainingStarted(step, self.total_steps, self.batch_size, self.model_dir,
                                       self._losses.maxlen or 1))

    def at_step(self, step: int) -> None:
        """Training is already at `step` (no session will run): the summary starts and ends there."""
        if self.start_step is None:
            self.start_step = step
        self.step = max(self.step, step)

    def note(self, text: str) -> None:
        self._emit(Note(text))

    def wants_exact_step(self, estimate: int) -> bool:
        """Whether `steps_run(estimate)` would be a log point (so the caller should read the exact step)."""
        return estimate >= self._next_log or estimate >= self.total_steps

    def steps_run(self, step: int, loss: Optional[float], input_wait: Optional[float] = None) -> None:
        """A session run finished; the global step is now `step`.

        `input_wait`: seconds the run waited for its input batch (None: not measured). A session's
        first run (start-up: the pipeline fills, XLA compiles) does not count towards the share.
        """
        now = self.get_time()
        if self._segment is None:
            self.session_began(step)
        previous_step, previous_time = self._last_update
        self._steps_run += max(0, step - previous_step)
        self._seconds += max(0.0, now - previous_time)
        if not self._first_run:
            self._steady[0] += max(0, step - previous_step)
            self._steady[1] += max(0.0, now - previous_time)
            if input_wait is not None:
                self._input_wait += max(0.0, input_wait)
                self._input_timed += max(0.0, now - previous_time)
                self._input_runs += 1
        self._first_run = False
        self._last_update = (max(step, previous_step), now)
        recovering = self._recovering
        if recovering is not None and step > (recovering.checkpoint_step or 0):
            recovering.recovery_s = round(max(0.0, now - (recovering.noticed_at if recovering.noticed_at is not None
                                                          else now)), 3)
            self._recovering = None
        self.step = max(self.step, step)
        if loss is not None:
            self._losses.append(float(loss))
        self._emit(self._steps(StepsRun, step, _rate(*self._segment, step, now)))
        if step >= self._next_log or step >= self.total_steps:
            self._emit(self._steps(StepsLogged, step, _rate(*self._logged, step, now)))
            self._logged = (step, now)
            self._next_log = (step // self.log_every_steps + 1) * self.log_every_steps

    def rolled_back(self, step: int, checkpoint: Optional[str]) -> None:
        """The run went back to `checkpoint` at `step` (a NaN or Inf loss, `train.on_nan`): a stop before training
        passes its old step again reports this step and checkpoint, not the NaN step's, and no loss of it."""
        self.step = step
        self.last_checkpoint = checkpoint
        self._losses.clear()

    def session_ended(self) -> None:
        """The training session closed (evaluation or the end of training follows)."""
        self._segment = None

    def checkpoint_saved(self, step: int, path: Optional[str] = None) -> None:
        """A checkpoint was written at `step`. The save that only restates the starting point is no event.

        That save happens as a session opens: before the progress hook's `session_began` (no
        segment yet) or just after it (at the segment's first step), depending on hook order.
        """
        self.last_checkpoint = path or self.last_checkpoint
        if self._segment is None or step == self._segment[0]:
            return
        self._emit(CheckpointSaved(step, path))

    @property
    def last_step_at(self) -> Optional[float]:
        """When the last session run of the open training session finished (or it began); None outside one."""
        return self._last_update[1] if self._segment is not None and self._last_update else None

    @property
    def steps_per_sec(self) -> Optional[float]:
        """Steps per second over the time spent in training sessions so far; None before any."""
        return self._steps_run / self._seconds if self._seconds > 0 and self._steps_run else None

    @property
    def steady_steps_per_sec(self) -> Optional[float]:
        """Steps per second leaving out each session's first run (start-up: filling buffers, compiling)."""
        steps, seconds = self._steady
        return steps / seconds if seconds > 0 and steps else None

    @property
    def input_share(self) -> Optional[float]:
        """Share of the measured training time spent waiting for input; None when not measured (enough)."""
        if self._input_runs < INPUT_MIN_RUNS or self._input_timed <= 0:
            return None
        return min(1.0, self._input_wait / self._input_timed)

    @property
    def smoothed_loss(self) -> Optional[float]:
        return sum(self._losses) / len(self._losses) if self._losses else None

    def _steps(self, kind, step: int, rate: Optional[float]) -> StepProgress:
        if step >= self.total_steps:
            eta = 0.0
        else:
            eta = (self.total_steps - step) / rate if rate else None
        return kind(step=step, total_steps=self.total_steps, steps_per_sec=rate,
                    examples_per_sec=rate * self.batch_size if rate is not None else None,
                    loss=self.smoothed_loss, eta_s=eta, skipped=self.skipped)

    # ------------------------------------------------------------------------- skipped records

    def skip_counting_began(self) -> None:
        """A session starts whose input pipelines count records skipped under data.skip_corrupt (from 0)."""
        self._skipped_before = (self._skipped_before or 0) + self._skipped_now  # a session cut short included
        self._skipped_now = 0

    def records_skipped(self, in_session: int, *, session_ended: bool = False) -> None:
        """The input pipeline has skipped `in_session` bad records in this session (data.skip_corrupt)."""
        before = self._skipped_before or 0
        first = before + self._skipped_now == 0 and in_session > 0
        if session_ended:
            self._skipped_before, self._skipped_now = before + in_session, 0
        else:
            self._skipped_before, self._skipped_now = before, in_session
        if first:
            self._emit(RecordsSkipped(in_session))

    @property
    def skipped(self) -> Optional[int]:
        """Records skipped so far, over all sessions; None when nobody counts them."""
        return None if self._skipped_before is None else self._skipped_before + self._skipped_now

    # ------------------------------------------------------------------------------ evaluation

    def evaluated(self, step: int, metrics: Dict[str, float], records_skipped: Optional[int] = None,
                  left_out: Optional[LeftOut] = None) -> EvalResult:
        """An evaluation of the checkpoint at `step` finished (`left_out`: the eval set's records it did not read)."""
        result = EvalResult(step, {k: float(v) for k, v in metrics.items() if k != "global_step"}, records_skipped,
                            left_out)
        self.evals.append(result)
        self._emit(result)
        return result

    # ------------------------------------------------------------------------------------- TPU

    def node_lost(self, event: NodeEvent) -> None:
        """Training stopped because the TPU was lost; `event` has the step and the checkpoint step."""
        if event.noticed_at is None:  # the watchdog stamps it with time.monotonic(), this recorder's default clock
            event.noticed_at = self.get_time()
        self.events.append(event)
        self._segment = None
        self._waiting = None
        self._emit(event)

    def node_waiting(self, state: str, seconds_left: float) -> None:
        """Waiting for the TPU to be usable again; `state` is what it is now."""
        new_state = self._waiting != state
        self._waiting = state
        self._emit(NodeWaiting(state, seconds_left, new_state))

    def node_ready(self, state: str, step: int, allowed: int, recreated_in_s: Optional[float] = None) -> None:
        """The TPU is usable again (created anew in `recreated_in_s` seconds, when it was); training resumes
        from the checkpoint at `step`. The first step after it completes the event's `recovery_s`."""
        self.resumes += 1
        if self.events:
            self.events[-1].resumed = True
            self.events[-1].recreated = recreated_in_s is not None
            self._recovering = self.events[-1]
        self._waiting = None
        self._emit(NodeReady(state, step, self.resumes, allowed, recreated_in_s))

    def node_seen(self, state: str) -> None:
        """The TPU node reported `state` ("READY/HEALTHY"...): what a slow phase's notice can tell."""
        self.node_state = (state, self.get_time())

    def profile_captured(self, first: int, last: int, logdir: str, path: str) -> None:
        """A profile of steps `first` to `last` was written to `path` (TensorBoard reads it under `logdir`)."""
        self.profile = path
        self._emit(ProfileCaptured(first, last, logdir, path))

    # ---------------------------------------------------------------------------------- phases

    def phase_began(self, name: str, detail: Optional[str] = None) -> None:
        """The run enters phase `name` (inside any open one)."""
        self.phases.enter(name)
        self._emit(PhaseStarted(name, detail))

    def phase_ended(self, name: str) -> None:
        """Phase `name` ended (with anything still open inside it); nothing when it is not open."""
        for closed, seconds in self.phases.leave(name):
            self._emit(PhaseEnded(closed, seconds))

    def phase_switch(self, name: str, detail: Optional[str] = None) -> None:
        """The innermost open phase ends and `name` begins in its place."""
        current = self.phases.current()
        if current is not None:
            self.phase_ended(current[0])
        self.phase_began(name, detail)

    def phase_done(self, name: str, since: Optional[float]) -> None:
        """Phase `name` ran from `since` (None: now) until now: it was under way before anyone could be told."""
        self.phases.enter(name, at=since)
        self.phase_ended(name)

    def phase_slow(self, name: str, seconds: float, usual_s: float, known: Tuple[str, ...] = (),
                   last_step: Optional[int] = None) -> None:
        """Phase `name` has run `seconds`, far past the usual `usual_s` (the phase watch says so)."""
        self._emit(PhaseSlow(name, seconds, usual_s, tuple(known), last_step))

    @contextlib.contextmanager
    def phase(self, name: str, detail: Optional[str] = None) -> Iterator[None]:
        """Phase `name` for the `with` block, however it ends."""
        self.phase_began(name, detail)
        try:
            yield
        finally:
            self.phase_ended(name)

    @contextlib.contextmanager
    def phase_scope(self) -> Iterator[None]:
        """Whatever phases open inside the block (an engine's hooks) are closed when it ends, however it ends."""
        outer = self.phases.open_phases()
        try:
            yield
        finally:
            inside = self.phases.open_phases()[len(outer):]
            if inside:
                self.phase_ended(inside[0])

    def goodput(self) -> Optional[float]:
        """Share of the run's wall time spent stepping (training, less the steps run again after a lost TPU).

        None when the run was not timed (no start, no phase).
        """
        wall, seconds = self.phases.snapshot()
        if not wall:
            return None
        stepping = seconds.get(TRAINING, 0.0)
        lost = sum(event.steps_lost for event in self.events)
        if self._steps_run and lost:
            stepping *= max(0, self._steps_run - lost) / self._steps_run
        return min(1.0, stepping / wall)

    # ------------------------------------------------------------------------------------- end

    def finish(self, stopped_by: Optional[str] = None) -> TrainSummary:
        """Training ended (or stopped): the summary, also handed to the subscribers (after the input share)."""
        self._segment = None
        self.stopped_by = stopped_by
        share = self.input_share
        if share is not None:
            self._emit(InputShare(share, self._input_timed, share >= INPUT_BOUND_SHARE, self.input_help))
        summary = self.summary(stopped_by)
        self._emit(summary)
        return summary

    def close(self) -> None:
        """The run is over (after its record is written): live displays stop. Only the first call counts."""
        if not self._closed:
            self._closed = True
            self._emit(RunClosed())

    def summary(self, stopped_by: Optional[str] = None) -> TrainSummary:
        rate = self.steps_per_sec
        return TrainSummary(
            start_step=self.start_step if self.start_step is not None else self.step,
            final_step=self.step, total_steps=self.total_steps, steps_run=self._steps_run,
            seconds=self._seconds, steps_per_sec=rate,
            examples_per_sec=rate * self.batch_size if rate is not None else None,
            loss=self.smoothed_loss, last_checkpoint=self.last_checkpoint, evals=list(self.evals),
            stopped_by=stopped_by, events=list(self.events), resumes=self.resumes, records_skipped=self.skipped,
            goodput=self.goodput(), input_share=self.input_share)


def _rate(from_step: int, from_time: float, step: int, now: float) -> Optional[float]:
    if now <= from_time or step <= from_step:
        return None
    return (step - from_step) / (now - from_time)
