"""When a run began, on time.monotonic's clock: the process's own start when tpulaunch is the program
(so a run's wall time includes starting Python and importing tpulaunch), else when the command began."""

from __future__ import annotations

import os
import time
from typing import Optional

_program_started: Optional[float] = None


def process_age() -> Optional[float]:
    """Seconds since this process started, from /proc (Linux); None where that cannot be read."""
    try:
        with open("/proc/self/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()  # the name in (...) may hold spaces
        started_ticks = int(fields[19])  # field 22, starttime: clock ticks after boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def mark_program_start() -> None:
    """The console entry point calls this: runs in this process count from the process's start."""
    global _program_started
    age = process_age()
    _program_started = time.monotonic() - (age or 0.0)


def run_started() -> float:
    """When the current run began: the program's start when marked (once: a later run counts from now)."""
    global _program_started
    started, _program_started = _program_started, None
    return started if started is not None else time.monotonic()
