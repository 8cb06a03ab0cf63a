"""Train (with periodic evaluation: the engine's session in the loop every engine runs), evaluate and export
with the TPUEstimator `make.py` makes from a job.

The same functions run on a TPU slice (`use_tpu=True`, with a cluster resolver) and on this machine's
CPU or GPU (`use_tpu=False`): the model_fn and input_fn are the same, only the estimator's settings
differ. TensorFlow is imported inside the functions that need it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Tuple

from tpulaunch.engine.pipeline import eval_left_out, naming_read_errors
from tpulaunch.engine.core import loop
from tpulaunch.engine.core.model_dir import checkpoint_step, checkpoint_to_read
from tpulaunch.engine.estimator.make import input_fn_for, make_estimator
from tpulaunch.engine.estimator.plain import log_every_steps
from tpulaunch.engine.plain import spec_errors
from tpulaunch.errors import TpuLaunchError, first_line
from tpulaunch.job.schema import Job
from tpulaunch.plan.build import Plan
from tpulaunch.run import phases
from tpulaunch.run.events import EvalResult, RunRecorder, TrainSummary
from tpulaunch.run.lease import ensure_held
from tpulaunch.run.signals import StopSignal

if TYPE_CHECKING:
    from tpulaunch.run.watchdog import WatchPlan

# ------------------------------------------------------------------------------------------ train

def train(job: Job, plan: Plan, *, recorder: Optional[RunRecorder] = None, stop: Optional[StopSignal] = None,
          cluster_resolver: Any = None, search_path: Sequence[str] = (), force: bool = False,
          watch: Optional["WatchPlan"] = None, profile: Optional[Tuple[int, int]] = None,
          time_input: bool = True) -> TrainSummary:
    """Train to `job.train.steps`, resuming from model_dir's latest complete checkpoint, evaluating as the job says
    (the loop every engine runs: `engine/core/loop.py`; what is TPUEstimator's is `_EstimatorSession`).

    Args:
        job: the validated job (needs `train` and `data.train`).
        plan: the job's Plan for its target (`plan.on_tpu`: use_tpu), the gate's (`app/gate.py`).
        recorder: receives the run's events (its renderers show them); a silent one when None.
        stop: records SIGINT/SIGTERM while training runs (a new one when None).
        cluster_resolver: the TPU's cluster resolver (TPU runs only).
        search_path: directories for the job's import paths (the job file's directory).
        force: resume even when model_dir was written by a job with another model or data spec.
        watch: watch the TPU node while training (`watchdog.WatchPlan`): stop cleanly when it is
            lost and, `watch.auto_resume` times at most, wait for it and resume. A TPU run gets a
            fresh cluster resolver for each resume. None: no watching.
        profile: (first, last) global steps to capture a TensorBoard profile of, into model_dir.
        time_input: measure how long each step waits for its input (CPU/GPU; `input_wait`).

    Returns:
        The summary (also the recorder's last event), with the TPU events and resumes.

    Raises:
        TrainingStopped: a signal arrived; a checkpoint was saved at the step where training stopped
            (or, while waiting for the TPU, the last complete checkpoint is kept).
        EvaluationStopped: a signal arrived during an evaluation (or just before the final one): the
            evaluation is abandoned, not reported; training's checkpoint is saved.
        watchdog.NodeLost: the TPU was lost and no automatic resume was left (exit code 3).
        TpuLaunchError: the job cannot train (no train section or data, a model_dir of another job),
            or the TPU did not come back in time.
    """
    loop.check_trainable(job)
    if recorder is None:
        recorder = RunRecorder(total_steps=job.train.steps, batch_size=plan.train_batch_size,
                               log_every_steps=log_every_steps(job), model_dir=job.run.model_dir)

    def session_for(should_stop):
        return _EstimatorSession(job, plan, recorder, should_stop, search_path=search_path, profile=profile,
                                 time_input=time_input)

    return loop.train(job, session_for, recorder=recorder, stop=stop or StopSignal(), watch=watch,
                      use_tpu=plan.on_tpu, cluster_resolver=cluster_resolver, force=force)


class _EstimatorSession:
    """TPUEstimator in the loop (`core/loop.TrainingSession`): a new estimator at each start; each `train` call
    restores from model_dir, and its hooks report phases, progress and checkpoints and stop it when told."""

    def __init__(self, job: Job, plan: Plan, recorder: RunRecorder, should_stop, *, search_path: Sequence[str],
                 profile: Optional[Tuple[int, int]], time_input: bool):
        self.job, self.plan, self.recorder, self.should_stop = job, plan, recorder, should_stop
        self.use_tpu, self.search_path, self.profile, self.time_input = plan.on_tpu, search_path, profile, time_input
        self.estimator = self.cluster_resolver = self.train_input = None
        self.hooks: list = []
        self.listener = None
        self.nan_at: Optional[int] = None  # the step whose loss was NaN, until the loop rolls back from it
        self.rolled_back = 0  # the steps trained and rolled back from: their batches are not read again

    def start(self, cluster_resolver) -> int:
        job, model_dir = self.job, self.job.run.model_dir
        step = checkpoint_step(model_dir) or 0
        if self.nan_at is not None:  # a rollback (train.on_nan): the input goes on after the batches that made it
            self.rolled_back += max(0, self.nan_at - step)
            self.nan_at = None
        if self.train_input is None:  # the input and the hooks are made once; the estimator at every start
            self._make_hooks(step, cluster_resolver)
        self.cluster_resolver = cluster_resolver
        self.estimator = make_estimator(job, self.plan, cluster_resolver=cluster_resolver,
                                        search_path=self.search_path)
        return step

    def _make_hooks(self, start: int, cluster_resolver) -> None:
        from tpulaunch.engine.estimator import hooks as tf_hooks
        from tpulaunch.engine.estimator.stopped_run import graph_checks_hook

        job, recorder, use_tpu, model_dir = self.job, self.recorder, self.use_tpu, self.job.run.model_dir
        self.train_input = input_fn_for(job, "train", use_tpu, self.search_path, rolled_back=lambda: self.rolled_back)
        if self.time_input and not use_tpu:
            from tpulaunch.engine.estimator.input_wait import timed_input_fn

            self.train_input = timed_input_fn(self.train_input)
        steps_per_run = job.tpu.iterations_per_loop if use_tpu else 1
        hook, self.listener = tf_hooks.progress_hooks(recorder, steps_per_run=steps_per_run, model_dir=model_dir,
                                                      on_tpu=use_tpu)
        self.hooks = [graph_checks_hook(job), hook, tf_hooks.RequestStopHook(self.should_stop),
                      tf_hooks.LeaseLostHook(model_dir), tf_hooks.skipped_records_hook(recorder)]
        if self.profile is not None:
            self.hooks += tf_hooks.profile_hooks(self.profile, recorder, start_step=start, total_steps=job.train.steps,
                                                 model_dir=model_dir, steps_per_run=steps_per_run,
                                                 cluster_resolver=cluster_resolver if use_tpu else None)

    def prepare_evaluation(self) -> None:
        from tpulaunch.engine.estimator.stopped_run import build_stopped

        with self.recorder.phase(phases.BUILD_EVALUATION):
            build_stopped(self.job, "eval", self.plan)

    def train_to(self, step: int) -> int:
        job = self.job
        # spec_errors: the model_fn's scaffold checks the builder's weights when the session starts.
        import tensorflow as tf

        with naming_read_errors(job, "train"), spec_errors(), self.recorder.phase_scope():
            self.recorder.phase_began(phases.BUILD)  # the hooks take it from there (restore, first step, training)
            try:
                self.estimator.train(self.train_input, max_steps=step, hooks=self.hooks,
                                     saving_listeners=[self.listener])
            except tf.compat.v1.train.NanLossDuringTrainingError:  # the Estimator's NanTensorHook, after the step
                self.nan_at = self.recorder.step
                raise loop.NonFiniteLoss(self.recorder.step) from None
            except loop.NonFiniteLoss as nan:  # the progress hook's, at a logged step
                self.nan_at = nan.step
                raise
        return checkpoint_step(job.run.model_dir) or 0

    def evaluate(self) -> bool:
        from tpulaunch.engine.estimator.hooks import EvaluationInterrupted, InterruptEvaluationHook

        try:
            _evaluate_into(self.estimator, self.job, self.use_tpu, self.search_path, self.recorder,
                           hooks=[InterruptEvaluationHook(self.should_stop)])
        except EvaluationInterrupted:
            return False
        return True


def _evaluate_into(estimator, job: Job, use_tpu: bool, search_path: Sequence[str], recorder: RunRecorder,
                   checkpoint: Optional[str] = None, hooks: Sequence = ()) -> EvalResult:
    from tpulaunch.engine.estimator.hooks import skipped_records_counter

    hook, skipped = skipped_records_counter()
    batches = _batch_counter()
    with naming_read_errors(job, "eval"), recorder.phase(phases.EVALUATION):
        results = estimator.evaluate(input_fn_for(job, "eval", use_tpu, search_path), steps=job.eval.steps,
                                     checkpoint_path=checkpoint, hooks=[hook, batches, *hooks])
    if not batches.count:  # the estimator reports 0 for every metric over no batch
        from tpulaunch.engine.portable import no_evaluation_batches

        with spec_errors():
            raise no_evaluation_batches()
    return recorder.evaluated(int(results.get("global_step", 0)), results, skipped(),
                              eval_left_out(job, whole_set_here=not use_tpu))


def _batch_counter():
    """A hook counting the evaluation steps that ran (its `count`)."""
    import tensorflow as tf

    class BatchCounter(tf.compat.v1.train.SessionRunHook):
        count = 0

        def after_run(self, run_context, run_values):
            self.count += 1

    return BatchCounter()


def evaluate(job: Job, plan: Plan, *, checkpoint: Optional[str] = None,
             recorder: Optional[RunRecorder] = None, cluster_resolver: Any = None,
             search_path: Sequence[str] = ()) -> EvalResult:
    """Evaluate the newest complete checkpoint in model_dir (or `checkpoint`) for `eval.steps` batches.

    The result is also handed to `recorder` (its renderers show it), when given. `plan`: as for `train`.

    Raises:
        TpuLaunchError: no eval section or data, or no checkpoint to evaluate.
    """
    recorder = recorder or RunRecorder()
    checkpoint = loop.check_evaluable(job, checkpoint, recorder.note)
    estimator = make_estimator(job, plan, cluster_resolver=cluster_resolver, search_path=search_path)
    ensure_held(job.run.model_dir)  # it writes its summaries into model_dir/eval
    return _evaluate_into(estimator, job, plan.on_tpu, search_path, recorder, checkpoint)


# ----------------------------------------------------------------------------------------- export

def serving_input_receiver_fn(job: Job, search_path: Sequence[str] = ()):
    """The job's own `model.serving_input_fn`, its failures located there; else placeholders of the declared
    feature shapes (batch dim open), in the input_fn's structure."""
    if job.model.serving_input_fn:
        from tpulaunch.engine.estimator.locate import located
        from tpulaunch.job.imports import resolve

        own = resolve(job.model.serving_input_fn, search_path=search_path, what="serving_input_fn")
        return located(own, job, "infer", ("model", "serving_input_fn"))
    import tensorflow as tf

    from tpulaunch.engine.plain import features_as_dict

    def receiver_fn():
        placeholders = {}
        for name, spec in job.data.features.items():
            dtype = "float32" if spec.dtype == "bfloat16" else spec.dtype
            placeholders[name] = tf.compat.v1.placeholder(dtype, [None, *spec.shape], name=name)
        if len(placeholders) == 1 and not features_as_dict(job):
            (tensor,) = placeholders.values()
            return tf.estimator.export.TensorServingInputReceiver(tensor, placeholders)
        return tf.estimator.export.ServingInputReceiver(placeholders, placeholders)

    return receiver_fn


def export(job: Job, plan: Plan, out_dir: str, *, checkpoint: Optional[str] = None,
           search_path: Sequence[str] = (), say: Callable[[str], None] = lambda line: None) -> str:
    """Write a SavedModel (CPU/GPU serving graph) of the newest complete checkpoint (or `checkpoint`) under
    `out_dir`; `say` is told which one when a newer one was skipped.

    The serving signature takes `data.features` as declared. A failed export leaves `out_dir` as it
    was: TensorFlow's half-written `temp-*` directory is removed (and `out_dir` too when this export
    created it).

    Returns:
        The SavedModel's directory (a timestamped subdirectory of `out_dir`).

    Raises:
        TpuLaunchError: no checkpoint to export, or the model cannot be built on the declared features.
    """
    import tensorflow as tf

    from tpulaunch.engine.core.build_failures import BuildError

    checkpoint = checkpoint_to_read(job.run.model_dir, checkpoint, "export", say)
    from tpulaunch.engine.estimator.make import plan_on_this_machine

    # The serving graph is a CPU/GPU one whatever the command's target.
    estimator = make_estimator(job, plan_on_this_machine(job, plan), search_path=search_path)
    existed = tf.io.gfile.exists(out_dir)
    before = set(tf.io.gfile.listdir(out_dir)) if existed else set()
    try:
        path = estimator.export_saved_model(out_dir, serving_input_receiver_fn(job, search_path),
                                            checkpoint_path=checkpoint)
    except BaseException as exc:
        _remove_failed_export(out_dir, before, existed)
        if isinstance(exc, BuildError) and exc.key == ("model", "serving_input_fn"):
            raise  # the job's own serving inputs failed: said at their key
        if not isinstance(exc, (TypeError, ValueError, BuildError)):
            raise
        # Building the serving graph on the declared features failed.
        detail = exc.detail if isinstance(exc, BuildError) else f"{type(exc).__name__}: {first_line(exc)}"
        raise TpuLaunchError(
            f"export failed building the serving graph from data.features: {detail}",
            hint="data.features must describe what the model receives (what the input_fn yields, for an input_fn "
                 "job): `tpulaunch validate` compares them; or name the program's own serving_input_receiver_fn "
                 "in model.serving_input_fn") from exc
    return path.decode() if isinstance(path, bytes) else str(path)


def _remove_failed_export(out_dir: str, before: set, existed: bool) -> None:
    """Remove the `temp-*` directory a failed export left under `out_dir` (TensorFlow writes there and renames
    it at the end), and `out_dir` itself when this export created it and it is now empty."""
    import tensorflow as tf

    if not tf.io.gfile.exists(out_dir):
        return
    for name in set(tf.io.gfile.listdir(out_dir)) - before:
        if name.startswith("temp-"):
            tf.io.gfile.rmtree(os.path.join(out_dir, name.rstrip("/")))
    if not existed and not tf.io.gfile.listdir(out_dir):
        tf.io.gfile.rmtree(out_dir)
