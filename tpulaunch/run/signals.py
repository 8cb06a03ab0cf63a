"""Ctrl-C and SIGTERM during training: finish the current step, save a checkpoint there, then stop.

Python runs a signal handler only between session runs, so the handler just records the signal; a
SessionRunHook sees the record after the step and asks the session to stop. The Estimator's
CheckpointSaverHook then saves at the current step when the session ends, and the runner raises
`TrainingStopped`, whose exit code is 130 (SIGINT) or 143 (SIGTERM). A second Ctrl-C stops at once.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable, Optional

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
        self.summary = summary  # the progress.TrainSummary up to the stop


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


def stop_hook(stop: StopSignal):
    """A SessionRunHook that requests a stop after the step during which a signal arrived."""
    return request_stop_hook(lambda: stop.received is not None)


def request_stop_hook(should_stop: Callable[[], bool]):
    """A SessionRunHook that asks the session to stop after any run where `should_stop()` is true.

    The session then ends as after its last step: the Estimator's CheckpointSaverHook saves at
    the current step. The TPU watchdog uses it too.
    """
    return _stop_hook_class()(should_stop)


_CLASS = None


def _stop_hook_class():
    global _CLASS
    if _CLASS is None:
        import tensorflow as tf

        class RequestStopHook(tf.compat.v1.train.SessionRunHook):
            def __init__(self, should_stop: Callable[[], bool]):
                self._should_stop = should_stop

            def after_run(self, run_context, run_values):
                if self._should_stop():
                    run_context.request_stop()

        _CLASS = RequestStopHook
    return _CLASS
