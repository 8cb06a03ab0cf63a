"""Where a run's wall time goes: named phases, timed on an injected clock, adding up to the wall time.

A run moves through phases (load TensorFlow, build the graph, the first step, training, a
checkpoint, an evaluation...). They nest: a checkpoint written during training interrupts training,
so each moment belongs to the innermost open phase, and what no phase covers is `OTHER`. The
exclusive seconds per phase therefore add up to the wall time from `started_at` exactly.
No TensorFlow here, and no output: the `RunRecorder` turns changes into events.
"""

from __future__ import annotations

import threading
from typing import Callable, Dict, List, Optional, Tuple

# The phases of a run, in the order they usually come.
CHECK = "check the job"
LOAD = "load TensorFlow"
CHECK_CODE = "check the job's code"  # validate's checks of its flags, import paths and input_fns, once TF is loaded
RESOLVE = "resolve the TPU"
BUILD_EVALUATION = "build the evaluation"  # before training: an evaluation that cannot be built stops the run first
BUILD = "build the graph"
INITIALISE = "initialise"
RESTORE = "restore"
FIRST_STEP = "first step"
TRAINING = "training"
CHECKPOINT = "checkpoint"
CLOSE = "close the session"  # after the last step: the final checkpoint, TensorFlow's session close
EVALUATION = "evaluation"
EXPORT = "export"
OTHER = "other"  # time no phase covers (between phases, writing the run record)

# How long a phase usually takes at most, in seconds: past this a run says it is still in it.
# On a TPU, starting the TPU system and XLA's compile of the first step take minutes for big models.
USUAL_S = {LOAD: 60.0, CHECK_CODE: 60.0, RESOLVE: 120.0, BUILD_EVALUATION: 120.0, BUILD: 120.0, INITIALISE: 120.0, RESTORE: 120.0, FIRST_STEP: 120.0,
           CHECKPOINT: 120.0, CLOSE: 120.0, EVALUATION: 300.0, EXPORT: 300.0}
USUAL_ON_TPU_S = {**USUAL_S, INITIALISE: 300.0, RESTORE: 300.0, FIRST_STEP: 600.0}


class PhaseClock:
    """Open and close named phases; read exclusive seconds per phase.

    Args:
        get_time: the clock, in seconds.
        started_at: when the run began on that clock (the wall time counts from there). None: when the
            first phase opens.
    """

    def __init__(self, get_time: Callable[[], float], started_at: Optional[float] = None):
        self.get_time = get_time
        self.started_at = started_at
        self._stack: List[Tuple[str, float]] = []  # (name, began), innermost last
        self._seconds: Dict[str, float] = {}
        self._since: Optional[float] = started_at  # when the innermost phase last changed
        self._lock = threading.Lock()

    def _charge(self, now: float) -> None:
        """Give the time since the last change to the innermost open phase (or OTHER)."""
        if self._since is not None:
            name = self._stack[-1][0] if self._stack else OTHER
            self._seconds[name] = self._seconds.get(name, 0.0) + max(0.0, now - self._since)
        self._since = now

    def enter(self, name: str, at: Optional[float] = None) -> None:
        """Open `name` inside whatever is open, at `at` (default: now)."""
        with self._lock:
            now = self.get_time() if at is None else at
            if self.started_at is None:
                self.started_at = self._since = now
            self._charge(now)
            self._stack.append((name, now))

    def leave(self, name: str) -> List[Tuple[str, float]]:
        """Close `name` and whatever is open inside it: [(name, seconds since it opened)], innermost first.

        Nothing when `name` is not open.
        """
        with self._lock:
            names = [n for n, _ in self._stack]
            if name not in names:
                return []
            now = self.get_time()
            self._charge(now)
            closed = []
            while self._stack:
                top, began = self._stack.pop()
                closed.append((top, now - began))
                if top == name:
                    break
            return closed

    @property
    def depth(self) -> int:
        return len(self._stack)

    def open_phases(self) -> List[str]:
        """The open phases, outermost first."""
        with self._lock:
            return [n for n, _ in self._stack]

    def current(self) -> Optional[Tuple[str, float]]:
        """(name, when it opened) of the innermost open phase; None when none is."""
        with self._lock:
            return self._stack[-1] if self._stack else None

    def snapshot(self) -> Tuple[Optional[float], Dict[str, float]]:
        """(seconds since the run began, exclusive seconds per phase) at one instant.

        Open phases count up to now and OTHER is included, so the seconds add up to the wall time.
        (None, {}) before anything started the run.
        """
        with self._lock:
            if self.started_at is None:
                return None, {}
            now = self.get_time()
            self._charge(now)
            return max(0.0, now - self.started_at), dict(self._seconds)
