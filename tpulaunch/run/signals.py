"""SIGINT (Ctrl-C), SIGTERM and SIGHUP, from the process's first instant to its last.

From start (`handle_from_start`, called first thing by the CLI): SIGINT raises KeyboardInterrupt (Python's own
rule) and SIGTERM / SIGHUP raise `Terminated` where the process is, so every `finally` on the way out runs: the
model_dir lease is released and the run record written, before TensorFlow has loaded as well as after. Left to
their defaults, SIGTERM and SIGHUP would kill the process outright: no record, the lease left held (a rerun on
another host waits out its stale time). `deferred()` holds a signal back while a change must not be cut in
half (taking or releasing the lease, writing the record): it is raised when the change is done.

While training runs (`StopSignal`), a signal is only recorded: Python runs a handler only between session
runs, and the engine's stop hook sees the record after the step and asks the session to stop. The Estimator's
CheckpointSaverHook (the keras engine's loop) then saves at the current step, and the runner raises
`TrainingStopped`, whose exit code is 130 (SIGINT), 143 (SIGTERM) or 129 (SIGHUP: a closed terminal or SSH
session, handled as SIGTERM). During an evaluation the evaluation is abandoned instead (its partial metrics
are not reported) and the runner raises `EvaluationStopped`. A second Ctrl-C stops at once.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any, Iterator, Optional

from tpulaunch.errors import ExitCode, TpuLaunchError

HANDLED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
_EXIT_CODES = {"SIGINT": ExitCode.INTERRUPTED, "SIGTERM": ExitCode.TERMINATED, "SIGHUP": ExitCode.HANGUP}


def exit_code_of(signum: int) -> ExitCode:
    """130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP (128 + the signal's number, as a shell reports it)."""
    return _EXIT_CODES[signal.Signals(signum).name]


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived outside training: raised like KeyboardInterrupt (not an Exception, so no
    `except Exception` on the way swallows it); the CLI's entry point turns it into the signal's exit code."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.exit_code = exit_code_of(signum)
        super().__init__(f"stopped by {self.name}")


class TrainingStopped(TpuLaunchError):
    """Training stopped on a signal after saving a checkpoint at the current step."""

    def __init__(self, message: str, *, signum: int, step: Optional[int], hint: Optional[str] = None,
                 summary: Any = None):
        super().__init__(message, hint=hint, exit_code=exit_code_of(signum))
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


# ------------------------------------------------------------------------------ from the first instant

_deferring = 0  # how many `deferred()` blocks are open (main thread only: handlers run there)
_pending: Optional[int] = None  # a signal held back by them
# The first signal raised here. Library code can swallow the exception it raised: while TensorFlow, Keras and
# JAX load, a garbage-collection callback reports it as "Exception ignored", a C function clears it, a bare
# `except:` catches it. `raise_if_swallowed` raises it again where tpulaunch's own code runs next.
_raised: Optional[int] = None
_held_until_recorded = False  # from the end of a `deferred(until_recorded=True)` block to `raise_if_held()`


def _raised_for(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _handle_early(signum, frame) -> None:
    global _pending
    if _deferring or _held_until_recorded:
        _pending = _pending or signum  # the first one is the one acted on
        return
    _raise(signum)


def _raise(signum: int):
    global _raised
    _raised = _raised or signum
    raise _raised_for(signum)


def raise_if_swallowed() -> None:
    """Raise again a signal whose exception library code swallowed (no-op when none came): called after the
    heavy imports and before training starts, so a Ctrl-C while TensorFlow loads is never lost."""
    if _raised is not None:
        raise _raised_for(_raised)


def raise_if_held() -> None:
    """Stop holding signals back after `deferred(until_recorded=True)`, and raise the one held (if one came)."""
    global _pending, _held_until_recorded
    _held_until_recorded = False
    if _pending is not None and not _deferring:
        signum, _pending = _pending, None
        _raise(signum)


def forget_stray_interrupt() -> None:
    """Keep the exit code tpulaunch chose after a SIGINT it handled.

    A KeyboardInterrupt that passed through C code running Python (TensorFlow's pybind11 `exec` while it loads)
    leaves CPython's flag for an unhandled interrupt set, even when tpulaunch caught it afterwards; under
    `python -m tpulaunch` the interpreter then ends the process by SIGINT after it exits (-2, not 130). CPython
    clears the flag each time it starts running a string of code, so running an empty one resets it."""
    import ctypes

    try:
        ctypes.pythonapi.PyRun_SimpleString(b"")
    except (AttributeError, OSError):  # not CPython: no such flag
        pass


def _quiet_about_swallowed_signals(unraisable) -> None:
    """Python prints "Exception ignored in ..." with a traceback where a callback swallowed an exception; for a
    signal's, tpulaunch raises it again itself (`raise_if_swallowed`), so that traceback would only alarm."""
    if isinstance(unraisable.exc_value, (KeyboardInterrupt, Terminated)) and _raised is not None:
        return
    sys.__unraisablehook__(unraisable)


_from_start = False  # `handle_from_start` ran: this process is tpulaunch's own (its entry point's)


def handling_from_start() -> bool:
    """Whether this process is `tpulaunch` itself, its signals handled from its first instant (not a program
    running the CLI inside its own, such as a test through click's CliRunner)."""
    return _from_start


def handle_from_start() -> None:
    """Install the raising handlers (main thread only; elsewhere the defaults stay)."""
    global _raised, _held_until_recorded, _from_start
    _raised, _held_until_recorded, _from_start = None, False, True
    sys.unraisablehook = _quiet_about_swallowed_signals
    if threading.current_thread() is threading.main_thread():
        for signum in HANDLED:
            signal.signal(signum, _handle_early)


@contextlib.contextmanager
def deferred(*, until_recorded: bool = False) -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP back inside the block (a change that must be whole); raise it at its end.

    `until_recorded`: go on holding signals back after the block, until `raise_if_held` (the run record's block,
    which records how the run ended, raises it first thing): taking model_dir's lease is followed by the record's
    set-up, and a run that took the lease must leave a record line."""
    global _deferring, _pending, _held_until_recorded
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if until_recorded:
            _held_until_recorded = True
        elif not _deferring and _pending is not None:
            signum, _pending = _pending, None
            if not _raising_already():
                _raise(signum)


def _raising_already() -> bool:
    """Whether the block ends with a signal's exception already on its way out (its own would hide it)."""
    return isinstance(sys.exc_info()[1], (KeyboardInterrupt, Terminated))


# ------------------------------------------------------------------------------------- while training

class StopSignal:
    """Records SIGINT / SIGTERM / SIGHUP while active (a context manager) instead of raising.

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
        raise_if_swallowed()  # a signal while the libraries loaded stops the run before its first step
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
