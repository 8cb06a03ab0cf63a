"""Following a remote run from outside: the lines a host's `tpulaunch train` wrote to model_dir, and its status.

The controller reads only what the run writes anyway (no connection to the VM), so it costs the run nothing.
The progress lines are train's own (`cli/render/run_plain.py`: a VM's output is not a terminal); the few they carry
that recovery needs are read back here: the step trained, the checkpoint saved, the step a run started from.
"""

from __future__ import annotations

import json
import re
from typing import List, Optional

from tpulaunch import store
from tpulaunch.remote import layout

STEP_LINE = re.compile(r"^train \| step (\d+)/(\d+)")
START_LINE = re.compile(r"^train \| start \| step (\d+)/(\d+)")
CHECKPOINT_LINE = re.compile(r"^checkpoint \| step (\d+)")


class HostLog:
    """New complete lines of one host's log, each read once (a line still being written waits for its end)."""

    def __init__(self, model_dir: str, attempt: int, worker: int = 0):
        self.url = layout.host_log(model_dir, attempt, worker)
        self.offset = 0
        self._partial = b""
        self.step: Optional[int] = None  # the newest step the log showed
        self.total: Optional[int] = None
        self.checkpoint: Optional[int] = None  # the newest checkpoint it showed saved
        self.started_from: Optional[int] = None  # the step training started (or resumed) from
        self.first_step: Optional[int] = None  # the first step trained

    def new_lines(self) -> List[str]:
        found = store.read(self.url, self.offset)
        if found is None or not found.data:
            return []
        data = found.data
        self.offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        lines = [line.decode("utf-8", errors="replace").rstrip("\r") for line in complete]
        for line in lines:
            self._note(line)
        return lines

    def _note(self, line: str) -> None:
        match = STEP_LINE.match(line)
        if match:
            self.step, self.total = int(match.group(1)), int(match.group(2))
            if self.first_step is None:
                self.first_step = self.step
            return
        match = START_LINE.match(line)
        if match:
            self.started_from, self.total = int(match.group(1)), int(match.group(2))
            return
        match = CHECKPOINT_LINE.match(line)
        if match:
            self.checkpoint = int(match.group(1))


class Recovery:
    """How long a JobSet's restart took to train again, as its follower sees it: from the moment it saw the loss
    (a pod failed, the restart count grew) to the first step the chief's new log shows, and the steps lost (the
    newest step the old log showed, less the step the new one resumed from: as fine as the job's log cadence)."""

    def __init__(self):
        self._lost: Optional[tuple] = None  # (when, the newest step seen) of a loss not yet recovered from
        self.recoveries: List[dict] = []  # each recovery, in order (one may follow several restarts in a row)
        self.restarts = 0  # each loss seen, recovered from or not

    def lost(self, log: HostLog, now: float) -> None:
        """The run was lost at `now`; `log` is the chief's log of the generation that was lost. Lost again before
        it trained again (two restarts in a row): the time back still counts from the first loss, and the steps lost
        from the newest step either generation logged."""
        self.restarts += 1
        if self._lost is not None:
            noticed, step = self._lost
            if log.step is not None and (step is None or log.step > step):
                step = log.step
            self._lost = (noticed, step)
            return
        self._lost = (now, log.step)

    def back(self, log: HostLog, now: float) -> Optional[str]:
        """Once `log` (the new generation's chief) shows its first step after a loss: what to say, in words."""
        if self._lost is None or log.first_step is None:
            return None
        noticed, step = self._lost
        self._lost = None
        resumed = log.started_from
        steps_lost = max(0, step - resumed) if step is not None and resumed is not None else None
        self.recoveries.append({"recovery_s": round(now - noticed, 1), "step": step, "resumed_from": resumed,
                                "steps_lost": steps_lost})
        words = f"back in {now - noticed:.1f} s: step {log.first_step} trained"
        if resumed is not None:
            words += f", resumed from step {resumed}"
        if steps_lost is not None:
            words += f" ({steps_lost} step{'s' if steps_lost != 1 else ''} since the last logged step lost)"
        return words

    def summary(self) -> str:
        """What the run's restarts cost, for its last line: "" without one, else e.g. " after 2 restarts (back in
        212.4 s and 31.0 s; 20 steps lost since the last logged step)". A restart it has not trained again after
        (the run ended first) is said as such; steps lost are summed where they are known ("at least" where some
        are not)."""
        if not self.restarts:
            return ""
        parts = []
        if self.recoveries:
            times = [f"{r['recovery_s']:.1f} s" for r in self.recoveries]
            parts.append("back in " + (times[0] if len(times) == 1 else ", ".join(times[:-1]) + " and " + times[-1]))
        if self._lost is not None:
            parts.append("not trained again after the last")
        known = [r["steps_lost"] for r in self.recoveries if r["steps_lost"] is not None]
        if known:
            total = sum(known)
            some_unknown = len(known) < len(self.recoveries)
            parts.append(f"{'at least ' if some_unknown else ''}{total} step{'s' if total != 1 else ''} lost since "
                         "the last logged step")
        restarts = f" after {self.restarts} restart{'s' if self.restarts != 1 else ''}"
        return restarts + (f" ({'; '.join(parts)})" if parts else "")


def host_status(model_dir: str, attempt: int, worker: int = 0) -> Optional[dict]:
    """The host's status file (`host.py`), or None before the host wrote one (or when it is not JSON yet)."""
    status = store.read(layout.host_status(model_dir, attempt, worker))
    if status is None or not status.data:
        return None
    try:
        found = json.loads(status.data)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def attempt_taken(model_dir: str, attempt: int) -> bool:
    """Whether a VM (or a JobSet's restart) of model_dir has the number `attempt`: its claim, or what its chief
    wrote."""
    return any(store.exists(url) for url in (layout.vm_claim(model_dir, attempt), layout.host_status(model_dir, attempt, 0),
                                             layout.host_log(model_dir, attempt, 0)))


def newest_attempt(model_dir: str) -> int:
    """The highest attempt number taken under model_dir (0: no remote run wrote there)."""
    highest = 0
    while attempt_taken(model_dir, highest + 1):
        highest += 1
    return highest


def run_summary(model_dir: str) -> Optional[dict]:
    """The newest remote run under model_dir as `status` shows it: which VM (or JobSet restart), its hosts' phases,
    the chief's newest step and checkpoint; None when no remote run wrote there."""
    attempt = newest_attempt(model_dir)
    if not attempt:
        return None
    log = HostLog(model_dir, attempt)
    log.new_lines()
    hosts = []
    while True:
        found = host_status(model_dir, attempt, len(hosts))
        if found is None:
            break
        hosts.append(found)
    phases = sorted({str(h.get("phase")) for h in hosts})
    ended = [h.get("exit_code") for h in hosts if h.get("exit_code") is not None]
    return {"attempt": attempt, "hosts": len(hosts), "phases": phases, "step": log.step, "steps": log.total,
            "checkpoint": log.checkpoint, "exit_codes": ended}


def summary_text(summary: Optional[dict]) -> str:
    if summary is None:
        return "none (no `tpulaunch run` or `rehearse` wrote to run.model_dir)"
    words = [f"VM {summary['attempt']}", f"{summary['hosts']} host{'s' if summary['hosts'] != 1 else ''} "
                                         f"{'/'.join(summary['phases']) or 'starting'}"]
    if summary["step"] is not None:
        words.append(f"step {summary['step']}/{summary['steps']}")
    if summary["checkpoint"] is not None:
        words.append(f"checkpoint {summary['checkpoint']}")
    if summary["exit_codes"] and len(summary["exit_codes"]) == summary["hosts"]:
        words.append(f"exit {max(summary['exit_codes'], key=abs)}")
    return " | ".join(words)
