"""Notice a lost TPU during training, stop cleanly, and wait for the node to come back.

Two signs that the TPU is gone, turned into the same `NodeEvent`:

* the TPU API says so: a `cluster.NodeWatch` polls the node every `WatchPlan.interval` seconds, and a
  state other than READY, or a health of UNHEALTHY_*/TIMEOUT, trips the watchdog; its SessionRunHook
  then asks the training session to stop after the current run (the same mechanism as Ctrl-C), so
  the Estimator saves a checkpoint at that step when the TPU still answers;
* TensorFlow raises what a vanished TPU raises: UnavailableError, AbortedError,
  DeadlineExceededError, or an InternalError that mentions the TPU, a socket or a connection.

`wait_until_ready` then polls the node until it is READY and HEALTHY again (a PREEMPTED node comes back
when it is recreated, by hand or by a queued resource), giving up after `WatchPlan.resume_wait`
seconds, and returning early when a signal asks training to stop. With `WatchPlan.recreate`
(`train --recreate`), `bring_back` first deletes what is left of a PREEMPTED, TERMINATED or deleted
node and creates it again exactly as `tpulaunch up` does (`tpu/lifecycle.py`); an UNHEALTHY or
REPAIRING node is only waited for, as without it (creating TPUs costs money: opt-in only).

No TensorFlow here: which TensorFlow errors mean a lost TPU, and the hook that ends a session once
the watchdog has tripped, belong to the engine (`engine.estimator.hooks`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from tpulaunch.errors import ExitCode, TpuLaunchError
from tpulaunch.run.events import NodeEvent
from tpulaunch.tpu import node as cluster

DEFAULT_WATCH_INTERVAL_S = 60.0
DEFAULT_RESUME_WAIT_S = 3600.0
LOST_HEALTH = {"TIMEOUT", "DEPRECATED_UNHEALTHY"}  # besides every UNHEALTHY_* value
# A signal arriving during a pause is noticed within this long.


@dataclass(frozen=True)
class WatchPlan:
    """How a run watches its TPU node and recovers from losing it.

    Attributes:
        ref: the node (from `cluster.resolve_node`); 'local' and grpc:// nodes are not polled (no
            API), but TensorFlow's lost-TPU errors still count.
        job_tpu: the job's `tpu` section (the accelerator type the node must still have).
        interval: seconds between polls of the node during training.
        auto_resume: how many times to wait for the node and resume; 0 = stop at the first event.
        resume_wait: seconds to wait for the node to be READY and HEALTHY after each event.
        discovery_url: the v1 endpoint TensorFlow's TPUClusterResolver asks (None: $TPULAUNCH_TPU_DISCOVERY_URL).
        poll_s: first pause between polls while waiting (doubles up to cluster.MAX_POLL_S).
        api_endpoint: the TPU API v2 endpoint (None: $TPULAUNCH_TPU_API_ENDPOINT, else Google's).
        recreate: delete and create the node again when it is preempted, terminated or deleted.
        job_file: named in messages (`tpulaunch down JOB`).
        engine: the job's engine (the default runtime version of a recreated node).
    """

    ref: cluster.NodeRef
    job_tpu: Any = None
    interval: float = DEFAULT_WATCH_INTERVAL_S
    auto_resume: int = 0
    resume_wait: float = DEFAULT_RESUME_WAIT_S
    discovery_url: Optional[str] = None
    poll_s: float = cluster.POLL_S
    api_endpoint: Optional[str] = None
    recreate: bool = False
    job_file: str = "JOB.yaml"
    engine: str = ""  # run.engine's value, else the installed TensorFlow's engine (set by the CLI)

    @property
    def polls(self) -> bool:
        """Whether the node is read through the TPU API (not 'local' or a grpc:// address)."""
        return not (self.ref.local or self.ref.direct)


class NodeLost(TpuLaunchError):
    """Training stopped because the TPU was lost and no automatic resume was left (exit code 3)."""

    def __init__(self, message: str, *, event: NodeEvent, hint: Optional[str] = None, summary: Any = None):
        super().__init__(message, hint=hint, exit_code=ExitCode.CLUSTER)
        self.event = event
        self.step = event.checkpoint_step
        self.summary = summary


def lost_reason(status: cluster.NodeStatus) -> Optional[str]:
    """'PREEMPTED', 'READY/UNHEALTHY_TENSORFLOW', ... when the node cannot go on training; None when it can."""
    if status.state not in cluster.READY_STATES:
        return str(status.state)
    health = status.health or ""
    if health.startswith("UNHEALTHY") or health in LOST_HEALTH:
        return f"{status.state}/{health}"
    return None


class Watchdog:
    """Trips on the first sign of a lost TPU during one training attempt.

    Use `start()` before a training session and `stop()` after it, and end the session once
    `tripped` holds an event (None while all is well). `reset()` clears it before a resumed attempt.

    Args:
        plan: the node and how to watch it.
        is_lost_error: whether an exception the engine raised means the TPU went away.
        on_status: told the node's state ("READY/HEALTHY", "PREEMPTED"...) at the first poll and each
            change (what a slow phase's notice can say about the TPU).
    """

    def __init__(self, plan: WatchPlan, *, is_lost_error: Callable[[BaseException], bool],
                 on_status: Callable[[str], None] = lambda state: None):
        self.plan = plan
        self._is_lost_error = is_lost_error
        self._on_status = on_status
        self.tripped: Optional[NodeEvent] = None
        self.last_status: Optional[cluster.NodeStatus] = None
        self._watch: Optional[cluster.NodeWatch] = None
        self._lock = threading.Lock()

    def start(self) -> "Watchdog":
        """Poll the node in a background thread (no-op for nodes without an API, or when already polling)."""
        if self.plan.polls and self._watch is None:
            self._watch = cluster.watch_node(self.plan.ref, self.plan.interval, self._on_change,
                                             api_endpoint=self.plan.api_endpoint)
        return self

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop(timeout=cluster.REQUEST_TIMEOUT_S)
            self._watch = None

    def reset(self) -> None:
        with self._lock:
            self.tripped = None

    def record_error(self, exc: BaseException) -> bool:
        """Trip on a lost-TPU error (kept only if nothing tripped before); False for other errors."""
        if not self._is_lost_error(exc):
            return False
        message = str(getattr(exc, "message", exc)).strip().splitlines()
        self._trip(NodeEvent(kind="error", detail=f"{type(exc).__name__}: {message[0] if message else ''}".rstrip(": ")))
        return True

    def _on_change(self, status: cluster.NodeStatus) -> None:
        self.last_status = status
        self._on_status(f"{status.state}/{status.health}" if status.health else str(status.state))
        reason = lost_reason(status)
        if reason is not None:
            self._trip(NodeEvent(kind="node", detail=reason))

    def _trip(self, event: NodeEvent) -> None:
        with self._lock:
            if self.tripped is None:
                event.noticed_at = time.monotonic()  # what the recovery time counts from
                self.tripped = event


def wait_until_ready(plan: WatchPlan, *, should_stop: Callable[[], bool] = lambda: False,
                     on_wait: Optional[Callable[[Optional[cluster.NodeStatus], Optional[str], float], None]] = None,
                     ) -> Optional[cluster.NodeStatus]:
    """Poll the node until it is READY, HEALTHY and still the job's type.

    Unlike `cluster.check_node(wait=...)`, this keeps waiting through PREEMPTED/TERMINATED/STOPPED
    (a node that is being recreated) and through API errors such as 404 (deleted, not yet created).

    Args:
        plan: the node and how long to wait.
        should_stop: polled during pauses; when true, return None at once (a signal arrived).
        on_wait: called as on_wait(status or None, API error message or None, seconds left) after
            each poll that found the node not usable.

    Returns:
        The usable NodeStatus, or None when `should_stop` became true.

    Raises:
        TpuLaunchError (exit code CLUSTER): not usable after `plan.resume_wait` seconds, or the node
            came back as another accelerator type.
    """
    deadline = time.monotonic() + plan.resume_wait
    pause = plan.poll_s
    last = "no answer"
    while True:
        try:
            status = cluster.check_node(plan.ref, plan.job_tpu, api_endpoint=plan.api_endpoint,
                                        backoff_s=min(cluster.BACKOFF_S, plan.poll_s))
        except TpuLaunchError as exc:  # 404 while the node is recreated, API trouble: keep waiting
            status, problem = None, exc.message
            last = problem
        else:
            problem = None
            if status.usable:
                return status
            if any(f.code == "accelerator-type-mismatch" for f in status.findings):
                status.raise_if_unusable()  # waiting will not change the type
            last = "; ".join(f.message for f in status.findings if f.severity == "error")
        left = deadline - time.monotonic()
        if left <= 0:
            raise TpuLaunchError(
                f"TPU node '{plan.ref.name}' was not READY and HEALTHY after waiting {plan.resume_wait:g}s: {last}",
                hint="recreate or restart the node, then rerun the same command: training resumes from the last "
                     "complete checkpoint (--resume-wait SECONDS waits longer)",
                exit_code=ExitCode.CLUSTER)
        if on_wait is not None:
            on_wait(status, problem, left)
        if cluster.sleep_unless(min(pause, left), should_stop):
            return None
        pause = min(pause * 2, cluster.MAX_POLL_S)


def bring_back(plan: WatchPlan, *, should_stop: Callable[[], bool] = lambda: False,
               on_progress: Callable[[str], None] = lambda text: None) -> Optional[float]:
    """With `plan.recreate`: when the node is PREEMPTED, TERMINATED or gone, delete what is left of it and
    create it again as `tpulaunch up` does, waiting until it is READY (at most `plan.resume_wait` seconds).

    Returns:
        The seconds the delete + create took, or None when the node needed no recreating (READY, or on
        its way: the caller waits for it as without --recreate).

    Raises:
        TpuLaunchError: the create failed (NoCapacity for a stockout: exit code 4), naming what it left
            behind and the `tpulaunch down` that removes it.
    """
    from tpulaunch.tpu.lifecycle import Lifecycle, spec_for

    life = Lifecycle(plan.ref, spec_for(plan.job_tpu, plan.engine), job_file=plan.job_file,
                     api_endpoint=plan.api_endpoint, poll_s=plan.poll_s, backoff_s=min(cluster.BACKOFF_S, plan.poll_s),
                     on_progress=on_progress, should_stop=should_stop)
    node = life.read_node()
    state = node.get("state") if node is not None else cluster.NOT_FOUND
    if state not in cluster.RECREATE_STATES:
        return None
    started = time.monotonic()
    if node is not None or (life.spec.queued and life.read_queued() is not None):
        life.delete(wait_s=plan.resume_wait)
    life.create(wait_s=max(0.0, plan.resume_wait - (time.monotonic() - started)))
    return round(time.monotonic() - started, 3)
