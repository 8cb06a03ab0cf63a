"""Ctrl-C and SIGTERM during a run: finish the current step, save a checkpoint there, then stop.

Python runs a signal handler only between session runs, so the handler just records the signal; the
engine's stop hook sees the record after the step and asks the session to stop. The Estimator's
CheckpointSaverHook then saves at the current step when the session ends, and the runner raises
`TrainingStopped`, whose exit code is 130 (SIGINT) or 143 (SIGTERM). During an evaluation the
evaluation is abandoned instead (its partial metrics are not reported) and the runner raises
`EvaluationStopped`. A second Ctrl-C stops at once.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Optional

from tpulaunch.errors import ExitCode, TpuLaunchError

HANDLED = (signal.SIGINT, signal.SIGTERM)


class TrainingStopped(TpuLaunchError):
    """Training stopped on a signal after saving a checkpoint at the current step."""

    def __init__(self, message: str, *, signum: int, step: Optional[int], hint: Optional[str] = None,
                 summary: Any = None):
        code = ExitCode.INTERRUPTED if signum == signal.SIGINT else ExitCode.TERMINATED
        super().__init__(message, hint=hint, exit_code=code)
        self.signum = signum
        self.step = step
        self.summary = summary  # the events.TrainSummary up to the stop


class EvaluationStopped(TrainingStopped):
    """A signal stopped the run during an evaluation, or just before the final one.

    Training's checkpoint at `step` is saved; the evaluation of `checkpoint` did not finish and is not
    reported. `final`: it was the evaluation after the last training step (a rerun of `train` has
    nothing left to do, so only `tpulaunch evaluate` scores that checkpoint).
    """

    def __init__(self, message: str, *, signum: int, step: Optional[int], checkpoint: Optional[str], final: bool,
                 hint: Optional[str] = None, summary: Any = None):
        super().__init__(message, signum=signum, step=step, hint=hint, summary=summary)
        self.checkpoint = checkpoint
        self.final = final


class StopSignal:
    """Records SIGINT / SIGTERM while active (a context manager) instead of raising.

    Outside the main thread signal handlers cannot be installed; the object then stays inert and
    the default behaviour applies.
    """

    def __init__(self):
        self.received: Optional[int] = None
        self._previous: dict = {}

    @property
    def name(self) -> Optional[str]:
        return signal.Signals(self.received).name if self.received is not None else None

    def __enter__(self) -> "StopSignal":
        if threading.current_thread() is threading.main_thread():
            for signum in HANDLED:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: the user does not want to wait for the step
        self.received = signum
