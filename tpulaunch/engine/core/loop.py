"""The outer training loop every engine runs: one copy of what a run does around the steps.

repair the checkpoint state -> write the job copy -> start (build, restore) -> "resumed" / "already at"
-> build the evaluation -> train to each evaluation boundary and evaluate there -> a signal stops with a
checkpoint (or abandons the evaluation), a lost TPU stops or, with --auto-resume, waits and starts again
from the last complete checkpoint -> the run's summary.

An engine supplies only a `TrainingSession` (how it builds, trains and evaluates); the loop owns the
order, the wording and the stop, signal and lost-TPU rules, so every engine behaves the same.

Fencing: before each training segment (a new session writes into model_dir) and each evaluation the loop
checks that this run still holds model_dir's lease (`run/lease.ensure_held`); the engines check before each
checkpoint save and after each step. A run that lost it stops there with `LeaseLost`, writing nothing more.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from tpulaunch.engine.core.lost_tpu import is_lost_tpu_error, recover
from tpulaunch.engine.core.model_dir import (checkpoint_step, checkpoint_to_read, model_dir_errors, repair_checkpoints,
                                             write_job_copy)
from tpulaunch.errors import TpuLaunchError, first_line
from tpulaunch.run.lease import ensure_held
from tpulaunch.run.signals import EvaluationStopped, StopSignal, TrainingStopped

if TYPE_CHECKING:
    from tpulaunch.job.schema import Job
    from tpulaunch.run.events import RunRecorder, TrainSummary
    from tpulaunch.run.watchdog import WatchPlan


class NonFiniteLoss(Exception):
    """An engine saw the loss become NaN or Inf at global step `step` (raised before that step's save)."""

    def __init__(self, step: int, loss: Optional[float] = None):
        super().__init__(f"the loss became {loss if loss is not None else 'NaN'} at step {step}")
        self.step = step
        self.loss = loss


class TrainingSession(Protocol):
    """What an engine does inside the loop. `should_stop` (given when the session is made) turns true when a
    signal arrived or the TPU was lost: training stops at the next step and saves a checkpoint there."""

    def start(self, cluster_resolver: Any) -> int:
        """Build (again, after a lost TPU: with the new resolver) and restore; the step training resumes from."""

    def prepare_evaluation(self) -> None:
        """Build the evaluation before training, so a run that cannot evaluate stops before it trains."""

    def train_to(self, step: int) -> int:
        """Train to global step `step` (fewer when `should_stop`), saving a checkpoint; the step reached."""

    def evaluate(self) -> bool:
        """Evaluate the latest checkpoint, telling the recorder; False when a stop abandoned it (not reported)."""


def check_trainable(job: "Job") -> None:
    """Refuse a job with nothing to train on (no train section, or no data nor input_fn of its own)."""
    if job.train is None or (job.data.train is None and not job.data.input_fn):
        raise TpuLaunchError("the job has nothing to train on", hint="add a train: section and data.train")


def evaluates(job: "Job") -> bool:
    """Whether the job evaluates: an eval section, and data or its own input_fn."""
    return job.eval is not None and (job.data.eval is not None or bool(job.data.input_fn))


def check_evaluable(job: "Job", checkpoint: Optional[str], say: Callable[[str], None]) -> str:
    """The checkpoint to evaluate (`model_dir.checkpoint_to_read`: the given one, or model_dir's newest complete one,
    `say` told when a newer one was skipped); refuses an evaluation with nothing to evaluate: no eval section or
    data, or no checkpoint that can be restored."""
    if not evaluates(job):
        raise TpuLaunchError("the job has nothing to evaluate", hint="add an eval: section and data.eval")
    return checkpoint_to_read(job.run.model_dir, checkpoint, "evaluate", say)


def train(job: "Job", session_for: Callable[[Callable[[], bool]], TrainingSession], *, recorder: "RunRecorder",
          stop: StopSignal, watch: Optional["WatchPlan"], use_tpu: bool, cluster_resolver: Any = None,
          force: bool = False, writes_model_dir: bool = True) -> "TrainSummary":
    """Train `job` to `train.steps` from model_dir's latest complete checkpoint, evaluating as the job says.

    Args:
        session_for: makes the engine's session, given the loop's `should_stop`.
        watch: watch the TPU node (`watchdog.WatchPlan`); None: no watching.
        writes_model_dir: this process repairs the checkpoint state and writes the job copy (a multi-worker
            run's other workers leave model_dir to the chief).

    Raises:
        TrainingStopped, EvaluationStopped, watchdog.NodeLost, TpuLaunchError: see `seam/engine.py`'s train.
    """
    model_dir = job.run.model_dir
    with model_dir_errors(model_dir):
        if writes_model_dir:
            repair_checkpoints(model_dir, recorder)
            write_job_copy(job, model_dir, force=force)
    dog = None
    if watch is not None:
        from tpulaunch.run.watchdog import Watchdog

        dog = Watchdog(watch, is_lost_error=is_lost_tpu_error, on_status=recorder.node_seen)

    def should_stop() -> bool:
        return stop.received is not None or (dog is not None and dog.tripped is not None)

    loop = _Loop(job, session_for(should_stop), recorder, stop, dog)
    with stop:
        while True:
            with model_dir_errors(model_dir):
                try:
                    event = loop.segments(cluster_resolver)
                except NonFiniteLoss as nan:
                    _roll_back(job, nan, recorder)  # or stop, exit 1
                    continue
            if event is None:
                return recorder.finish()
            cluster_resolver = recover(event, job, watch, recorder, stop, use_tpu)
            dog.reset()


class _Loop:
    def __init__(self, job: "Job", session: TrainingSession, recorder: "RunRecorder", stop: StopSignal, dog):
        self.job, self.session, self.recorder, self.stop, self.dog = job, session, recorder, stop, dog
        self.first = True

    def segments(self, cluster_resolver):
        """From the latest checkpoint to the end; the NodeEvent when the TPU was lost, else None."""
        dog = self.dog
        try:
            if dog is not None:
                dog.start()
            with self.recorder.phase_scope():
                return self._segments(cluster_resolver)
        except (TrainingStopped, TpuLaunchError, NonFiniteLoss):
            raise
        except Exception as exc:  # only a lost TPU is handled here; anything else propagates unchanged
            if dog is None or not dog.record_error(exc):
                raise
            return dog.tripped
        finally:
            if dog is not None:
                dog.stop()

    def _segments(self, cluster_resolver):
        job, session, recorder, stop, dog = self.job, self.session, self.recorder, self.stop, self.dog
        model_dir, total = job.run.model_dir, job.train.steps
        evaluating = evaluates(job)
        every = job.eval.every_steps if evaluating else None
        step = session.start(cluster_resolver)
        first, self.first = self.first, False
        if first:  # a restart after a lost TPU is told by the recorder's own "resuming" line
            if step >= total:
                recorder.at_step(step)
                recorder.note(f"already at step {step} of {total} in {model_dir}; nothing to train")
            elif step:
                recorder.note(f"resumed from step {step} ({model_dir})")
            if evaluating and step < total:
                session.prepare_evaluation()
        from tpulaunch.engine.portable import train_and_evaluate

        def ended(step: int):
            """After a training segment: a signal stops the run with its checkpoint; a lost TPU ends it (returned)."""
            tripped = dog.tripped if dog is not None else None
            if stop.received is not None:
                if tripped is not None:  # the TPU went too: the save at the stop may be incomplete
                    repair_checkpoints(model_dir, recorder)
                    step = checkpoint_step(model_dir) or step
                if step >= total and evaluating:  # a rerun evaluates it: say so
                    raise evaluation_stopped(job, step, stop, recorder)
                raise TrainingStopped(
                    f"stopped at step {step}, checkpoint saved; rerun the same command to resume",
                    signum=stop.received, step=step, summary=recorder.finish(stopped_by=stop.name))
            return tripped

        def train_to(step: int) -> int:
            ensure_held(model_dir)
            return session.train_to(step)

        def evaluate(step: int) -> None:
            ensure_held(model_dir)
            if not session.evaluate():
                raise evaluation_stopped(job, step, stop, recorder)

        return train_and_evaluate(step, total, every, train_to=train_to,
                                  evaluate=evaluate if evaluating else None, ended=ended)


def evaluation_stopped(job: "Job", step: int, stop: StopSignal, recorder: "RunRecorder") -> EvaluationStopped:
    """A signal arrived during the evaluation of the checkpoint at `step` (or just before the final one)."""
    summary = recorder.finish(stopped_by=stop.name)
    final = step >= job.train.steps
    if final:
        message = (f"stopped at step {step}, checkpoint saved; training is complete, but the final evaluation did "
                   "not finish and is not reported")
    else:
        message = (f"stopped at step {step}, checkpoint saved; the evaluation at that step did not finish and is not "
                   "reported; rerun the same command to resume training")
    return EvaluationStopped(message, signum=stop.received, step=step, summary=summary, final=final,
                             checkpoint=os.path.join(job.run.model_dir, f"model.ckpt-{step}"))


def _roll_back(job: "Job", nan: NonFiniteLoss, recorder: "RunRecorder") -> None:
    """The loss became NaN or Inf: point model_dir at its last good checkpoint (a rerun resumes there, never from
    NaN weights), then go on from it while `train.on_nan.rollback` allows (each rollback noted and in the run
    record, as TF Model Garden's recovery does), else stop with the job's error (exit 1)."""
    import tensorflow as tf

    from tpulaunch.engine.core.checkpoints import aside_folders, last_good_checkpoint, roll_back_to

    model_dir = job.run.model_dir
    good = last_good_checkpoint(model_dir)
    where = f"the last good checkpoint is {good[0]} (step {good[1]})" if good else "no good checkpoint was saved"
    try:
        folder, moved = roll_back_to(model_dir, good[0] if good is not None else None)
    except (OSError, tf.errors.OpError) as exc:  # a rerun would restore the newest checkpoint: the NaN weights
        raise TpuLaunchError(
            f"the loss became {_loss_text(nan)} at step {nan.step}; {where}, but the checkpoints after it could not "
            f"be moved out of model_dir: {first_line(exc)}",
            hint="fix that, then move the checkpoints newer than the last good one out of model_dir yourself: a "
                 "rerun restores the newest complete checkpoint, whose weights may be NaN") from exc
    # What this rollback moved aside (a checkpoint line may have announced it).
    aside = f"{', '.join(moved)} moved to {folder}, for inspection" if moved else ""
    # The record's list of rollbacks (run/run_record.py writes it): kept on the recorder, which the record reads.
    rollbacks = recorder.__dict__.setdefault("nan_rollbacks", [])
    allowed = job.train.on_nan.rollback if job.train.on_nan is not None else 0
    if len(rollbacks) < allowed:
        rollbacks.append({"step": nan.step, "to_step": good[1] if good else 0, "checkpoint": good[0] if good else None})
        recorder.rolled_back(good[1] if good else 0, good[0] if good else None)
        again = "training goes on from there" if good else "training starts again from step 0"
        recorder.note(f"nan | the loss became {_loss_text(nan)} at step {nan.step}; {where}: {again} "
                      f"(rollback {len(rollbacks)} of {allowed}, train.on_nan)" + (f"; {aside}" if aside else ""))
        return
    tried = f" after {allowed} rollback{'s' if allowed != 1 else ''} (train.on_nan)" if allowed else ""
    rerun = "a rerun resumes from it" if good else "a rerun starts from step 0"
    if not aside:  # having moved nothing, this stop names what an earlier rollback left
        earlier = aside_folders(model_dir)
        aside = f"the checkpoints moved aside earlier are in {', '.join(earlier)}" if earlier else ""
    if aside:
        rerun += f" ({aside})"
    hint = f"{rerun}; the learning rate, the data or the model make the loss diverge there"
    if not allowed:
        back = "restores that checkpoint" if good else "starts again from step 0"
        hint += f"; train.on_nan: {{rollback: N}} {back} and goes on, at most N times"
    raise TpuLaunchError(f"the loss became {_loss_text(nan)} at step {nan.step}{tried}; {where}", hint=hint)


def _loss_text(nan: NonFiniteLoss) -> str:
    return "NaN" if nan.loss is None or nan.loss != nan.loss else f"{nan.loss:g}"
