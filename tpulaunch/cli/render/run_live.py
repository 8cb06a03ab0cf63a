"""Run events as a live rich display on a terminal: a spinner for the phase, a progress bar for training.

From the run's first phase (before TensorFlow loads) a spinner names the phase the run is in and how
long it has run; each phase, as it ends, is printed above with its duration. The bar shows the step,
rates over the current session, the smoothed loss, the ETA, the last checkpoint, skipped records and
the TPU's state while it is lost; notes, slow phases, TPU events, evaluations (as tables), the input
share and the summary are printed above it with the plain renderer's wording.
"""

from __future__ import annotations

import time
from functools import singledispatchmethod
from typing import Callable, Optional

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn
from rich.table import Table
from rich.text import Text

from tpulaunch.cli.render import run_text as text
from tpulaunch.run.events import (CheckpointSaved, EvalResult, InputShare, NodeEvent, NodeReady, NodeWaiting, Note,
                                  PhaseEnded, PhaseSlow, PhaseStarted, ProfileCaptured, RecordsSkipped, RunClosed,
                                  StepProgress, StepsRun, TrainingStarted, TrainSummary)
from tpulaunch.run.phases import TRAINING


def eval_table(result: EvalResult) -> Table:
    """One evaluation as a table: metrics by name, loss last; skipped and left-out records as its caption."""
    caption = "; ".join(([] if result.records_skipped is None else [text.skipped_text(result.records_skipped)])
                        + ([] if result.left_out is None else [text.left_out_text(result.left_out)])) or None
    table = Table(title=f"eval at step {result.step}", title_justify="left", caption=caption, caption_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name in text.metric_names(result):
        table.add_row(name, text.format_value(result.metrics[name]))
    return table


class _Elapsed(ProgressColumn):
    """Seconds since the shown phase began (its `began` field), on the display's clock."""

    def __init__(self, get_time: Callable[[], float]):
        super().__init__()
        self._get_time = get_time

    def render(self, task) -> Text:
        return Text(f"{max(0.0, self._get_time() - task.fields['began']):.0f} s", style="dim")


class LiveRenderer:
    """Subscribe it to a `RunRecorder`: `recorder.subscribe(LiveRenderer(console))`.

    Args:
        console: a terminal console.
        get_time: the display's clock (the recorder's, so both agree). Defaults to time.monotonic.
        auto_refresh: let the display refresh itself (off in tests, which call `refresh()`).
    """

    def __init__(self, console: Console, *, get_time: Callable[[], float] = time.monotonic, auto_refresh: bool = True):
        self.console = console
        self.get_time = get_time
        self.auto_refresh = auto_refresh
        self._live: Optional[Live] = None
        self._phases: list = []  # open phases (name, began), innermost last
        self._spinner = Progress(SpinnerColumn(), TextColumn("{task.description}"), _Elapsed(get_time),
                                 console=console, get_time=get_time, auto_refresh=False)
        self._spinner_task = self._spinner.add_task("", began=0.0)
        self._bar: Optional[Progress] = None
        self._task = None

    def refresh(self) -> None:
        if self._live is not None:
            self._live.refresh()

    def _view(self):
        """The spinner while a phase other than training is open, then the training bar once there is one."""
        parts = []
        if self._phases and self._phases[-1][0] != TRAINING:
            name, began = self._phases[-1]
            self._spinner.update(self._spinner_task, description=name, began=began)
            parts.append(self._spinner.get_renderable())
        if self._bar is not None:
            parts.append(self._bar.get_renderable())
        return Group(*parts)

    def _show(self) -> None:
        if self._live is None:
            self._live = Live(console=self.console, auto_refresh=self.auto_refresh, get_renderable=self._view,
                              refresh_per_second=4)
            self._live.start()

    def _stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _print(self, line: str, style: str) -> None:
        self.console.print(line, style=style, highlight=False, markup=False, soft_wrap=True)

    def _update(self, **fields) -> None:
        if self._bar is not None:
            self._bar.update(self._task, **fields)

    @singledispatchmethod
    def __call__(self, event) -> None:
        """Events the display has no place for (log points: the bar moves with every session run)."""

    @__call__.register
    def _phase_started(self, event: PhaseStarted) -> None:
        self._phases.append((event.name, self.get_time()))
        self._show()
        self.refresh()  # now, not at the next tick: lines printed meanwhile redraw the last frame

    @__call__.register
    def _phase_ended(self, event: PhaseEnded) -> None:
        names = [name for name, _ in self._phases]
        if event.name in names:
            del self._phases[len(names) - 1 - names[::-1].index(event.name):]
            self.refresh()
        if text.phase_shown(event.name):
            self._print(f"✓ {event.name} {event.seconds:.1f} s", "dim")

    @__call__.register
    def _phase_slow(self, event: PhaseSlow) -> None:
        self._print(text.phase_slow_text(event), "yellow")

    @__call__.register
    def _input(self, event: InputShare) -> None:
        self._print(text.input_text(event), "yellow" if event.bound else "dim")

    @__call__.register
    def _profile(self, event: ProfileCaptured) -> None:
        self._print(text.profile_text(event), "cyan")

    @__call__.register
    def _started(self, event: TrainingStarted) -> None:
        self._bar = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[examples]}"),
            TextColumn("loss {task.fields[loss]}"), TextColumn("eta {task.fields[eta]}"),
            TextColumn("{task.fields[ckpt]}"), TextColumn("[yellow]{task.fields[skipped]}"),
            TextColumn("[yellow]{task.fields[node]}"),
            console=self.console, get_time=self.get_time, auto_refresh=False)
        self._task = self._bar.add_task(
            "train", total=event.total_steps, completed=min(event.step, event.total_steps), ckpt="", node="",
            rate="- steps/s", examples="- ex/s", loss="-", eta="-", skipped="")
        self._show()

    @__call__.register
    def _steps(self, event: StepsRun) -> None:
        self._update(completed=min(event.step, event.total_steps), **_fields(event))

    @__call__.register
    def _note(self, event: Note) -> None:
        self._print(event.text, "dim")

    @__call__.register
    def _skipped(self, event: RecordsSkipped) -> None:
        self._print(text.first_skipped_text(event.count), "dim")

    @__call__.register
    def _checkpoint(self, event: CheckpointSaved) -> None:
        self._update(ckpt=f"ckpt {event.step}")

    @__call__.register
    def _evaluated(self, event: EvalResult) -> None:
        self.console.print(eval_table(event))

    @__call__.register
    def _node_lost(self, event: NodeEvent) -> None:
        self._print(text.node_lost_text(event), "bold yellow")
        self._update(node=f"TPU {event.detail}")

    @__call__.register
    def _node_waiting(self, event: NodeWaiting) -> None:
        self._update(node=f"waiting for TPU: {event.state} ({event.seconds_left:.0f} s left)")
        if event.new_state:
            self._print(text.node_waiting_text(event), "yellow")

    @__call__.register
    def _node_ready(self, event: NodeReady) -> None:
        self._update(node="")
        self._print(text.node_ready_text(event), "green")

    @__call__.register
    def _finished(self, event: TrainSummary) -> None:
        self._stop()
        self._bar = None
        self._print(text.summary_text(event), "yellow" if event.stopped_by else "green")

    @__call__.register
    def _closed(self, event: RunClosed) -> None:
        self._phases.clear()
        self._stop()


def _fields(steps: StepProgress) -> dict:
    rate = steps.steps_per_sec
    return {
        "rate": "- steps/s" if rate is None else f"{rate:.1f} steps/s",
        "examples": "- ex/s" if rate is None else f"{steps.examples_per_sec:.0f} ex/s",
        "loss": text.format_value(steps.loss),
        "eta": text.format_eta(steps),
        "skipped": f"skipped {steps.skipped}" if steps.skipped else "",
    }
