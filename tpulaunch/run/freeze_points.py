"""A run frozen at a named moment, as a paused VM or a long partition freezes it there: for rehearsing what the
fence does when the run thaws (docs/running.md: one writer per model_dir).

`$TPULAUNCH_FREEZE_AT` names the moment:

- `lease-taken`: model_dir's lease just written, before the run record's block starts;
- `mid-save@STEP`: the checkpoint of global step STEP written under its staging folder, none of its files at
  their names yet (`engine/core/staged_save.py`).

There the run says `frozen | <moment>` on stderr and stops itself with SIGSTOP, every thread at once (its lease's
renewals too); SIGCONT thaws it. A moment is frozen once per process. Outside such a rehearsal (the variable
unset) each point is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import sys

FREEZE_AT_ENV = "TPULAUNCH_FREEZE_AT"
LEASE_TAKEN = "lease-taken"
MID_SAVE = "mid-save"

_frozen: set = set()
_warned: list = []


def freeze_point(moment: str, step: int | None = None) -> None:
    """Freeze this process here when $TPULAUNCH_FREEZE_AT names `moment` (at `step`, for a moment that has one)."""
    wanted = (os.environ.get(FREEZE_AT_ENV) or "").strip()
    if not wanted:
        return
    if not _names_a_moment(wanted):
        if not _warned:  # said once: a misspelt moment is never a rehearsal that silently did not happen
            _warned.append(wanted)
            print(f"warning: {FREEZE_AT_ENV}={wanted} names no moment ({LEASE_TAKEN}, or {MID_SAVE}@STEP with a "
                  "whole step); nothing is frozen", file=sys.stderr, flush=True)
        return
    name = moment if step is None else f"{moment}@{step}"
    if wanted != name or name in _frozen:
        return
    _frozen.add(name)
    print(f"frozen | {name}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)


def _names_a_moment(text: str) -> bool:
    moment, at, step = text.partition("@")
    return text == LEASE_TAKEN or (moment == MID_SAVE and bool(at) and step.isdigit())
