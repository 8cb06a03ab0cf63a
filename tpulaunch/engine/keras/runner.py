"""The keras engine's train (with periodic evaluation), evaluate and export, around `engine/keras/standalone.py`.

The same functions run on a TPU slice (TPUStrategy, with a cluster resolver), on several workers
(MultiWorkerMirrored, from $TF_CONFIG), on several local GPUs (Mirrored) and on one device. What the
run does is told to a `RunRecorder` with the same events as the estimator engine's, so progress, the
run record, Ctrl-C / SIGTERM / SIGHUP (a checkpoint at the current step, exit 130 / 143 / 129), the TPU
watchdog, `--auto-resume` and the fence of a run whose model_dir lease was taken over (no checkpoint after
it, exit 5) behave the same.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Tuple

from tpulaunch.engine.pipeline import eval_left_out, naming_read_errors
from tpulaunch.engine.core import loop
from tpulaunch.engine.keras.locate import build_errors
from tpulaunch.engine.core.model_dir import checkpoint_to_read, model_dir_errors
from tpulaunch.engine.core.staged_save import staged_write
from tpulaunch.engine.plain import log_every_steps, spec_errors
from tpulaunch.engine.keras import plain
from tpulaunch.engine.core.summaries import applied_learning_rate, tensorboard_events
from tpulaunch.run.workers import is_chief_worker, worker_task
from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.schema import Job
from tpulaunch.plan.build import Plan
from tpulaunch.run import phases
from tpulaunch.run.events import EvalResult, RunRecorder, TrainSummary
from tpulaunch.run.lease import ensure_held, raise_if_lost
from tpulaunch.run.signals import StopSignal

if TYPE_CHECKING:
    from tpulaunch.run.watchdog import WatchPlan


def _refuse_estimator_checkpoints(model_dir: str, path: Optional[str] = None) -> None:
    """A TPUEstimator model_dir holds name-based checkpoints the keras engine's object-based restore cannot read
    (`path`: the checkpoint to read; default model_dir's newest complete one, a damaged newer one passed over)."""
    import tensorflow as tf

    from tpulaunch.engine.core.checkpoints import latest_complete_checkpoint

    if path is None:
        found = latest_complete_checkpoint(model_dir)
        if found is None:
            return
        path = found[0]
    names = {name for name, _ in tf.train.list_variables(path)}
    if "global_step" in names and plain.STEP_KEY not in names:
        raise TpuLaunchError(
            f"{model_dir} holds TPUEstimator checkpoints ({os.path.basename(path)}); the keras engine cannot resume them",
            hint="train into another run.model_dir (or --model-dir), or set run.engine: estimator on TensorFlow 2.15")


def make_training(job: Job, plan: Plan, *, use_tpu: Optional[bool] = None, cluster_resolver: Any = None,
                  search_path: Sequence[str] = (), model_dir: Optional[str] = None, cpu_replicas: Optional[int] = None):
    """The job's KerasTraining (strategy, model, optimizer, checkpoints) on `plan`'s target (`use_tpu=False`: on this
    machine, as export builds it), failures located at their job key."""
    from tpulaunch.engine.keras import standalone

    use_tpu = plan.on_tpu if use_tpu is None else use_tpu

    try:
        strategy = standalone.make_strategy(use_tpu=use_tpu, cluster_resolver=cluster_resolver,
                                            cpu_replicas=cpu_replicas,
                                            **plain.strategy_settings(job, plan, use_tpu=use_tpu))
    except RuntimeError as exc:  # TensorFlow's runtime started before the CPU could be split
        raise TpuLaunchError(f"cannot split the CPU into {cpu_replicas} devices: {exc}") from None
    if not use_tpu:  # this machine's replicas are known only now (a TPU's are the Plan's, its batches checked)
        replicas = strategy.num_replicas_in_sync
        for batch in plan.batches:
            plan.per_shard(batch.split, replicas, f"the {replicas} replicas of {type(strategy).__name__}")
    parts = plain.job_parts(job, use_tpu=use_tpu, search_path=search_path)  # imports the builder's Keras
    if job.run.seed is not None:
        standalone.set_random_seed(job.run.seed)
    settings = plain.training_settings(job, plan, use_tpu=use_tpu)
    if model_dir:
        settings["model_dir"] = model_dir
    with build_errors(job, "train"), spec_errors():
        try:
            return standalone.KerasTraining(parts.builder, parts.builder_kwargs, strategy=strategy,
                                            policy=parts.policy, make_optimizer=parts.make_optimizer,
                                            custom_loss=parts.whole_loss, custom_losses=parts.custom_losses,
                                            custom_metrics=parts.custom_metrics, write_through=staged_write,
                                            fence=lambda: ensure_held(settings["model_dir"]), **settings)
        except standalone.StepsForJax as exc:
            raise TpuLaunchError(f"model builder {job.model.builder!r}: {exc}", code="keras-engine-jax-steps",
                                 hint="train it on the jax engine (run.engine: jax), or write the steps as Keras does "
                                      "on TensorFlow (keras.io: customizing what happens in fit() with TensorFlow)") \
                from None


def _global_batch(plan: Plan, mode: str) -> int:
    """The Plan's global batch of `mode` (an evaluation without a batch of its own uses train's)."""
    return (plan.batch(mode) or plan.batch("train")).global_batch


def _dataset(job: Job, plan: Plan, training, mode: str, skip: int = 0):
    """The mode's batches over the strategy's replicas, after what `skip` steps trained on (a resumed run's step);
    the class ids of a sparse categorical crossentropy are checked there, on the host, for a model whose outputs are
    known before its first call (and in the step)."""
    from tpulaunch.engine.pipeline import label_classes, make_dataset_fn
    from tpulaunch.engine.keras import standalone

    classes = label_classes(job, getattr(training.model, "outputs", None), training.output_names,
                             training.model)
    return standalone.distributed_dataset(training.strategy,
                                          make_dataset_fn(job, mode, use_tpu=plan.on_tpu, label_classes=classes),
                                          _global_batch(plan, mode), training.preprocess, skip_steps=skip)


# ------------------------------------------------------------------------------------------ train

def train(job: Job, plan: Plan, *, recorder: Optional[RunRecorder] = None, stop: Optional[StopSignal] = None,
          cluster_resolver: Any = None, search_path: Sequence[str] = (), force: bool = False,
          watch: Optional["WatchPlan"] = None, profile: Optional[Tuple[int, int]] = None,
          cpu_replicas: Optional[int] = None) -> TrainSummary:
    """Train to `job.train.steps`, resuming from model_dir's latest complete checkpoint, evaluating as the job says:
    the loop every engine runs (`engine/core/loop.py`; its Raises apply), around `_KerasSession`."""
    loop.check_trainable(job)
    model_dir = job.run.model_dir
    recorder = recorder or RunRecorder(total_steps=job.train.steps, batch_size=plan.train_batch_size,
                                       log_every_steps=log_every_steps(job), model_dir=model_dir)
    with model_dir_errors(model_dir):
        _refuse_estimator_checkpoints(model_dir)

    # The other workers of a multi-worker run leave model_dir's shared files to the chief.
    with tensorboard_events(recorder, model_dir, is_chief_worker()) as events:
        def session_for(should_stop):
            session = _KerasSession(job, plan, recorder, should_stop, search_path=search_path, profile=profile,
                                    cpu_replicas=cpu_replicas)
            if events is not None:
                events.learning_rate = lambda: applied_learning_rate(getattr(session.training, "optimizer", None))
            return session

        summary = loop.train(job, session_for, recorder=recorder, stop=stop or StopSignal(), watch=watch,
                             use_tpu=plan.on_tpu, cluster_resolver=cluster_resolver, force=force,
                             writes_model_dir=is_chief_worker())
    _remove_worker_scratch(model_dir)
    return summary


def _remove_worker_scratch(model_dir: str) -> None:
    """A non-chief worker's checkpoints (saved only because saving is collective) are removed at the end."""
    import tensorflow as tf

    from tpulaunch.engine.keras.standalone import worker_scratch_dir

    task = worker_task()
    if task is not None and not is_chief_worker():
        scratch = worker_scratch_dir(model_dir, *task)
        if tf.io.gfile.exists(scratch):
            tf.io.gfile.rmtree(scratch)


class _KerasSession:
    """KerasTraining in the loop (`core/loop.TrainingSession`): built and restored at each start, one input
    iterator per start, the steps of `standalone.train_loop`."""

    def __init__(self, job: Job, plan: Plan, recorder: RunRecorder, should_stop, *, search_path: Sequence[str],
                 profile: Optional[Tuple[int, int]], cpu_replicas: Optional[int]):
        self.job, self.plan, self.recorder, self.should_stop = job, plan, recorder, should_stop
        self.use_tpu, self.search_path, self.profile, self.cpu_replicas = plan.on_tpu, search_path, profile, cpu_replicas
        self.training = self.iterator = None
        self.noted = False
        self.input_from = 0  # the steps whose batches the next input iterator skips
        self.nan_at: Optional[int] = None  # the step whose loss was NaN: a rollback's input goes on after it

    def start(self, cluster_resolver) -> int:
        import tensorflow as tf

        recorder = self.recorder
        recorder.phase_began(phases.BUILD)  # the loop's phase scope closes what is open when the segment ends
        self.training = make_training(self.job, self.plan, cluster_resolver=cluster_resolver,
                                      search_path=self.search_path, cpu_replicas=self.cpu_replicas)
        if not self.noted:  # once a run, not again at each restart after a lost TPU
            _note_compile(self.training, recorder)
            self.noted = True
        self.iterator = None
        restoring = tf.train.latest_checkpoint(self.job.run.model_dir) is not None
        recorder.phase_switch(phases.RESTORE if restoring else phases.INITIALISE)
        step = self.training.restore()
        # Resumed at `step`: the input goes on after the batches trained on so far (with run.seed, exactly where the
        # interrupted run was); after a NaN rollback, after the batch that made the loss NaN.
        self.input_from, self.nan_at = max(step, self.nan_at or 0), None
        return step

    def prepare_evaluation(self) -> None:
        self.recorder.phase_switch(phases.BUILD_EVALUATION)
        _prepare_evaluation(self.training, self.job, self.plan)

    def train_to(self, step: int) -> int:
        if self.iterator is None:
            with naming_read_errors(self.job, "train"):
                self.iterator = iter(_dataset(self.job, self.plan, self.training, "train", skip=self.input_from))
        try:
            return _train_to(self.job, self.training, self.iterator, step, self.recorder, self.should_stop,
                             self.use_tpu, self.profile)
        except loop.NonFiniteLoss as nan:
            self.nan_at = nan.step
            raise

    def evaluate(self) -> bool:
        from tpulaunch.engine.keras import standalone

        try:
            _evaluate_into(self.training, self.job, self.plan, self.recorder, should_stop=self.should_stop)
        except standalone.EvaluationInterrupted:
            return False
        return True


def _train_to(job: Job, training, iterator, until: int, recorder: RunRecorder, should_stop, use_tpu: bool,
              profile) -> int:
    """Train one segment, telling the recorder each call's steps, loss and input wait, and each checkpoint."""
    from tpulaunch.engine.keras import standalone

    steps_per_call = job.tpu.iterations_per_loop if use_tpu else 1
    first = [True]
    recorder.phase_switch(phases.FIRST_STEP, "XLA compiles the TPU program" if use_tpu else None)
    recorder.session_began(training.step)
    tracer = _Profiler(profile, job.run.model_dir, recorder) if profile else None

    def on_steps(step: int, loss: float, input_wait: Optional[float]) -> None:
        raise_if_lost(job.run.model_dir)  # the lease's renewal found model_dir taken over: no further step or save
        if not math.isfinite(loss):  # before this step's save: its weights are the NaN update's
            recorder.steps_run(step, loss, input_wait)
            raise loop.NonFiniteLoss(step, loss)
        if first[0]:
            recorder.phase_switch(phases.TRAINING)
            first[0] = False
        recorder.steps_run(step, loss, input_wait)
        if tracer is not None:
            tracer.at(step)

    def on_checkpoint(step: int, path: str) -> None:
        recorder.checkpoint_saved(step, path)

    try:
        with build_errors(job, "train"), spec_errors():  # the step's trace: the job's code is called here
            training.prepare_training(iterator, time_input=not use_tpu)
        with naming_read_errors(job, "train"):
            step = standalone.train_loop(training, iterator, until=until, steps_per_call=steps_per_call,
                                         on_steps=on_steps, should_stop=should_stop, on_checkpoint=on_checkpoint,
                                         time_input=not use_tpu,
                                         before_save=lambda step: ensure_held(job.run.model_dir))
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


def _note_compile(training, recorder: RunRecorder) -> None:
    """One line of what a compiled model (or one with its own step) trains with, and what the job replaced."""
    if training.compile_note:
        recorder.note(training.compile_note)


# --------------------------------------------------------------------------------------- evaluate

def _prepare_evaluation(training, job: Job, plan: Plan):
    """The evaluation's dataset (built, not read), its metrics made and its step traced: (dataset, per-replica batch)."""
    batch = _global_batch(plan, "eval") // training.strategy.num_replicas_in_sync
    with naming_read_errors(job, "eval"):
        dataset = _dataset(job, plan, training, "eval")
    with build_errors(job, "eval"), spec_errors():  # metrics made and the step traced: the job's code runs
        training.prepare_evaluation(dataset, batch)
    return dataset, batch


def _evaluate_into(training, job: Job, plan: Plan, recorder: RunRecorder, should_stop=None) -> EvalResult:
    with recorder.phase(phases.EVALUATION):
        dataset, batch = _prepare_evaluation(training, job, plan)
        with naming_read_errors(job, "eval"), spec_errors():
            results = training.evaluate(dataset, job.eval.steps, should_stop=should_stop, per_replica_batch=batch)
    return recorder.evaluated(int(results["global_step"]), results,
                              left_out=eval_left_out(job, whole_set_here=not plan.on_tpu))


def evaluate(job: Job, plan: Plan, *, checkpoint: Optional[str] = None, recorder: Optional[RunRecorder] = None,
             cluster_resolver: Any = None, search_path: Sequence[str] = (),
             cpu_replicas: Optional[int] = None) -> EvalResult:
    """Evaluate model_dir's newest complete checkpoint (or `checkpoint`) for `eval.steps` batches."""
    recorder = recorder or RunRecorder()
    checkpoint = loop.check_evaluable(job, checkpoint, recorder.note)
    with recorder.phase(phases.BUILD):
        _refuse_estimator_checkpoints(job.run.model_dir, checkpoint)
        training = make_training(job, plan, cluster_resolver=cluster_resolver,
                                 search_path=search_path, cpu_replicas=cpu_replicas)
        _note_compile(training, recorder)
    with recorder.phase(phases.RESTORE):
        training.restore(checkpoint)
    return _evaluate_into(training, job, plan, recorder)


# ----------------------------------------------------------------------------------------- export

def export(job: Job, plan: Plan, out_dir: str, *, checkpoint: Optional[str] = None,
           search_path: Sequence[str] = (), say: Callable[[str], None] = lambda line: None) -> str:
    """A SavedModel of the newest complete checkpoint (or `checkpoint`) under `out_dir/<timestamp>` (`say` told which
    one when a newer one was skipped); nothing left on failure."""
    import tensorflow as tf

    from tpulaunch.engine.keras import standalone

    checkpoint = checkpoint_to_read(job.run.model_dir, checkpoint, "export", say)
    _refuse_estimator_checkpoints(job.run.model_dir, checkpoint)
    training = make_training(job, plan, use_tpu=False, search_path=search_path)
    training.restore(checkpoint)
    existed = tf.io.gfile.exists(out_dir)
    try:
        return standalone.export_saved_model(training, out_dir, list(job.data.labels))
    except BaseException:
        if not existed and tf.io.gfile.exists(out_dir):
            tf.io.gfile.rmtree(out_dir)
        raise
