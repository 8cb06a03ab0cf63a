"""A rehearsal's preemption lands at its step: `tpulaunch rehearse --preempt-at STEP` asks the chief's `train` (through
$TPULAUNCH_REHEARSAL_HOLD_AT) to stop at that step, print it, and wait there to be preempted, so the preemption
comes at the host's own step count whatever the job's log cadence (a job that logs every 100 steps is otherwise
seen, and preempted, only at the next hundred).

Each step is held once per rehearsal: a marker in $TPULAUNCH_REHEARSAL_HOLD_DIR (a folder of the rehearsal's, on
this machine) says it was, so the run that resumes from an earlier checkpoint passes it by.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Optional

HOLD_AT_ENV = "TPULAUNCH_REHEARSAL_HOLD_AT"  # comma-separated global steps
HOLD_DIR_ENV = "TPULAUNCH_REHEARSAL_HOLD_DIR"


def environment(steps, folder: str) -> dict:
    """What `rehearse` puts in its hosts' environment for `--preempt-at` steps."""
    return {HOLD_AT_ENV: ",".join(str(step) for step in sorted(steps)), HOLD_DIR_ENV: folder}


def subscriber(total_steps: int) -> Optional[Callable]:
    """A RunRecorder subscriber that holds the chief at the rehearsal's steps; None outside a rehearsal."""
    from tpulaunch.run.events import StepsRun
    from tpulaunch.run.workers import is_chief_worker

    text, folder = os.environ.get(HOLD_AT_ENV), os.environ.get(HOLD_DIR_ENV)
    if not text or not folder or not is_chief_worker():
        return None
    pending = sorted(int(word) for word in text.split(",") if word.strip())

    def hold(event) -> None:
        if not isinstance(event, StepsRun):
            return
        while pending and event.step >= pending[0]:
            step = pending.pop(0)
            marker = os.path.join(folder, f"held-at-{step}")
            try:
                with open(marker, "x"):
                    pass
            except FileExistsError:
                continue  # held once already: this run resumed from before it
            print(f"train | step {event.step}/{total_steps} | held here: the rehearsal preempts now", flush=True)
            sys.stderr.flush()
            while True:  # until the rehearsal kills this VM's processes
                time.sleep(1)

    return hold
