"""RunConfig, TPUConfig and TPUEstimator from a job; train (with periodic evaluation), evaluate, export.

The same functions run on a TPU slice (`use_tpu=True`, with a cluster resolver) and on this machine's
CPU or GPU (`use_tpu=False`): the model_fn and input_fn are the same, only the estimator's settings
differ. TensorFlow is imported inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import re

import os
from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple

from tpulaunch.data.pipeline import naming_read_errors
from tpulaunch.engine.estimator.plain import (  # noqa: F401  (partition_dims, log_every_steps: for callers)
    config_settings, estimator_settings, log_every_steps, partition_dims, spec_errors)
from tpulaunch.errors import TpuLaunchError, first_line
from tpulaunch.job.schema import Job
from tpulaunch.plan.build import Plan, build_plan
from tpulaunch.run import phases
from tpulaunch.run.events import EvalResult, RunRecorder, TrainSummary
from tpulaunch.run.signals import EvaluationStopped, StopSignal, TrainingStopped

if TYPE_CHECKING:
    from tpulaunch.run.watchdog import WatchPlan

JOB_COPY = "tpulaunch-job.yaml"
STEP_KEYS = ("global_step", "global_step/.ATTRIBUTES/VARIABLE_VALUE")
"""The resolved job, written into model_dir by `train` (secrets masked)."""


# Sections of the job that define what a checkpoint contains: resuming with other values would
# restore variables into a different model or feed it different tensors.
_IDENTITY = (("model",), ("data", "features"), ("data", "labels"))


# ------------------------------------------------------------------------------------------ configs

def run_config(job: Job, *, use_tpu: bool, cluster_resolver: Any = None, model_dir: Optional[str] = None,
               plan: Optional[Plan] = None):
    """The `tf.compat.v1.estimator.tpu.RunConfig` for `job`.

    Args:
        job: the validated job.
        use_tpu: configure the TPU parts (cores per replica, input partitioning, PER_HOST_V2).
        cluster_resolver: a TPUClusterResolver for the TPU (None: nothing is contacted here).
        model_dir: overrides `job.run.model_dir`.
        plan: the job's plan for this target (built from the job when None).
    """
    from tpulaunch.engine.estimator import standalone

    settings = config_settings(job, plan or build_plan(job, local=not use_tpu), use_tpu=use_tpu)
    settings["model_dir"] = model_dir or settings["model_dir"]
    return standalone.run_config(use_tpu=use_tpu, cluster_resolver=cluster_resolver, **settings)


def make_estimator(job: Job, *, use_tpu: bool, cluster_resolver: Any = None, search_path: Sequence[str] = (),
                   model_dir: Optional[str] = None, export_to_tpu: bool = False):
    """A TPUEstimator for `job` with the portable model_fn (or the job's own `model.model_fn` and its params)."""
    from tpulaunch.engine.estimator import standalone
    from tpulaunch.engine.estimator.model_fn import make_model_fn

    plan = build_plan(job, local=not use_tpu)
    return standalone.tpu_estimator(
        make_model_fn(job, use_tpu=use_tpu, search_path=search_path),
        run_config(job, use_tpu=use_tpu, cluster_resolver=cluster_resolver, model_dir=model_dir, plan=plan),
        use_tpu=use_tpu, export_to_tpu=export_to_tpu, **estimator_settings(job, plan))


def input_fn_for(job: Job, mode: str, use_tpu: bool, search_path: Sequence[str], *, unread_files: bool = False):
    """The input_fn `train`/`evaluate` hand the estimator for `mode`: the job's own (`data.input_fn`), whose
    failures while building its dataset are reported at data.input_fn, or tpulaunch's pipeline.

    `unread_files`: the pipeline is built over the data patterns as written, not the files they match (for a
    build that reads nothing: see stopped_run.py).
    """
    if job.data.input_fn:
        # Resolved here rather than in data.py: the job file's directory must be on the search path.
        from tpulaunch.engine.estimator.build import located
        from tpulaunch.engine.estimator.flags import apply_flags
        from tpulaunch.job.imports import resolve_input_fn

        if job.data.input_fn_for(mode) is None:
            raise TpuLaunchError(f"data.input_fn names no {mode} function",
                                 hint=f"add data.input_fn.{mode}: pkg.mod:{mode}_input_fn")
        apply_flags(job, search_path=search_path)  # a factory may read FLAGS as it builds the input_fn
        return located(resolve_input_fn(job.data, mode, search_path=search_path), job, mode, ("data", "input_fn"))
    from tpulaunch.data.pipeline import make_input_fn

    return make_input_fn(job, mode, use_tpu=use_tpu, unread_files=unread_files)


# --------------------------------------------------------------------------------------- checkpoints

def checkpoint_step(model_dir: str) -> Optional[int]:
    """The global step of the latest checkpoint in `model_dir`, or None when there is none."""
    import tensorflow as tf

    path = tf.train.latest_checkpoint(model_dir)
    if not path:
        return None
    reader = tf.train.load_checkpoint(path)
    # TPUEstimator's name-based checkpoints, or the keras engine's object-based ones (tf.train.Checkpoint).
    for key in STEP_KEYS:
        if reader.has_tensor(key):
            return int(reader.get_tensor(key))
    return None


# Where a job holds mappings of the user's own keys: the only places a secret-looking name can be
# (everywhere else the schema fixes the key names, and `key` there is a TFRecord feature key).
_FREE_FORM = (("model", "params"), ("model", "optimizer", "args"), ("flags",))


def job_document(job: Job) -> dict:
    """The resolved job as plain data, with values under secret-looking keys in free-form mappings masked."""
    from tpulaunch.job.yamlfile import mask_secrets

    document = job.model_dump(mode="json", exclude_none=True)
    for keys in _FREE_FORM:
        parent = _get(document, keys[:-1])
        if isinstance(parent, dict) and keys[-1] in parent:
            parent[keys[-1]] = mask_secrets(parent[keys[-1]])
    return document


def write_job_copy(job: Job, model_dir: str, *, force: bool = False) -> str:
    """Write the resolved job into model_dir, after checking it matches the one already there.

    Raises:
        TpuLaunchError: model_dir holds checkpoints of a job with another model or data spec
            (unless `force`).
    """
    import tensorflow as tf
    import yaml

    path = os.path.join(model_dir, JOB_COPY)
    document = job_document(job)
    if not force and tf.io.gfile.exists(path) and checkpoint_step(model_dir) is not None:
        with tf.io.gfile.GFile(path) as handle:
            previous = yaml.safe_load(handle.read()) or {}
        changed = [".".join(keys) for keys in _IDENTITY if _get(previous, keys) != _get(document, keys)]
        if changed:
            raise TpuLaunchError(
                f"{model_dir} holds checkpoints of a job with a different {', '.join(changed)}",
                hint=f"compare with {path}; use another run.model_dir (or --model-dir), or pass --force to "
                     "resume anyway")
    tf.io.gfile.makedirs(model_dir)
    with tf.io.gfile.GFile(path, "w") as handle:
        handle.write(yaml.safe_dump(document, sort_keys=False))
    return path


def _get(document: Any, keys: tuple):
    for key in keys:
        if not isinstance(document, dict):
            return None
        document = document.get(key)
    return document


# ------------------------------------------------------------------------------------------ train

def train(job: Job, *, local: bool, recorder: Optional[RunRecorder] = None, stop: Optional[StopSignal] = None,
          cluster_resolver: Any = None, search_path: Sequence[str] = (), force: bool = False,
          watch: Optional["WatchPlan"] = None, profile: Optional[Tuple[int, int]] = None,
          time_input: bool = True) -> TrainSummary:
    """Train to `job.train.steps`, resuming from model_dir's latest complete checkpoint, evaluating as the job says.

    Without `eval.every_steps` and with eval data, one evaluation runs at the end. Before every
    (re)start the checkpoint state is repaired: a checkpoint a preemption cut in half is skipped and
    training resumes from the one before it.

    Args:
        job: the validated job (needs `train` and `data.train`).
        local: run on this machine (use_tpu=False) even when the job has a `tpu:` section.
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
    if job.train is None or (job.data.train is None and not job.data.input_fn):
        raise TpuLaunchError("the job has nothing to train on", hint="add a train: section and data.train")
    use_tpu = job.on_tpu and not local
    model_dir = job.run.model_dir
    if recorder is None:
        recorder = RunRecorder(total_steps=job.train.steps, batch_size=job.train.batch_size,
                               log_every_steps=log_every_steps(job), model_dir=model_dir)
    stop = stop or StopSignal()

    with model_dir_errors(model_dir):
        _repair_checkpoints(model_dir, recorder)
        write_job_copy(job, model_dir, force=force)
    start = checkpoint_step(model_dir) or 0
    if start >= job.train.steps:
        recorder.at_step(start)
        recorder.note(f"already at step {start} of {job.train.steps} in {model_dir}; nothing to train")
    elif start:
        recorder.note(f"resumed from step {start} ({model_dir})")
    if _evaluates(job):  # a run that cannot build its evaluation would find out only after training
        from tpulaunch.engine.estimator.stopped_run import build_stopped

        with recorder.phase(phases.BUILD_EVALUATION):
            build_stopped(job, "eval")
    train_input = input_fn_for(job, "train", use_tpu, search_path)
    if time_input and not use_tpu:
        from tpulaunch.engine.estimator.input_wait import timed_input_fn

        train_input = timed_input_fn(train_input)

    from tpulaunch.engine.estimator import hooks as tf_hooks
    from tpulaunch.engine.estimator.stopped_run import graph_checks_hook

    steps_per_run = job.tpu.iterations_per_loop if use_tpu else 1
    hook, listener = tf_hooks.progress_hooks(recorder, steps_per_run=steps_per_run, model_dir=model_dir,
                                             on_tpu=use_tpu)
    hooks = [graph_checks_hook(job), hook, tf_hooks.RequestStopHook(lambda: stop.received is not None),
             tf_hooks.skipped_records_hook(recorder)]
    if profile is not None:
        hooks += tf_hooks.profile_hooks(profile, recorder, start_step=start, total_steps=job.train.steps,
                                        model_dir=model_dir, steps_per_run=steps_per_run,
                                        cluster_resolver=cluster_resolver if use_tpu else None)
    dog = None
    if watch is not None:
        from tpulaunch.run.watchdog import Watchdog

        dog = Watchdog(watch, is_lost_error=tf_hooks.is_lost_tpu_error, on_status=recorder.node_seen)
        hooks.append(tf_hooks.RequestStopHook(lambda: dog.tripped is not None))
    with stop:
        while True:
            estimator = make_estimator(job, use_tpu=use_tpu, cluster_resolver=cluster_resolver, search_path=search_path)
            with model_dir_errors(model_dir):
                event = _train_segments(estimator, job, train_input, hooks, listener, recorder, stop, dog,
                                        use_tpu, search_path)
            if event is None:
                return recorder.finish()
            cluster_resolver = _recover(event, job, watch, recorder, stop, use_tpu)
            dog.reset()


@contextlib.contextmanager
def model_dir_errors(model_dir: str):
    """A model_dir that cannot be written (full disk, permissions, not a directory, removed mid-run)
    becomes one clear message naming it; the last complete checkpoint stays where it is."""
    import tensorflow as tf

    try:
        yield
    except (tf.errors.FailedPreconditionError, tf.errors.ResourceExhaustedError, tf.errors.NotFoundError,
            tf.errors.PermissionDeniedError, OSError, ValueError) as exc:
        # ValueError: the Saver's own check (saver.py) "Parent directory of ... doesn't exist, can't save."
        if isinstance(exc, ValueError) and "can't save" not in str(exc):
            raise
        if not _about(model_dir, str(getattr(exc, "message", None) or exc)):
            raise  # not about model_dir (an out-of-memory, a data file): let its own handler speak
        try:
            step = checkpoint_step(model_dir)
        except Exception:  # the directory may be gone
            step = None
        resume = f"; a rerun resumes from step {step}" if step else ""
        raise TpuLaunchError(f"run.model_dir {model_dir}: {first_line(exc)}",
                             hint=f"recreate the directory, free disk space or fix its permissions{resume}") from None


def _about(model_dir: str, text: str) -> bool:
    """Whether an error message names model_dir, a file in it, or a directory above it."""
    if "No space left" in text:
        return True
    for path in re.findall(r"(?:gs://|/)[^\s'\";,]+", text):
        path = path.rstrip(".")
        if path.startswith(model_dir) or model_dir.startswith(path.rstrip("/") + "/"):
            return True
    return False


def _repair_checkpoints(model_dir: str, recorder: RunRecorder):
    """Point the checkpoint state at the newest complete checkpoint, saying what was skipped."""
    from tpulaunch.engine.estimator.checkpoints import describe_repair, repair_checkpoint_state

    repair = repair_checkpoint_state(model_dir)
    for line in describe_repair(repair):
        recorder.note(line)
    return repair


def _train_segments(estimator, job: Job, train_input, hooks: list, listener, recorder: RunRecorder,
                    stop: StopSignal, dog, use_tpu: bool, search_path: Sequence[str]):
    """Train (and evaluate) from the latest checkpoint to the end; the NodeEvent if the TPU was lost, else None."""
    from tpulaunch.engine.estimator.hooks import EvaluationInterrupted, InterruptEvaluationHook
    from tpulaunch.engine import portable

    model_dir = job.run.model_dir
    evaluates = _evaluates(job)
    every = job.eval.every_steps if evaluates else None
    step = checkpoint_step(model_dir) or 0
    for boundary in portable.boundaries(step, job.train.steps, every):
        if step >= boundary:
            continue
        try:
            if dog is not None:
                dog.start()
            # spec_errors: the model_fn's scaffold checks the builder's weights when the session starts.
            with naming_read_errors(job, "train"), spec_errors(), recorder.phase_scope():
                recorder.phase_began(phases.BUILD)  # the hooks take it from there (restore, first step, training)
                estimator.train(train_input, max_steps=boundary, hooks=hooks, saving_listeners=[listener])
        except Exception as exc:  # only a lost TPU is handled here; anything else propagates unchanged
            if dog is None or not dog.record_error(exc):
                raise
        finally:
            if dog is not None:
                dog.stop()
        tripped = dog.tripped if dog is not None else None
        if stop.received is not None:
            if tripped is not None:  # the TPU went too: the save at the stop may be incomplete
                _repair_checkpoints(model_dir, recorder)
            step = checkpoint_step(model_dir) or step
            if step >= job.train.steps and evaluates:  # a rerun would not evaluate: say so
                raise _evaluation_stopped(job, step, stop, recorder)
            summary = recorder.finish(stopped_by=stop.name)
            raise TrainingStopped(
                f"stopped at step {step}, checkpoint saved; rerun the same command to resume",
                signum=stop.received, step=step, summary=summary)
        if tripped is not None:
            return tripped
        step = checkpoint_step(model_dir) or step
        if every or (boundary == job.train.steps and evaluates):
            try:
                _evaluate_into(estimator, job, use_tpu, search_path, recorder,
                               hooks=[InterruptEvaluationHook(lambda: stop.received is not None)])
            except EvaluationInterrupted:
                raise _evaluation_stopped(job, step, stop, recorder) from None
            except Exception as exc:
                if dog is None or not dog.record_error(exc):
                    raise
                return dog.tripped
    return None


def _evaluates(job: Job) -> bool:
    return job.eval is not None and (job.data.eval is not None or bool(job.data.input_fn))


def _evaluation_stopped(job: Job, step: int, stop: StopSignal, recorder: RunRecorder) -> EvaluationStopped:
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


def _recover(event, job: Job, watch, recorder: RunRecorder, stop: StopSignal, use_tpu: bool):
    """After a lost TPU: keep the last complete checkpoint, then stop (NodeLost) or wait and return a resolver."""
    from tpulaunch.run.watchdog import NodeLost, wait_until_ready

    model_dir = job.run.model_dir
    event.step = recorder.step
    repair = _repair_checkpoints(model_dir, recorder)
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
    if watch.recreate:
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


def _evaluate_into(estimator, job: Job, use_tpu: bool, search_path: Sequence[str], recorder: RunRecorder,
                   checkpoint: Optional[str] = None, hooks: Sequence = ()) -> EvalResult:
    from tpulaunch.engine.estimator.hooks import skipped_records_counter

    hook, skipped = skipped_records_counter()
    with naming_read_errors(job, "eval"), recorder.phase(phases.EVALUATION):
        results = estimator.evaluate(input_fn_for(job, "eval", use_tpu, search_path), steps=job.eval.steps,
                                     checkpoint_path=checkpoint, hooks=[hook, *hooks])
    return recorder.evaluated(int(results.get("global_step", 0)), results, skipped())


def evaluate(job: Job, *, local: bool, checkpoint: Optional[str] = None, recorder: Optional[RunRecorder] = None,
             cluster_resolver: Any = None, search_path: Sequence[str] = ()) -> EvalResult:
    """Evaluate the latest checkpoint in model_dir (or `checkpoint`) for `eval.steps` batches.

    The result is also handed to `recorder` (its renderers show it), when given.

    Raises:
        TpuLaunchError: no eval section or data, or no checkpoint to evaluate.
    """
    if job.eval is None or (job.data.eval is None and not job.data.input_fn):
        raise TpuLaunchError("the job has nothing to evaluate", hint="add an eval: section and data.eval")
    if checkpoint is None and checkpoint_step(job.run.model_dir) is None:
        raise TpuLaunchError(f"no checkpoint in {job.run.model_dir} to evaluate",
                             hint="train first, or pass --checkpoint PATH")
    use_tpu = job.on_tpu and not local
    estimator = make_estimator(job, use_tpu=use_tpu, cluster_resolver=cluster_resolver, search_path=search_path)
    return _evaluate_into(estimator, job, use_tpu, search_path, recorder or RunRecorder(), checkpoint)


# ----------------------------------------------------------------------------------------- export

def serving_input_receiver_fn(job: Job, search_path: Sequence[str] = ()):
    """The job's own `model.serving_input_fn`, its failures located there; else placeholders of the declared
    feature shapes (batch dim open), in the input_fn's structure."""
    if job.model.serving_input_fn:
        from tpulaunch.engine.estimator.build import located
        from tpulaunch.job.imports import resolve

        own = resolve(job.model.serving_input_fn, search_path=search_path, what="serving_input_fn")
        return located(own, job, "infer", ("model", "serving_input_fn"))
    import tensorflow as tf

    from tpulaunch.engine.estimator.plain import features_as_dict

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


def export(job: Job, out_dir: str, *, checkpoint: Optional[str] = None, search_path: Sequence[str] = ()) -> str:
    """Write a SavedModel (CPU/GPU serving graph) of the latest checkpoint under `out_dir`.

    The serving signature takes `data.features` as declared. A failed export leaves `out_dir` as it
    was: TensorFlow's half-written `temp-*` directory is removed (and `out_dir` too when this export
    created it).

    Returns:
        The SavedModel's directory (a timestamped subdirectory of `out_dir`).

    Raises:
        TpuLaunchError: no checkpoint to export, or the model cannot be built on the declared features.
    """
    import tensorflow as tf

    from tpulaunch.engine.estimator.build import BuildError

    if checkpoint is None and checkpoint_step(job.run.model_dir) is None:
        raise TpuLaunchError(f"no checkpoint in {job.run.model_dir} to export", hint="train first")
    estimator = make_estimator(job, use_tpu=False, search_path=search_path)
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
