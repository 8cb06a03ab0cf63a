"""A run frozen at a named moment, as a paused VM or a long partition freezes it there: for rehearsing what the
fence does when the run thaws (docs/running.md: one writer per model_dir).

`$TPULAUNCH_FREEZE_AT` names the moment:

- `lease-taken`: model_dir's lease just written, before the run record's block starts;
- `mid-save@STEP`: the checkpoint of global step STEP written under its staging folder, none of its files at
  their names yet (`engine/core/staged_save.py`).

There the run says `frozen | <moment>` on stderr and stops itself with SIGSTOP, every thread at once (its lease's
renewals too); SIGCONT thaws it. Only the process that holds model_dir's lease freezes (the chief of a
multi-worker run; the other workers save into scratch folders of their own), once per moment. Outside such a
rehearsal (the variable unset) each point is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Optional, Tuple

FREEZE_AT_ENV = "TPULAUNCH_FREEZE_AT"
LEASE_TAKEN = "lease-taken"
MID_SAVE = "mid-save"

_frozen: set = set()
_said: set = set()


def freeze_point(moment: str, step: Optional[int] = None) -> None:
    """Freeze this process here when $TPULAUNCH_FREEZE_AT names `moment` (at `step`, for a moment that has one)."""
    text = (os.environ.get(FREEZE_AT_ENV) or "").strip()
    if not text:
        return
    wanted = _moment(text)
    if wanted is None:
        _say_once(f"warning: {FREEZE_AT_ENV}={text} names no moment ({LEASE_TAKEN}, or {MID_SAVE}@STEP with a whole "
                  "step); nothing is frozen")
        return
    if wanted != (moment, step) or wanted in _frozen or not _holds_the_lease():
        return
    name = moment if step is None else f"{moment}@{step}"
    if os.getpid() == 1:  # a container's init: the kernel drops a SIGSTOP it sends itself
        _say_once(f"warning: {FREEZE_AT_ENV}={text}: this process is PID 1 (a container's entrypoint), which cannot "
                  "stop itself; nothing is frozen (run it under an init: docker run --init)")
        return
    _frozen.add(wanted)
    print(f"frozen | {name}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)


def _moment(text: str) -> Optional[Tuple[str, Optional[int]]]:
    """(moment, step) that `text` names; None when it names none."""
    if text == LEASE_TAKEN:
        return LEASE_TAKEN, None
    moment, at, step = text.partition("@")
    if moment == MID_SAVE and at and step.isascii() and step.isdigit():
        return MID_SAVE, int(step)
    return None


def _holds_the_lease() -> bool:
    from tpulaunch.run.workers import is_chief_worker

    return is_chief_worker()


def _say_once(line: str) -> None:
    if line not in _said:  # a misspelt moment is never a rehearsal that silently did not happen
        _said.add(line)
        print(line, file=sys.stderr, flush=True)
