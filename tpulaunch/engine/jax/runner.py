"""The jax engine's train (with periodic evaluation) and evaluate, around `training.JaxTraining`: the loop every
engine runs (`engine/core/loop.py`: resume, evaluation boundaries, signals, the lease's fence, NaN rollbacks), told
to a `RunRecorder` with the same events as the other engines, so progress, phases and the run record are theirs."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from tpulaunch.engine.core import loop
from tpulaunch.engine.jax.locate import build_errors
from tpulaunch.engine.core.model_dir import checkpoint_step, checkpoint_to_read
from tpulaunch.engine.jax.hosts import refuse_split_over_hosts
from tpulaunch.engine.pipeline import (eval_left_out, label_classes, make_dataset_fn, naming_read_errors,
                                       scores_class_ids)
from tpulaunch.engine.plain import log_every_steps, spec_errors
from tpulaunch.job.schema import Job
from tpulaunch.plan.build import Plan
from tpulaunch.run import phases
from tpulaunch.run.events import EvalResult, RunRecorder, TrainSummary
from tpulaunch.run.lease import ensure_held, raise_if_lost
from tpulaunch.run.signals import StopSignal
from tpulaunch.engine.core.summaries import applied_learning_rate, tensorboard_events
from tpulaunch.run.workers import is_chief_worker

if TYPE_CHECKING:
    from tpulaunch.run.watchdog import WatchPlan


def make_training(job: Job, plan: Optional[Plan], *, search_path: Sequence[str] = ()):
    """The job's JaxTraining over the devices as the Plan's mesh lays them out, failures located at their job key."""
    from tpulaunch.engine.jax.training import JaxTraining, load_keras
    from tpulaunch.engine.job_code import job_builder, job_functions

    from tpulaunch.job.flags import apply_flags

    load_keras()
    apply_flags(job, search_path=search_path)  # before the job's code runs: it may read FLAGS as it builds
    builder, kwargs = job_builder(job, search_path=search_path)
    with build_errors(job, "train"), spec_errors():
        whole_loss, _losses, _metrics = job_functions(job, search_path=search_path)
        training = JaxTraining(job, builder, kwargs, custom_loss=whole_loss, plan=plan)
    refuse_split_over_hosts(training.layout)
    return training


def trace_steps(training, job: Job) -> list:
    """The job's steps traced on abstract values (nothing is computed): the training step at the train batch and,
    when the job has `eval:`, the evaluation step (`test_step`: the loss and metrics in inference, the model's own
    where it has one) at the eval batch. What `train`'s first step or its first evaluation would fail at (a label
    the loss cannot take, inputs the model does not have, an eval path of its own that breaks), located as `train`
    locates it: one `ModeBuild` per mode. `validate` runs it, so it says OK only for a job whose steps run."""
    import jax

    from tpulaunch.engine.core.build_failures import BuildError, ModeBuild
    from tpulaunch.engine.jax.memory_plan import abstract_state, data_specs

    model = training.model
    trainable, non_trainable, optimizer, metrics = abstract_state(model)
    states = {"train": (trainable, non_trainable, optimizer, metrics), "eval": (trainable, non_trainable, metrics)}
    steps = {"train": model.train_step, "eval": model.test_step}
    builds = []
    for mode in ("train", "eval") if job.eval is not None else ("train",):
        section = getattr(job, mode)
        features, labels = data_specs(job, model, section.batch_size if section is not None else 1)
        labels = training.keras_labels(labels)  # several: as train hands them to the model's compile()
        try:
            with build_errors(job, mode), spec_errors():
                jax.eval_shape(lambda f, y, state: steps[mode](state, (f, y)), features, labels, states[mode])
            builds.append(ModeBuild(mode, True))
        except BuildError as failure:
            builds.append(ModeBuild(mode, False, failure.key, failure.detail, failure.hint, failure.code))
    return builds


def _batches(job: Job, plan: Plan, mode: str, training, skip: int = 0):
    """The mode's batches as NumPy: the records read by the same tf.data pipeline as the other engines', after the
    first `skip` (a resumed run's step: what it already trained on). Over several hosts each process reads its own
    share of the records and makes its share of the global batch (`hosts.py`); DataParallel puts the shares
    together. The class ids of a sparse categorical crossentropy's labels are checked there (JAX would take any id
    silently)."""
    from tpulaunch.engine.jax.hosts import share

    index, count = share()
    with naming_read_errors(job, mode):
        dataset_fn = make_dataset_fn(job, mode, use_tpu=False, label_classes=_label_classes(job, training.model))
        dataset = dataset_fn(plan.per_shard(mode, count, f"{count} hosts"), shard_index=index, shard_count=count,
                             skip_batches=skip)
    return dataset.as_numpy_iterator()


def _label_classes(job: Job, model) -> dict:
    """The class ids the pipeline checks (`pipeline.label_classes`): from the model's symbolic outputs, or its
    output traced on abstract features (a subclassed model)."""
    if not scores_class_ids(job, model):
        return {}
    outputs = getattr(model, "outputs", None)
    if not outputs:
        import jax

        from tpulaunch.engine.jax.memory_plan import data_specs

        outputs = jax.eval_shape(lambda features: model(features), data_specs(job, model, 1)[0])
    return label_classes(job, outputs, getattr(model, "output_names", ()), model)


# ------------------------------------------------------------------------------------------ train

def train(job: Job, plan: Plan, *, recorder: Optional[RunRecorder] = None, stop: Optional[StopSignal] = None,
          search_path: Sequence[str] = (), force: bool = False, watch: Optional["WatchPlan"] = None) -> TrainSummary:
    """Train to `job.train.steps`, resuming from model_dir's latest complete checkpoint, evaluating as the job says;
    `watch`: the TPU node's watch (a lost node stops the run, and `--auto-resume` resumes it, as on every engine)."""
    loop.check_trainable(job)
    recorder = recorder or RunRecorder(total_steps=job.train.steps, batch_size=plan.train_batch_size,
                                       log_every_steps=log_every_steps(job), model_dir=job.run.model_dir)

    with tensorboard_events(recorder, job.run.model_dir, is_chief_worker()) as events:
        def session_for(should_stop):
            session = _JaxSession(job, plan, recorder, should_stop, search_path=search_path)
            if events is not None:
                events.learning_rate = lambda: applied_learning_rate(getattr(session.training, "model", None) and
                                                                      session.training.model.optimizer)
            return session

        return loop.train(job, session_for, recorder=recorder, stop=stop or StopSignal(), watch=watch, use_tpu=False,
                          force=force, writes_model_dir=is_chief_worker())


class _JaxSession:
    """JaxTraining in the loop (`core/loop.TrainingSession`)."""

    def __init__(self, job: Job, plan: Plan, recorder: RunRecorder, should_stop, *, search_path: Sequence[str]):
        self.job, self.plan, self.recorder = job, plan, recorder
        self.should_stop, self.search_path = should_stop, search_path
        self.training = self.batches = None
        self.noted = False

    def start(self, cluster_resolver) -> int:
        self.recorder.phase_began(phases.BUILD)
        self.training = make_training(self.job, self.plan, search_path=self.search_path)
        if not self.noted:
            from tpulaunch.engine.jax.hosts import share

            index, count = share()
            self.recorder.note(self.training.layout.describe()
                               + (f" on {count} hosts (this is host {index})" if count > 1 else ""))
            if self.training.compile_note:  # a model its builder compile()d: what the job replaced of it
                self.recorder.note(self.training.compile_note)
            self.noted = True
        restoring = checkpoint_step(self.job.run.model_dir) is not None
        self.recorder.phase_switch(phases.RESTORE if restoring else phases.INITIALISE)
        return self.training.restore()

    def prepare_evaluation(self) -> None:
        self.recorder.phase_switch(phases.BUILD_EVALUATION)
        _batches(self.job, self.plan, "eval", self.training)  # the eval files are listed and the pipeline built: a run that cannot evaluate stops here

    def train_to(self, until: int) -> int:
        job, training, recorder = self.job, self.training, self.recorder
        if self.batches is None:
            self.batches = _batches(job, self.plan, "train", training, skip=training.step)
        every = job.run.save_checkpoints_steps
        recorder.phase_switch(phases.FIRST_STEP, "XLA compiles the step")
        recorder.session_began(training.step)
        first = True
        try:
            with naming_read_errors(job, "train"):
                while training.step < until and not self.should_stop():
                    began = time.perf_counter()
                    features, labels = next(self.batches)
                    waited = time.perf_counter() - began
                    with build_errors(job, "train"), spec_errors():  # the first call traces the job's code
                        loss = training.train_step(features, labels)
                    raise_if_lost(job.run.model_dir)  # model_dir taken over: no further step or save
                    if not math.isfinite(loss):  # before this step's save: its weights are the NaN update's
                        recorder.steps_run(training.step, loss, waited)
                        raise loop.NonFiniteLoss(training.step, loss)
                    if first:
                        recorder.phase_switch(phases.TRAINING)
                        first = False
                    recorder.steps_run(training.step, loss, waited)
                    if training.step % every == 0 and training.step < until:
                        self._save()
            self._save()
        finally:
            opened = [name for name in recorder.phases.open_phases() if name in (phases.FIRST_STEP, phases.TRAINING)]
            if opened:
                recorder.phase_ended(opened[0])
            recorder.session_ended()
        return training.step

    def _save(self) -> None:
        if not is_chief_worker():  # over several hosts the chief alone writes model_dir (the same weights)
            return
        ensure_held(self.job.run.model_dir)
        self.recorder.checkpoint_saved(self.training.step, self.training.save())

    def evaluate(self) -> bool:
        return _evaluate_into(self.training, self.job, self.plan, self.recorder, self.should_stop) is not None


# --------------------------------------------------------------------------------------- evaluate

def _evaluate_into(training, job: Job, plan: Plan, recorder: RunRecorder, should_stop=None) -> Optional[EvalResult]:
    with recorder.phase(phases.EVALUATION):
        batches = _batches(job, plan, "eval", training)
        # Keras reads the batches inside evaluate(), where build_errors would blame the model for a bad record or
        # an out-of-range class id: the input's error is kept and raised after it, where naming_read_errors says it.
        read_failed = []

        def read():
            try:
                yield from batches
            except Exception as exc:  # noqa: BLE001 (raised again below)
                read_failed.append(exc)

        with naming_read_errors(job, "eval"):
            try:
                with build_errors(job, "eval"), spec_errors():
                    results = training.evaluate(read(), job.eval.steps, should_stop=should_stop)
            except Exception:
                if not read_failed:
                    raise
            if read_failed:
                raise read_failed[0]
    if results is None:
        return None
    from tpulaunch.engine.jax.hosts import share

    left_out = eval_left_out(job, whole_set_here=share()[1] == 1)  # one process reads the whole set (no repeat)
    return recorder.evaluated(training.step, {**results, "global_step": training.step}, left_out=left_out)


def evaluate(job: Job, plan: Plan, *, checkpoint: Optional[str] = None, recorder: Optional[RunRecorder] = None,
             search_path: Sequence[str] = ()) -> EvalResult:
    """Evaluate model_dir's newest complete checkpoint (or `checkpoint`) for `eval.steps` batches."""
    recorder = recorder or RunRecorder()
    checkpoint = loop.check_evaluable(job, checkpoint, recorder.note)
    with recorder.phase(phases.BUILD):
        training = make_training(job, plan, search_path=search_path)
    with recorder.phase(phases.RESTORE):
        training.restore(checkpoint)
    return _evaluate_into(training, job, plan, recorder)


# ----------------------------------------------------------------------------------------- export

def export(job: Job, plan: Plan, out_dir: str, *, checkpoint: Optional[str] = None,
           search_path: Sequence[str] = (), say: Callable[[str], None] = lambda line: None) -> str:
    """A SavedModel of model_dir's newest complete checkpoint (or `checkpoint`) under `out_dir/<timestamp>` (`say`
    told which one when a newer one was skipped); nothing left on failure."""
    import tensorflow as tf

    checkpoint = checkpoint_to_read(job.run.model_dir, checkpoint, "export", say)
    training = make_training(job, plan, search_path=search_path)
    training.restore(checkpoint)
    existed = tf.io.gfile.exists(out_dir)
    try:
        return training.export(out_dir, list(job.data.labels))
    except BaseException:
        if not existed and tf.io.gfile.exists(out_dir):
            tf.io.gfile.rmtree(out_dir)
        raise
