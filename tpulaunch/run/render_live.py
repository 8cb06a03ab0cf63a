"""Run events as a live rich display on a terminal: one progress bar for training, tables for evaluations.

The bar shows the step, rates over the current session, the smoothed loss, the ETA, the last
checkpoint, skipped records and the TPU's state while it is lost; notes, TPU events, evaluations and
the summary are printed above it with the plain renderer's wording.
"""

from __future__ import annotations

import time
from functools import singledispatchmethod
from typing import Callable, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from tpulaunch.run import text
from tpulaunch.run.events import (CheckpointSaved, EvalResult, NodeEvent, NodeReady, NodeWaiting, Note, RecordsSkipped,
                                  StepProgress, StepsRun, TrainingStarted, TrainSummary)


def eval_table(result: EvalResult) -> Table:
    """One evaluation as a table: metrics by name, loss last; skipped records as its caption."""
    skipped = None if result.records_skipped is None else text.skipped_text(result.records_skipped)
    table = Table(title=f"eval at step {result.step}", title_justify="left", caption=skipped, caption_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name in text.metric_names(result):
        table.add_row(name, text.format_value(result.metrics[name]))
    return table


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
        self._live: Optional[Progress] = None
        self._task = None

    def refresh(self) -> None:
        if self._live is not None:
            self._live.refresh()

    def _print(self, line: str, style: str) -> None:
        self.console.print(line, style=style, highlight=False, markup=False, soft_wrap=True)

    def _update(self, **fields) -> None:
        if self._live is not None:
            self._live.update(self._task, **fields)

    @singledispatchmethod
    def __call__(self, event) -> None:
        """Events the display has no place for (log points: the bar moves with every session run)."""

    @__call__.register
    def _started(self, event: TrainingStarted) -> None:
        self._live = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[examples]}"),
            TextColumn("loss {task.fields[loss]}"), TextColumn("eta {task.fields[eta]}"),
            TextColumn("{task.fields[ckpt]}"), TextColumn("[yellow]{task.fields[skipped]}"),
            TextColumn("[yellow]{task.fields[node]}"),
            console=self.console, get_time=self.get_time, auto_refresh=self.auto_refresh)
        self._task = self._live.add_task(
            "train", total=event.total_steps, completed=min(event.step, event.total_steps), ckpt="", node="",
            rate="- steps/s", examples="- ex/s", loss="-", eta="-", skipped="")
        self._live.start()

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
        if self._live is not None:
            self._live.stop()
            self._live = None
        self._print(text.summary_text(event), "yellow" if event.stopped_by else "green")


def _fields(steps: StepProgress) -> dict:
    rate = steps.steps_per_sec
    return {
        "rate": "- steps/s" if rate is None else f"{rate:.1f} steps/s",
        "examples": "- ex/s" if rate is None else f"{steps.examples_per_sec:.0f} ex/s",
        "loss": text.format_value(steps.loss),
        "eta": text.format_eta(steps),
        "skipped": f"skipped {steps.skipped}" if steps.skipped else "",
    }
