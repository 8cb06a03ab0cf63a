"""The keras engine's train (with periodic evaluation), evaluate and export, around `engine/keras/standalone.py`.

The same functions run on a TPU slice (TPUStrategy, with a cluster resolver), on several workers
(MultiWorkerMirrored, from $TF_CONFIG), on several local GPUs (Mirrored) and on one device. What the
run does is told to a `RunRecorder` with the same events as the estimator engine's, so progress, the
run record, Ctrl-C / SIGTERM (a checkpoint at the current step, exit 130 / 143), the TPU watchdog and
`--auto-resume` behave the same.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple

from tpulaunch.data.pipeline import naming_read_errors
from tpulaunch.engine.core.build_failures import build_errors
from tpulaunch.engine.core.model_dir import checkpoint_step, model_dir_errors, repair_checkpoints, write_job_copy
from tpulaunch.engine.core.values import spec_errors
from tpulaunch.engine.core.lost_tpu import recover
from tpulaunch.engine.estimator.runner import _evaluation_stopped  # until the loop is shared
from tpulaunch.engine.keras import plain
from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.schema import Job
from tpulaunch.plan.build import Plan
from tpulaunch.run import phases
from tpulaunch.run.events import EvalResult, RunRecorder, TrainSummary
from tpulaunch.run.signals import StopSignal, TrainingStopped

if TYPE_CHECKING:
    from tpulaunch.run.watchdog import WatchPlan


def _refuse_estimator_checkpoints(model_dir: str) -> None:
    """A TPUEstimator model_dir holds name-based checkpoints the keras engine's object-based restore cannot read."""
    import tensorflow as tf

    path = tf.train.latest_checkpoint(model_dir)
    if path is None:
        return
    names = {name for name, _ in tf.train.list_variables(path)}
    if "global_step" in names and plain.STEP_KEY not in names:
        raise TpuLaunchError(
            f"{model_dir} holds TPUEstimator checkpoints ({os.path.basename(path)}); the keras engine cannot resume them",
            hint="train into another run.model_dir (or --model-dir), or set run.engine: estimator on TensorFlow 2.15")


def make_training(job: Job, plan: Plan, *, use_tpu: bool, cluster_resolver: Any = None,
                  search_path: Sequence[str] = (), model_dir: Optional[str] = None, cpu_replicas: Optional[int] = None):
    """The job's KerasTraining (strategy, model, optimizer, checkpoints), failures located at their job key."""
    import tensorflow as tf

    from tpulaunch.engine.keras import standalone

    try:
        strategy = standalone.make_strategy(use_tpu=use_tpu, cluster_resolver=cluster_resolver,
                                            cpu_replicas=cpu_replicas,
                                            **plain.strategy_settings(job, plan, use_tpu=use_tpu))
    except RuntimeError as exc:  # TensorFlow's runtime started before the CPU could be split
        raise TpuLaunchError(f"cannot split the CPU into {cpu_replicas} devices: {exc}") from None
    replicas = strategy.num_replicas_in_sync
    for section in (job.train, job.eval):
        if section is not None and section.batch_size % replicas:
            name = "train" if section is job.train else "eval"
            raise TpuLaunchError(f"{name}.batch_size {section.batch_size} does not divide over the {replicas} replicas "
                                 f"of {type(strategy).__name__}",
                                 hint=f"use a multiple of {replicas} (each replica gets the same share)")
    if job.run.seed is not None:
        tf.keras.utils.set_random_seed(job.run.seed)
    parts = plain.job_parts(job, use_tpu=use_tpu, search_path=search_path)
    settings = plain.training_settings(job, plan, use_tpu=use_tpu)
    if model_dir:
        settings["model_dir"] = model_dir
    with build_errors(job, "train"), spec_errors():
        return standalone.KerasTraining(parts.builder, parts.builder_kwargs, strategy=strategy, policy=parts.policy,
                                        make_optimizer=parts.make_optimizer, custom_loss=parts.whole_loss,
                                        custom_losses=parts.custom_losses, custom_metrics=parts.custom_metrics,
                                        **settings)


def _dataset(job: Job, training, mode: str, use_tpu: bool):
    from tpulaunch.data.pipeline import make_input_fn
    from tpulaunch.engine.keras import standalone

    batch = job.train.batch_size if mode == "train" else (job.eval.batch_size or job.train.batch_size)
    return standalone.distributed_dataset(training.strategy, make_input_fn(job, mode, use_tpu=use_tpu), batch)


# ------------------------------------------------------------------------------------------ train

def train(job: Job, plan: Plan, *, recorder: Optional[RunRecorder] = None, stop: Optional[StopSignal] = None,
          cluster_resolver: Any = None, search_path: Sequence[str] = (), force: bool = False,
          watch: Optional["WatchPlan"] = None, profile: Optional[Tuple[int, int]] = None,
          cpu_replicas: Optional[int] = None) -> TrainSummary:
    """Train to `job.train.steps`, resuming from model_dir's latest complete checkpoint, evaluating as the job says.

    As the estimator engine's `runner.train` (its Raises apply): signals save a checkpoint at the current
    step and raise TrainingStopped / EvaluationStopped; a lost TPU stops (NodeLost) or, with
    `watch.auto_resume`, waits and resumes from the last complete checkpoint.
    """
    if job.train is None or job.data.train is None:
        raise TpuLaunchError("the job has nothing to train on", hint="add a train: section and data.train")
    use_tpu = plan.on_tpu
    model_dir = job.run.model_dir
    recorder = recorder or RunRecorder(total_steps=job.train.steps, batch_size=job.train.batch_size,
                                       log_every_steps=plain.log_every_steps(job), model_dir=model_dir)
    stop = stop or StopSignal()
    with model_dir_errors(model_dir):
        _refuse_estimator_checkpoints(model_dir)
        if plain.is_chief_worker():  # the other workers of a multi-worker run leave model_dir to the chief
            repair_checkpoints(model_dir, recorder)
            write_job_copy(job, model_dir, force=force)
    dog = None
    if watch is not None:
        from tpulaunch.engine.core.lost_tpu import is_lost_tpu_error
        from tpulaunch.run.watchdog import Watchdog

        dog = Watchdog(watch, is_lost_error=is_lost_tpu_error, on_status=recorder.node_seen)
    with stop:
        while True:
            with model_dir_errors(model_dir):
                event = _train_segments(job, plan, recorder, stop, dog, use_tpu, cluster_resolver, search_path,
                                        profile, cpu_replicas)
            if event is None:
                _remove_worker_scratch(model_dir)
                return recorder.finish()
            cluster_resolver = recover(event, job, watch, recorder, stop, use_tpu)
            dog.reset()


def _remove_worker_scratch(model_dir: str) -> None:
    """A non-chief worker's checkpoints (saved only because saving is collective) are removed at the end."""
    import tensorflow as tf

    from tpulaunch.engine.keras.standalone import worker_scratch_dir

    task = plain.worker_task()
    if task is not None and not plain.is_chief_worker():
        scratch = worker_scratch_dir(model_dir, *task)
        if tf.io.gfile.exists(scratch):
            tf.io.gfile.rmtree(scratch)


def _train_segments(job: Job, plan: Plan, recorder: RunRecorder, stop: StopSignal, dog, use_tpu: bool,
                    cluster_resolver, search_path: Sequence[str], profile, cpu_replicas: Optional[int]):
    """Build, restore and train (and evaluate) to the end; the NodeEvent if the TPU was lost, else None."""
    import tensorflow as tf

    from tpulaunch.engine import portable
    from tpulaunch.engine.keras import standalone

    model_dir = job.run.model_dir
    evaluates = job.eval is not None and job.data.eval is not None
    every = job.eval.every_steps if evaluates else None
    steps_per_call = job.tpu.iterations_per_loop if use_tpu else 1
    try:
        if dog is not None:
            dog.start()
        with recorder.phase_scope():
            recorder.phase_began(phases.BUILD)
            training = make_training(job, plan, use_tpu=use_tpu, cluster_resolver=cluster_resolver,
                                     search_path=search_path, cpu_replicas=cpu_replicas)
            restoring = tf.train.latest_checkpoint(model_dir) is not None
            recorder.phase_switch(phases.RESTORE if restoring else phases.INITIALISE)
            step = training.restore()
            if evaluates and step < job.train.steps:  # an evaluation that cannot be built stops the run first
                recorder.phase_switch(phases.BUILD_EVALUATION)
                _prepare_evaluation(training, job, use_tpu)
            if step >= job.train.steps:
                recorder.at_step(step)
                recorder.note(f"already at step {step} of {job.train.steps} in {model_dir}; nothing to train")
            elif step:
                recorder.note(f"resumed from step {step} ({model_dir})")
            iterator = None
            for boundary in portable.boundaries(step, job.train.steps, every):
                if step < boundary:
                    if iterator is None:
                        with naming_read_errors(job, "train"):
                            iterator = iter(_dataset(job, training, "train", use_tpu))
                    step = _train_to(job, training, iterator, boundary, steps_per_call, recorder, stop, dog,
                                     use_tpu, profile)
                    if stop.received is not None:
                        if step >= job.train.steps and evaluates:
                            raise _evaluation_stopped(job, step, stop, recorder)
                        raise TrainingStopped(
                            f"stopped at step {step}, checkpoint saved; rerun the same command to resume",
                            signum=stop.received, step=step, summary=recorder.finish(stopped_by=stop.name))
                    if dog is not None and dog.tripped is not None:
                        return dog.tripped
                if every or (boundary == job.train.steps and evaluates and step == boundary):
                    try:
                        _evaluate_into(training, job, use_tpu, recorder,
                                       should_stop=lambda: stop.received is not None)
                    except standalone.EvaluationInterrupted:
                        raise _evaluation_stopped(job, step, stop, recorder) from None
    except (TrainingStopped, TpuLaunchError):
        raise
    except Exception as exc:  # only a lost TPU is handled here; anything else propagates unchanged
        if dog is None or not dog.record_error(exc):
            raise
        return dog.tripped
    finally:
        if dog is not None:
            dog.stop()
    return None


def _train_to(job: Job, training, iterator, until: int, steps_per_call: int, recorder: RunRecorder,
              stop: StopSignal, dog, use_tpu: bool, profile) -> int:
    """Train one segment, telling the recorder each call's steps, loss and input wait, and each checkpoint."""
    from tpulaunch.engine.keras import standalone

    first = [True]
    recorder.phase_switch(phases.FIRST_STEP, "XLA compiles the TPU program" if use_tpu else None)
    recorder.session_began(training.step)
    tracer = _Profiler(profile, job.run.model_dir, recorder) if profile else None

    def on_steps(step: int, loss: float, input_wait: Optional[float]) -> None:
        if first[0]:
            recorder.phase_switch(phases.TRAINING)
            first[0] = False
        recorder.steps_run(step, loss, input_wait)
        if tracer is not None:
            tracer.at(step)

    def should_stop() -> bool:
        return stop.received is not None or (dog is not None and dog.tripped is not None)

    def on_checkpoint(step: int, path: str) -> None:
        recorder.checkpoint_saved(step, path)

    try:
        with build_errors(job, "train"), spec_errors():  # the step's trace: the job's code is called here
            training.prepare_training(iterator, time_input=not use_tpu)
        with naming_read_errors(job, "train"):
            step = standalone.train_loop(training, iterator, until=until, steps_per_call=steps_per_call,
                                         on_steps=on_steps, should_stop=should_stop, on_checkpoint=on_checkpoint,
                                         time_input=not use_tpu)
    finally:
        if tracer is not None:
            tracer.close()
        opened = [name for name in recorder.phases.open_phases() if name in (phases.FIRST_STEP, phases.TRAINING)]
        if opened:
            recorder.phase_ended(opened[0])
        recorder.session_ended()
    return step


class _Profiler:
    """A TensorBoard profile of global steps [first, last] into model_dir (tf.profiler.experimental)."""

    def __init__(self, profile: Tuple[int, int], model_dir: str, recorder: RunRecorder):
        self.first, self.last = profile
        self.model_dir = model_dir
        self.recorder = recorder
        self.started = False

    def at(self, step: int) -> None:
        import tensorflow as tf

        if not self.started and self.first - 1 <= step < self.last:
            tf.profiler.experimental.start(self.model_dir)
            self.started, self.began = True, step
        elif self.started and step >= self.last:
            self.close()

    def close(self) -> None:
        import tensorflow as tf

        if self.started:
            tf.profiler.experimental.stop()
            self.started = False
            self.recorder.profile_captured(self.first, self.last, self.model_dir,
                                           os.path.join(self.model_dir, "plugins", "profile"))


# --------------------------------------------------------------------------------------- evaluate

def _prepare_evaluation(training, job: Job, use_tpu: bool):
    """The evaluation's dataset (built, not read), its metrics made and its step traced: (dataset, per-replica batch)."""
    batch = (job.eval.batch_size or job.train.batch_size) // training.strategy.num_replicas_in_sync
    with naming_read_errors(job, "eval"):
        dataset = _dataset(job, training, "eval", use_tpu)
    with build_errors(job, "eval"), spec_errors():  # metrics made and the step traced: the job's code runs
        training.prepare_evaluation(dataset, batch)
    return dataset, batch


def _evaluate_into(training, job: Job, use_tpu: bool, recorder: RunRecorder, should_stop=None) -> EvalResult:
    with recorder.phase(phases.EVALUATION):
        dataset, batch = _prepare_evaluation(training, job, use_tpu)
        with naming_read_errors(job, "eval"):
            results = training.evaluate(dataset, job.eval.steps, should_stop=should_stop, per_replica_batch=batch)
    return recorder.evaluated(int(results["global_step"]), results)


def evaluate(job: Job, plan: Plan, *, checkpoint: Optional[str] = None, recorder: Optional[RunRecorder] = None,
             cluster_resolver: Any = None, search_path: Sequence[str] = (),
             cpu_replicas: Optional[int] = None) -> EvalResult:
    """Evaluate model_dir's latest checkpoint (or `checkpoint`) for `eval.steps` batches."""
    if job.eval is None or job.data.eval is None:
        raise TpuLaunchError("the job has nothing to evaluate", hint="add an eval: section and data.eval")
    if checkpoint is None and checkpoint_step(job.run.model_dir) is None:
        raise TpuLaunchError(f"no checkpoint in {job.run.model_dir} to evaluate",
                             hint="train first, or pass --checkpoint PATH")
    recorder = recorder or RunRecorder()
    with recorder.phase(phases.BUILD):
        _refuse_estimator_checkpoints(job.run.model_dir)
        training = make_training(job, plan, use_tpu=plan.on_tpu, cluster_resolver=cluster_resolver,
                                 search_path=search_path, cpu_replicas=cpu_replicas)
    with recorder.phase(phases.RESTORE):
        training.restore(checkpoint)
    return _evaluate_into(training, job, plan.on_tpu, recorder)


# ----------------------------------------------------------------------------------------- export

def export(job: Job, plan: Plan, out_dir: str, *, checkpoint: Optional[str] = None,
           search_path: Sequence[str] = ()) -> str:
    """A SavedModel of the latest checkpoint (or `checkpoint`) under `out_dir/<timestamp>`; nothing left on failure."""
    import tensorflow as tf

    from tpulaunch.engine.keras import standalone

    if checkpoint is None and checkpoint_step(job.run.model_dir) is None:
        raise TpuLaunchError(f"no checkpoint in {job.run.model_dir} to export", hint="train first")
    _refuse_estimator_checkpoints(job.run.model_dir)
    training = make_training(job, plan, use_tpu=False, search_path=search_path)
    training.restore(checkpoint)
    existed = tf.io.gfile.exists(out_dir)
    try:
        return standalone.export_saved_model(training, out_dir, list(job.data.labels))
    except BaseException:
        if not existed and tf.io.gfile.exists(out_dir):
            tf.io.gfile.rmtree(out_dir)
        raise
