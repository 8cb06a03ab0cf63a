"""Training progress: a rich live display on a terminal, fixed-format lines everywhere else.

`TrainProgress` is fed events (segment begins, steps with their loss, checkpoints, evaluation
results) and knows nothing about TensorFlow; `progress_hooks` adapts it to a SessionRunHook and a
CheckpointSaverListener. The clock and the console are parameters, so the output is testable.

Plain lines (when stdout is not a terminal, or CI is set) look like::

    train | start | step 0/1000 | batch 64 | model_dir runs/quickstart
    train | step 200/1000 | 41.2 steps/s | 2637 examples/s | loss 0.734 | eta 0:00:19
    checkpoint | step 200 | runs/quickstart/model.ckpt-200
    eval | step 200 | accuracy 0.912 | loss 0.301
    tpu | PREEMPTED | step 437 | checkpoint step 437 | 0 steps lost
    tpu | waiting for READY/HEALTHY | PREEMPTED | 3597 s left
    tpu | READY/HEALTHY | resuming from step 437 (resume 1 of 3)
    done | step 1000/1000 | 24.3 s | 41.2 steps/s | 2637 examples/s | loss 0.1234
"""

from __future__ import annotations

import collections
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table


@dataclass(frozen=True)
class EvalResult:
    """One evaluation: the global step it scored and its metrics (loss included)."""

    step: int
    metrics: Dict[str, float]
    records_skipped: Optional[int] = None  # eval records dropped under data.skip_corrupt; None: not counted


@dataclass
class NodeEvent:
    """The TPU was lost during training (the API reported it, or TensorFlow raised a lost-TPU error).

    Attributes:
        kind: "node" (the TPU API's state/health) or "error" (a TensorFlow error).
        detail: "PREEMPTED", "READY/UNHEALTHY_TENSORFLOW", "UnavailableError: Socket closed", ...
        step: the global step training had reached when it stopped.
        checkpoint_step: the step of the last complete checkpoint after the stop (0: none).
        resumed: whether training resumed after it.
    """

    kind: str
    detail: str
    step: Optional[int] = None
    checkpoint_step: Optional[int] = None
    resumed: bool = False

    @property
    def steps_lost(self) -> int:
        """Steps trained after the last complete checkpoint: they are run again after a resume."""
        if self.step is None or self.checkpoint_step is None:
            return 0
        return max(0, self.step - self.checkpoint_step)


@dataclass(frozen=True)
class TrainSummary:
    """What a training run did. Rates count only time spent in training sessions (not evaluation)."""

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

    @property
    def steps_lost(self) -> int:
        return sum(event.steps_lost for event in self.events)


def skipped_text(count: int) -> str:
    """How summaries and evaluations state the records dropped under data.skip_corrupt."""
    return f"{count} record{'s' if count != 1 else ''} skipped (data.skip_corrupt)"


def render_eval(console: Console, result: EvalResult, *, plain: bool) -> None:
    """One evaluation: a fixed-format line (plain) or a table; metrics by name, loss last."""
    shown = result.metrics
    names = sorted(k for k in shown if k != "loss") + (["loss"] if "loss" in shown else [])
    skipped = None if result.records_skipped is None else skipped_text(result.records_skipped)
    if plain:
        parts = [f"eval | step {result.step}"] + [f"{k} {format_value(shown[k])}" for k in names]
        console.out(" | ".join(parts + ([skipped] if skipped else [])), highlight=False)
        return
    table = Table(title=f"eval at step {result.step}", title_justify="left", caption=skipped, caption_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k in names:
        table.add_row(k, format_value(shown[k]))
    console.print(table)


def plain_output(console: Console) -> bool:
    """Fixed-format lines instead of a live display: not a terminal, or running under CI."""
    return not console.is_terminal or bool(os.environ.get("CI"))


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def format_value(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.4g}"


def format_rate(value: float) -> str:
    """Whole numbers for fast rates; decimals where a whole number would read 0 (big volumes on a CPU)."""
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


class TrainProgress:
    """Progress of one `train` (possibly several sessions, with evaluations in between).

    Args:
        console: where to write.
        total_steps: the global step training stops at.
        batch_size: global batch size (for examples/s).
        log_every_steps: a plain line every this many steps (and the loss smoothing window).
        get_time: the clock, in seconds. Defaults to time.monotonic.
        plain: force plain lines (True) or the live display (False). Defaults to `plain_output(console)`.
        auto_refresh: let the live display refresh itself (off in tests).
        disable: print nothing at all.
    """

    def __init__(self, console: Console, *, total_steps: int, batch_size: int, log_every_steps: int = 100,
                 get_time: Callable[[], float] = time.monotonic, plain: Optional[bool] = None,
                 auto_refresh: bool = True, disable: bool = False, model_dir: Optional[str] = None):
        if log_every_steps < 1:
            raise ValueError(f"`log_every_steps` must be >= 1, got {log_every_steps}")
        self.console = console
        self.total_steps = total_steps
        self.batch_size = batch_size
        self.log_every_steps = log_every_steps
        self.get_time = get_time
        self.plain = plain_output(console) if plain is None else plain
        self.disable = disable
        self.model_dir = model_dir
        self._auto_refresh = auto_refresh
        self._live: Optional[Progress] = None
        self._task = None
        self._losses: collections.deque = collections.deque(maxlen=log_every_steps)
        self.start_step: Optional[int] = None
        self.step = 0
        self.last_checkpoint: Optional[str] = None
        self.evals: List[EvalResult] = []
        self._seconds = 0.0  # training time over finished segments
        self._steps_run = 0
        self._segment: Optional[tuple] = None  # (step, time) when the current session began
        self._last_update: Optional[tuple] = None
        self._line: Optional[tuple] = None  # (step, time) of the last line, for the interval rate
        self._next_line = 0
        self.events: List[NodeEvent] = []
        self.resumes = 0
        self._waiting: Optional[tuple] = None  # what the last waiting line said
        self._skipped_before: Optional[int] = None  # records skipped in finished sessions (None: not counted)
        self._skipped_now = 0  # ... and in the current one

    # ---------------------------------------------------------------------------------- events

    def begin(self, step: int) -> None:
        """A training session starts at global step `step` (after restoring any checkpoint)."""
        now = self.get_time()
        first = self.start_step is None
        if first:
            self.start_step = step
        self.step = max(self.step, step)
        self._segment = self._line = self._last_update = (step, now)
        self._next_line = (step // self.log_every_steps + 1) * self.log_every_steps
        if first and not self.disable:
            if self.plain:
                where = f" | model_dir {self.model_dir}" if self.model_dir else ""
                self._out(f"train | start | step {step}/{self.total_steps} | batch {self.batch_size}{where}")
            else:
                self._start_live(step)

    def at_step(self, step: int) -> None:
        """Training is already at `step` (no session will run): the summary starts and ends there."""
        if self.start_step is None:
            self.start_step = step
        self.step = max(self.step, step)

    def note(self, text: str) -> None:
        """A one-line message between progress output (e.g. where training resumes)."""
        if not self.disable:
            self._out(text, style=None if self.plain else "dim")

    def session_counts_skipped_records(self) -> None:
        """A session starts whose input pipelines count records skipped under data.skip_corrupt (from 0)."""
        self._skipped_before = (self._skipped_before or 0) + self._skipped_now  # a session cut short included
        self._skipped_now = 0

    def records_skipped(self, in_session: int, *, session_ended: bool = False) -> None:
        """The input pipeline has skipped `in_session` bad records in this session (data.skip_corrupt)."""
        before = self._skipped_before or 0
        if before + self._skipped_now == 0 and in_session > 0:
            self.note(f"data.skip_corrupt: skipping records that fail to parse ({in_session} so far)")
        if session_ended:
            self._skipped_before, self._skipped_now = before + in_session, 0
        else:
            self._skipped_before, self._skipped_now = before, in_session

    @property
    def skipped(self) -> Optional[int]:
        """Records skipped so far, over all sessions; None when nobody counts them."""
        return None if self._skipped_before is None else self._skipped_before + self._skipped_now

    def wants_exact_step(self, estimate: int) -> bool:
        """Whether the next `update` prints a line (so the caller should read the exact step)."""
        return estimate >= self._next_line or estimate >= self.total_steps

    def update(self, step: int, loss: Optional[float]) -> None:
        """A session run finished; the global step is now `step`."""
        now = self.get_time()
        if self._segment is None:
            self.begin(step)
        previous_step, previous_time = self._last_update
        self._steps_run += max(0, step - previous_step)
        self._seconds += max(0.0, now - previous_time)
        self._last_update = (max(step, previous_step), now)
        self.step = max(self.step, step)
        if loss is not None:
            self._losses.append(float(loss))
        if self.disable:
            return
        if self.plain:
            if step >= self._next_line or step >= self.total_steps:
                self._out(self._train_line(step, now))
                self._line = (step, now)
                self._next_line = (step // self.log_every_steps + 1) * self.log_every_steps
        elif self._live is not None:
            rate = self._rate(*self._segment, step, now)
            self._live.update(self._task, completed=min(step, self.total_steps), **self._fields(step, rate))

    def end_segment(self) -> None:
        """The training session closed (evaluation or the end of training follows)."""
        self._segment = None

    def checkpoint(self, step: int, path: Optional[str] = None) -> None:
        """A checkpoint was written at `step`. The save that only restates the starting point is not shown.

        That save happens as a session opens: before the progress hook's `begin` (no segment yet)
        or just after it (at the segment's first step), depending on hook order.
        """
        self.last_checkpoint = path or self.last_checkpoint
        if self.disable or self._segment is None or step == self._segment[0]:
            return
        if self.plain:
            self._out(f"checkpoint | step {step}" + (f" | {path}" if path else ""))
        elif self._live is not None:
            self._live.update(self._task, ckpt=f"ckpt {step}")

    def evaluated(self, step: int, metrics: Dict[str, float], records_skipped: Optional[int] = None) -> EvalResult:
        """An evaluation of the checkpoint at `step` finished."""
        shown = {k: float(v) for k, v in metrics.items() if k != "global_step"}
        result = EvalResult(step, shown, records_skipped)
        self.evals.append(result)
        if not self.disable:
            render_eval(self._live.console if self._live is not None else self.console, result, plain=self.plain)
        return result

    def node_event(self, event: NodeEvent) -> None:
        """Training stopped because the TPU was lost; `event` has the step and the checkpoint step."""
        self.events.append(event)
        self._segment = None
        self._waiting = None
        if self.disable:
            return
        checkpoint = f"checkpoint step {event.checkpoint_step}" if event.checkpoint_step else "no checkpoint"
        self._out(f"tpu | {event.detail} | step {event.step} | {checkpoint} | {event.steps_lost} steps lost",
                  style=None if self.plain else "bold yellow")
        if self._live is not None:
            self._live.update(self._task, node=f"TPU {event.detail}")

    def node_waiting(self, state: str, seconds_left: float) -> None:
        """Waiting for the TPU to be usable again; `state` is what it is now ("PREEMPTED", an API error...).

        A line is written when `state` changes (the live display shows the countdown).
        """
        if self.disable:
            return
        if self._live is not None:
            self._live.update(self._task, node=f"waiting for TPU: {state} ({seconds_left:.0f} s left)")
        if self._waiting != (state,):
            self._waiting = (state,)
            self._out(f"tpu | waiting for READY/HEALTHY | {state} | {seconds_left:.0f} s left",
                      style=None if self.plain else "yellow")

    def node_ready(self, state: str, step: int, allowed: int) -> None:
        """The TPU is usable again; training resumes from the checkpoint at `step`."""
        self.resumes += 1
        if self.events:
            self.events[-1].resumed = True
        self._waiting = None
        if self.disable:
            return
        if self._live is not None:
            self._live.update(self._task, node="")
        self._out(f"tpu | {state} | resuming from step {step} (resume {self.resumes} of {allowed})",
                  style=None if self.plain else "green")

    def finish(self, stopped_by: Optional[str] = None) -> TrainSummary:
        """Training ended (or stopped on a signal): close the display, print and return the summary."""
        self._segment = None
        summary = self.summary(stopped_by)
        if self._live is not None:
            self._live.stop()
            self._live = None
        if not self.disable:
            self._out(self._summary_line(summary), style=None if self.plain else ("yellow" if stopped_by else "green"))
        return summary

    def summary(self, stopped_by: Optional[str] = None) -> TrainSummary:
        rate = self._steps_run / self._seconds if self._seconds > 0 and self._steps_run else None
        return TrainSummary(
            start_step=self.start_step if self.start_step is not None else self.step,
            final_step=self.step, total_steps=self.total_steps, steps_run=self._steps_run,
            seconds=self._seconds, steps_per_sec=rate,
            examples_per_sec=rate * self.batch_size if rate is not None else None,
            loss=self.smoothed_loss, last_checkpoint=self.last_checkpoint, evals=list(self.evals),
            stopped_by=stopped_by, events=list(self.events), resumes=self.resumes, records_skipped=self.skipped)

    @property
    def smoothed_loss(self) -> Optional[float]:
        return sum(self._losses) / len(self._losses) if self._losses else None

    # ----------------------------------------------------------------------------------- lines

    def _train_line(self, step: int, now: float) -> str:
        rate = self._rate(*self._line, step, now)
        parts = [f"train | step {step}/{self.total_steps}"]
        if rate is None:
            parts += ["- steps/s", "- examples/s"]
        else:
            parts += [f"{rate:.1f} steps/s", f"{format_rate(rate * self.batch_size)} examples/s"]
        parts.append(f"loss {format_value(self.smoothed_loss)}")
        parts.append(f"eta {self._eta(step, rate)}")
        if self.skipped:
            parts.append(f"skipped {self.skipped}")
        return " | ".join(parts)

    def _summary_line(self, s: TrainSummary) -> str:
        head = f"stopped ({s.stopped_by})" if s.stopped_by else "done"
        rate = "-" if s.steps_per_sec is None else f"{s.steps_per_sec:.1f}"
        examples = "-" if s.examples_per_sec is None else format_rate(s.examples_per_sec)
        parts = [f"{head} | step {s.final_step}/{s.total_steps}", f"{s.steps_run} steps in {s.seconds:.1f} s",
                 f"{rate} steps/s", f"{examples} examples/s", f"loss {format_value(s.loss)}"]
        if s.last_checkpoint:
            parts.append(f"checkpoint {s.last_checkpoint}")
        if s.events:
            lost = "; ".join(f"{e.detail} at step {e.step}" for e in s.events)
            parts.append(f"{len(s.events)} TPU event{'s' if len(s.events) != 1 else ''} ({lost})")
            parts.append(f"{s.resumes} resume{'s' if s.resumes != 1 else ''}")
            parts.append(f"{s.steps_lost} steps lost")
        if s.records_skipped is not None:
            parts.append(skipped_text(s.records_skipped))
        return " | ".join(parts)

    @staticmethod
    def _rate(from_step: int, from_time: float, step: int, now: float) -> Optional[float]:
        if now <= from_time or step <= from_step:
            return None
        return (step - from_step) / (now - from_time)

    def _eta(self, step: int, rate: Optional[float]) -> str:
        if step >= self.total_steps:
            return format_duration(0)
        return "-" if not rate else format_duration((self.total_steps - step) / rate)

    def _out(self, text: str, style: Optional[str] = None) -> None:
        console = self._live.console if self._live is not None else self.console
        if style:
            console.print(text, style=style, highlight=False, markup=False, soft_wrap=True)
        else:
            console.out(text, highlight=False)

    # ------------------------------------------------------------------------------------ live

    def _fields(self, step: int, rate: Optional[float]) -> dict:
        return {
            "rate": "- steps/s" if rate is None else f"{rate:.1f} steps/s",
            "examples": "- ex/s" if rate is None else f"{rate * self.batch_size:.0f} ex/s",
            "loss": format_value(self.smoothed_loss),
            "eta": self._eta(step, rate),
            "skipped": f"skipped {self.skipped}" if self.skipped else "",
        }

    def _start_live(self, step: int) -> None:
        self._live = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[examples]}"),
            TextColumn("loss {task.fields[loss]}"), TextColumn("eta {task.fields[eta]}"),
            TextColumn("{task.fields[ckpt]}"), TextColumn("[yellow]{task.fields[skipped]}"),
            TextColumn("[yellow]{task.fields[node]}"),
            console=self.console, get_time=self.get_time, auto_refresh=self._auto_refresh)
        self._task = self._live.add_task("train", total=self.total_steps, completed=min(step, self.total_steps),
                                         ckpt="", node="", **self._fields(step, None))
        self._live.start()


def progress_hooks(progress: TrainProgress, *, steps_per_run: int = 1):
    """(SessionRunHook, CheckpointSaverListener) feeding `progress` from a TPUEstimator's train.

    `steps_per_run` is how far one session run moves the global step (iterations_per_loop on a TPU):
    the step fetched with a run may predate its update, so the exact step is read (one more tiny
    session run) only when a line is due.
    """
    hook_class, listener_class, _ = _hook_classes()
    return hook_class(progress, steps_per_run), listener_class(progress)


def skipped_records_hook(progress: TrainProgress):
    """A SessionRunHook telling `progress` how many records the input pipelines skipped (data.skip_corrupt).

    It sums the counters `tpulaunch.data.pipeline` keeps in the graph (one per input pipeline: one per host on
    a TPU slice); they start at 0 in each session, so `progress` adds sessions up. In a graph without
    counters it does nothing, and `progress` reports no count.
    """
    return _hook_classes()[2](lambda count, ended: progress.records_skipped(count, session_ended=ended),
                              progress.session_counts_skipped_records)


def skipped_records_counter():
    """(hook, count): a SessionRunHook for one evaluation, and a function giving the records its input
    pipelines skipped under data.skip_corrupt (None before the evaluation ran)."""
    seen: dict = {}
    hook = _hook_classes()[2](lambda count, ended: seen.__setitem__("count", count))
    return hook, lambda: seen.get("count")


_CLASSES = None


def _hook_classes():
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES
    import tensorflow as tf

    class ProgressHook(tf.compat.v1.train.SessionRunHook):
        def __init__(self, progress: TrainProgress, steps_per_run: int):
            self._progress = progress
            self._steps_per_run = steps_per_run

        def begin(self):
            self._global_step = tf.compat.v1.train.get_global_step()
            # Like TF's own step hooks: the read the model_fn is built after, i.e. before the update.
            reads = tf.compat.v1.get_collection("global_step_read_op_cache")
            stale = reads[0] if reads else self._global_step
            # The Estimator puts the spec's loss (on a TPU: the loss out of the loop) last in LOSSES.
            losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
            self._fetches = [stale] + ([losses[-1]] if losses else [])

        def after_create_session(self, session, coord):
            self._progress.begin(int(session.run(self._global_step)))

        def before_run(self, run_context):
            return tf.compat.v1.train.SessionRunArgs(self._fetches)

        def after_run(self, run_context, run_values):
            results = run_values.results
            step = int(results[0]) + self._steps_per_run
            if self._progress.wants_exact_step(step):
                step = int(run_context.session.run(self._global_step))
            self._progress.update(step, float(results[1]) if len(results) > 1 else None)

        def end(self, session):
            self._progress.end_segment()

    class ProgressListener(tf.compat.v1.train.CheckpointSaverListener):
        def __init__(self, progress: TrainProgress):
            self._progress = progress

        def after_save(self, session, global_step_value):
            path = None
            if self._progress.model_dir:
                path = os.path.join(self._progress.model_dir, f"model.ckpt-{int(global_step_value)}")
            self._progress.checkpoint(int(global_step_value), path)

    class SkippedRecordsHook(tf.compat.v1.train.SessionRunHook):
        """Reports the sum of the input pipelines' skip counters: on_count(count, session_ended)."""

        def __init__(self, on_count: Callable[[int, bool], None], on_begin: Optional[Callable[[], None]] = None):
            self._on_count = on_count
            self._on_begin = on_begin
            self._total = None

        def begin(self):
            from tpulaunch.data.pipeline import SKIPPED_RECORDS

            counters = tf.compat.v1.get_collection(SKIPPED_RECORDS)
            self._total = tf.add_n([c.read_value() for c in counters]) if counters else None

        def after_create_session(self, session, coord):
            # Also after MonitoredSession recreates a session (Aborted/Unavailable): the counters and
            # the input pipeline start again from zero then. No counters (no data.skip_corrupt, or
            # the job's own input_fn): nothing is counted, and nothing is reported.
            if self._total is not None and self._on_begin is not None:
                self._on_begin()

        def before_run(self, run_context):
            return None if self._total is None else tf.compat.v1.train.SessionRunArgs(self._total)

        def after_run(self, run_context, run_values):
            if self._total is not None:
                self._on_count(int(run_values.results), False)

        def end(self, session):
            if self._total is not None:
                self._on_count(int(session.run(self._total)), True)

    _CLASSES = (ProgressHook, ProgressListener, SkippedRecordsHook)
    return _CLASSES
