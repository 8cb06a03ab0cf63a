"""A stop honoured within a stated time, whatever the run's step waits on.

`signals.py` stops a run gracefully: at the next step boundary, with a checkpoint there. That needs the main
thread back in Python, and a step waiting on something that does not come (its input a pipe nobody writes, a
store that does not answer, a collective whose peer is gone) never gives it back: Python runs a signal's
handler only between the main thread's bytecodes. So the signal is also seen here, by a thread of its own (the
interpreter's C handler writes the signal's number to a pipe: `signal.set_wakeup_fd`). When the process has not
ended `grace_s()` seconds (30; `$TPULAUNCH_STOP_GRACE_S`) after the first SIGINT, SIGTERM or SIGHUP, or at once
at a second Ctrl-C, that thread ends the run itself: what the main thread's `finally` blocks would have done
(each `Ending`: the run record, stopped with the reason, then the lease's release), one line saying why, and the
signal's exit code. The stuck step is never returned to, so nothing is saved from inside it: the last
checkpoint stays the one a rerun resumes from. The record and the lease get one more grace period; past it the
process exits regardless.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from typing import Callable, List, Optional, Tuple

from tpulaunch.run.lease import _seconds
from tpulaunch.run.signals import HANDLED, exit_code_of, handling_from_start

GRACE_ENV = "TPULAUNCH_STOP_GRACE_S"
GRACE_S = 30.0

_lock = threading.RLock()  # held while an Ending runs: by the main thread's own `finally`, or by a forced stop
_pending: List["Ending"] = []  # outermost first
_armed = False


def grace_s() -> float:
    """How long a run has to stop after a signal: 30 s, or $TPULAUNCH_STOP_GRACE_S."""
    return _seconds(GRACE_ENV, GRACE_S)


class ForcedStop(BaseException):
    """How a run that did not stop in time ended: handed to each `Ending` (the run record words its outcome)."""

    def __init__(self, signum: int, reason: str):
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.reason = reason
        super().__init__(f"stopped by {self.name}: {reason}")


class Ending:
    """What a block's `finally` does so the run ends whole (write its record, release its lease), done once: by that
    `finally` (`ending()`, on the main thread) or, when the main thread cannot get there, by a forced stop
    (`action(ForcedStop)`).

    `describe`: what the run has not finished, as (what, guess), e.g. ("the step did not return", "waiting on its
    input?"), for the forced stop's reason. `after`: what a forced stop of this block tells the user (the
    checkpoint to resume from)."""

    def __init__(self, action: Callable[[Optional[ForcedStop]], None], *,
                 describe: Optional[Callable[[], Tuple[str, Optional[str]]]] = None,
                 after: Optional[Callable[[], Optional[str]]] = None):
        self.action, self.describe, self.after = action, describe, after
        self.done = False
        with _lock:
            _pending.append(self)

    def __call__(self) -> None:
        """The main thread's own ending (no-op when a forced stop did it already; waits while one runs)."""
        with _lock:
            if self.done:
                return
            self._take()
            self.action(None)

    def _take(self) -> None:
        self.done = True  # before running: an action that fails is not run again
        if self in _pending:
            _pending.remove(self)


def arm() -> None:
    """Watch for SIGINT/SIGTERM/SIGHUP from a thread of this module's own, once per process (main thread only:
    elsewhere signals are not this process's to handle), and only in `tpulaunch`'s own process (`signals.
    handle_from_start` ran: its entry point's): a program running the CLI inside its own (a test through click's
    CliRunner) keeps its signals, and a stop must never end it. Reads the grace first: a bad
    $TPULAUNCH_STOP_GRACE_S is refused here, as the run starts."""
    global _armed
    grace = grace_s()
    if _armed or not handling_from_start() or threading.current_thread() is not threading.main_thread():
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # the C handler must never block
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read_fd, grace), name="tpulaunch-stop-deadline", daemon=True).start()
    _armed = True


def _watch(fd: int, grace: float) -> None:
    first: Optional[int] = None
    deadline: Optional[float] = None
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not select.select([fd], [], [], left)[0]:  # the grace passed: the process is still here
            _force(first, grace, second=False)
            return
        for signum in os.read(fd, 64):
            if signum not in HANDLED:
                continue
            if first is None:
                first, deadline = signum, time.monotonic() + grace
                name = signal.Signals(signum).name
                _say(f"stop | {name}: the run stops at its next step boundary; if it has not ended in {grace:g} s, "
                     "it is stopped where it is" + (" (a second Ctrl-C: at once)" if signum == signal.SIGINT else ""))
            elif signum == signal.SIGINT:  # a second Ctrl-C: the user does not want to wait for the step
                _force(first, grace, second=True)
                return


def _force(signum: int, grace: float, *, second: bool) -> None:
    """End the process from this thread: the pending Endings (innermost first), one line, the signal's exit code."""
    code = int(exit_code_of(signum))
    # The record and the lease get one more grace period: a store that does not answer cannot keep the process.
    last_resort = threading.Timer(grace, os._exit, args=(code,))
    last_resort.daemon = True
    last_resort.start()
    _lock.acquire(timeout=grace)  # the main thread may be ending a block itself: let it finish (never released)
    try:
        pending = list(reversed(_pending))
        what, guess = next((e.describe() for e in pending if e.describe is not None), ("the run did not end", None))
        name = signal.Signals(signum).name
        reason = f"a second Ctrl-C; {what}" if second else f"{what} within {grace:g} s of {name}"
        reason += f" ({guess})" if guess else ""
        stop = ForcedStop(signum, reason)
        after = next((text for e in pending if e.after is not None for text in [e.after()] if text), None)
        for ending in pending:
            ending._take()
            try:
                ending.action(stop)
            except Exception as exc:  # noqa: BLE001 (the next one must still run: the lease after the record)
                _say(f"{type(exc).__name__} while ending the run: {exc}")
        _flush()
        _say(f"stopped by {name}: {reason}; nothing was saved at the stop" + (f"\nhint: {after}" if after else ""))
    finally:
        os._exit(code)


def _say(text: str) -> None:
    os.write(2, (text + "\n").encode("utf-8", errors="replace"))  # not sys.stderr: the main thread may hold its lock


def _flush() -> None:
    """Flush Python's stdout and stderr, unless the main thread is stuck holding one of them (1 s at most)."""
    def flush() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 (a closed pipe: nothing to keep)
                pass

    flusher = threading.Thread(target=flush, daemon=True)
    flusher.start()
    flusher.join(1.0)
