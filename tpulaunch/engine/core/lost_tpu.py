"""A lost TPU, for every engine: which TensorFlow errors mean the TPU went away, and what a run does then
(keep the last complete checkpoint; stop, or wait for the node and resume)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpulaunch.job.schema import Job
    from tpulaunch.run.events import RunRecorder
    from tpulaunch.run.signals import StopSignal

# An InternalError is a lost TPU only when its message speaks of the TPU or its connection.
_TPU_WORDS = re.compile(r"\btpu|socket|connection", re.IGNORECASE)


def is_lost_tpu_error(exc: BaseException) -> bool:
    """Whether a TensorFlow error is what a TPU that went away raises."""
    import tensorflow as tf

    if isinstance(exc, (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.DeadlineExceededError)):
        return True
    if isinstance(exc, tf.errors.InternalError):
        return bool(_TPU_WORDS.search(str(getattr(exc, "message", exc))))
    return False


def recover(event, job: "Job", watch, recorder: "RunRecorder", stop: "StopSignal", use_tpu: bool):
    """After a lost TPU: keep the last complete checkpoint, then stop (NodeLost) or wait and return a resolver."""
    from tpulaunch.engine.core.model_dir import repair_checkpoints
    from tpulaunch.run.signals import TrainingStopped
    from tpulaunch.run.watchdog import NodeLost, wait_until_ready

    model_dir = job.run.model_dir
    event.step = recorder.step
    repair = repair_checkpoints(model_dir, recorder)
    event.checkpoint_step = repair.step or 0
    recorder.node_lost(event)
    name = watch.ref.name
    if recorder.resumes >= watch.auto_resume:
        summary = recorder.finish(stopped_by=f"TPU {event.detail}")
        tried = f" after {recorder.resumes} automatic resume{'s' if recorder.resumes != 1 else ''}" \
            if recorder.resumes else ""
        raise NodeLost(
            f"TPU node '{name}' lost ({event.detail}) at step {event.step}{tried}; the last complete checkpoint is "
            f"at step {event.checkpoint_step} ({event.steps_lost} steps lost)",
            hint="once the node is READY again (`gcloud compute tpus describe` / recreate a preempted node), rerun "
                 "the same command to resume from that checkpoint; add --auto-resume N to wait and resume "
                 "automatically",
            event=event, summary=summary)

    def waiting(status, problem, left):
        recorder.node_waiting(problem or (lost_state(status) if status else "no answer"), left)

    recreated_in = None
    if watch.recreate:  # preempted or deleted: create it again as `tpulaunch up` does (--recreate)
        from tpulaunch.run.watchdog import bring_back

        recreated_in = bring_back(watch, should_stop=lambda: stop.received is not None,
                                  on_progress=lambda text: recorder.note(f"tpu | {text}"))
    status = wait_until_ready(watch, should_stop=lambda: stop.received is not None, on_wait=waiting)
    if status is None:
        summary = recorder.finish(stopped_by=stop.name)
        raise TrainingStopped(
            f"stopped while waiting for TPU node '{name}'; the checkpoint at step {event.checkpoint_step} is kept: "
            "rerun the same command to resume",
            signum=stop.received, step=event.checkpoint_step, summary=summary)
    recorder.node_ready(f"{status.state}/{status.health}", event.checkpoint_step, watch.auto_resume, recreated_in)
    if not use_tpu:
        return None
    from tpulaunch.tpu import node as cluster

    return cluster.cluster_resolver(watch.ref, watch.discovery_url)


def lost_state(status) -> str:
    """The node's state for a waiting line: 'PREEMPTED', 'READY/UNHEALTHY_TENSORFLOW', 'CREATING'."""
    if status.state == "READY" and status.health:
        return f"{status.state}/{status.health}"
    return str(status.state)
