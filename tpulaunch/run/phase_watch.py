"""Never silence: a phase that runs far past what is usual says so, again and again at growing intervals.

`PhaseWatch.check()` looks at the recorder's innermost open phase: once it has run longer than what
is usual for it (`run.phases.USUAL_S`), the recorder emits a `PhaseSlow` event with what is known
(how long the phase has run, the TPU node's last reported state, what the phase is doing on a TPU);
the next notice comes when the phase has run twice as long, and so on, never more than
`MAX_GAP_S` apart. Training is watched by the time since its last finished step instead (a step
that hangs), against ten times the usual time per session run.

`start()` runs `check()` every `tick_s` seconds in a daemon thread; tests call `check()` themselves
with a hand-stepped clock.
"""

from __future__ import annotations

import threading
from typing import Dict, Optional, Tuple

from tpulaunch.run.events import RunRecorder
from tpulaunch.run.phases import FIRST_STEP, INITIALISE, RESTORE, TRAINING, USUAL_ON_TPU_S, USUAL_S

# The longest stretch without a notice while a phase stays slow.
MAX_GAP_S = 600.0
# A training step is overdue after this many times the usual time per session run (and at least TRAINING_USUAL_S).
STEP_FACTOR = 10.0
TRAINING_USUAL_S = 60.0

# What a phase is doing on a TPU, for its slow notice.
ON_TPU = {
    INITIALISE: "starting the TPU system",
    RESTORE: "starting the TPU system and restoring the checkpoint",
    FIRST_STEP: "XLA compiles the TPU program before the first step runs: minutes for a big model",
}


class PhaseWatch:
    """Emits `PhaseSlow` through `recorder` while a phase runs far past what is usual.

    Args:
        recorder: the run's recorder (its clock and its open phases).
        on_tpu: the run is on a TPU (longer usual start-up, what the start-up is doing).
        usual: seconds a phase usually takes at most, by name (default: `run.phases.USUAL_S`, or
            USUAL_ON_TPU_S on a TPU).
        tick_s: how often the thread started by `start()` checks.
    """

    def __init__(self, recorder: RunRecorder, *, on_tpu: bool = False, usual: Optional[Dict[str, float]] = None,
                 tick_s: float = 1.0):
        self.recorder = recorder
        self.on_tpu = on_tpu
        self.usual = dict(usual if usual is not None else (USUAL_ON_TPU_S if on_tpu else USUAL_S))
        self.tick_s = tick_s
        self._watched: Optional[Tuple[str, float]] = None  # (phase, when it opened / the last step)
        self._next_notice = 0.0  # seconds into it
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def check(self) -> None:
        """Emit a notice when the innermost phase has run past its next notice time."""
        current = self.recorder.phases.current()
        if current is None:
            self._watched = None
            return
        name, began = current
        usual = self.usual.get(name)
        last_step = None
        if name == TRAINING:
            began, usual = self._training(began)
            last_step = self.recorder.step
        if usual is None:
            return
        if self._watched != (name, began):
            self._watched, self._next_notice = (name, began), usual
        seconds = self.recorder.get_time() - began
        if seconds < self._next_notice:
            return
        self._next_notice = min(seconds * 2, seconds + MAX_GAP_S)
        self.recorder.phase_slow(name, seconds, usual, self._known(name), last_step)

    def _training(self, began: float) -> Tuple[float, float]:
        """(since when no step finished, how long a step may take) for the training phase."""
        last = self.recorder.last_step_at
        rate = self.recorder.steps_per_sec
        usual = max(TRAINING_USUAL_S, STEP_FACTOR / rate) if rate else TRAINING_USUAL_S
        return (last if last is not None and last > began else began), usual

    def _known(self, name: str) -> Tuple[str, ...]:
        known = []
        if self.on_tpu and name in ON_TPU:
            known.append(ON_TPU[name])
        if self.recorder.node_state is not None:
            state, since = self.recorder.node_state
            known.append(f"TPU node {state} for {self.recorder.get_time() - since:.0f} s (its last reported state)")
        return tuple(known)

    def start(self) -> "PhaseWatch":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tpulaunch-phase-watch", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.check()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.tick_s * 2)
            self._thread = None

    def __enter__(self) -> "PhaseWatch":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
