"""RunConfig, TPUConfig and TPUEstimator from a job; train (with periodic evaluation), evaluate, export.

The same functions run on a TPU slice (`use_tpu=True`, with a cluster resolver) and on this machine's
CPU or GPU (`use_tpu=False`): the model_fn and input_fn are the same, only the estimator's settings
differ. TensorFlow is imported inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import re

import os
from typing import TYPE_CHECKING, Any, List, Optional, Sequence

from tpulaunch.data.pipeline import naming_read_errors
from tpulaunch.errors import TpuLaunchError, first_line
from tpulaunch.job.schema import Job
from tpulaunch.run.progress import EvalResult, TrainProgress, TrainSummary
from tpulaunch.run.signals import StopSignal, TrainingStopped

if TYPE_CHECKING:
    from tpulaunch.run.watchdog import WatchPlan

JOB_COPY = "tpulaunch-job.yaml"
"""The resolved job, written into model_dir by `train` (secrets masked)."""

MASK = "***"

# Sections of the job that define what a checkpoint contains: resuming with other values would
# restore variables into a different model or feed it different tensors.
_IDENTITY = (("model",), ("data", "features"), ("data", "labels"))

# Plain progress lines on CPU/GPU when the job does not say (a TPU job uses iterations_per_loop).
DEFAULT_LOG_EVERY_STEPS = 100


# ------------------------------------------------------------------------------------------ configs

def partition_dims(job: Job) -> Optional[list]:
    """`TPUConfig.input_partition_dims` for the job: `[features_dims, labels_dims]`, or None.

    Each part mirrors the structure the input_fn yields (see interfaces): the dims list (or None)
    for a single tensor, a dict with every tensor's name for several (None = replicated), None for
    no labels. None overall when the job has no `partition:` section or one replica uses one core.

    Raises:
        TpuLaunchError: a single feature left unpartitioned while labels are partitioned (TF needs
            `input_partition_dims[0]` to be set whenever partitioning is on).
    """
    if job.partition is None or job.tpu is None or job.tpu.cores_per_replica <= 1:
        return None
    if job.partition == "auto":  # the dims `tpulaunch plan` shows: smallest split that fits, largest axes first
        from tpulaunch.plan.memory import resolve_auto_partition

        job = job.model_copy(update={"partition": resolve_auto_partition(job)})
    feature_dims = _mirror(job.data.features, job.partition.features)
    label_dims = _mirror(job.data.labels, job.partition.labels) if job.data.labels else None
    if feature_dims is None and label_dims is None:
        return None
    if feature_dims is None:
        raise TpuLaunchError(
            "partition.labels is set but the only feature is not partitioned",
            hint="TensorFlow needs the feature's dims when labels are partitioned; give partition.features "
                 "the feature's dims (all 1s to keep it whole)")
    return [feature_dims, label_dims]


def _mirror(specs: dict, dims: dict):
    if len(specs) == 1:
        (name,) = specs
        value = dims.get(name)
        return list(value) if value is not None else None
    return {name: (list(dims[name]) if dims.get(name) is not None else None) for name in specs}


def run_config(job: Job, *, use_tpu: bool, cluster_resolver: Any = None, model_dir: Optional[str] = None):
    """The `tf.compat.v1.estimator.tpu.RunConfig` for `job`.

    Args:
        job: the validated job.
        use_tpu: configure the TPU parts (cores per replica, input partitioning, PER_HOST_V2).
        cluster_resolver: a TPUClusterResolver for the TPU (None: nothing is contacted here).
        model_dir: overrides `job.run.model_dir`.
    """
    import tensorflow as tf

    tpu_lib = tf.compat.v1.estimator.tpu
    tpu_kwargs: dict = {"iterations_per_loop": job.tpu.iterations_per_loop if job.tpu else 1}
    if use_tpu:
        tpu_kwargs["per_host_input_for_training"] = tpu_lib.InputPipelineConfig.PER_HOST_V2
        if job.tpu is not None and job.tpu.cores_per_replica > 1:
            tpu_kwargs["num_cores_per_replica"] = job.tpu.cores_per_replica
            tpu_kwargs["input_partition_dims"] = partition_dims(job)
    log_every = log_every_steps(job)
    return tpu_lib.RunConfig(
        cluster=cluster_resolver if use_tpu else None,
        model_dir=model_dir or job.run.model_dir,
        save_checkpoints_steps=job.run.save_checkpoints_steps,
        keep_checkpoint_max=job.run.keep_checkpoint_max,
        tf_random_seed=job.run.seed,
        log_step_count_steps=log_every,
        save_summary_steps=log_every,
        tpu_config=tpu_lib.TPUConfig(**tpu_kwargs),
    )


def log_every_steps(job: Job) -> int:
    if job.run.log_every_steps:
        return job.run.log_every_steps
    return job.tpu.iterations_per_loop if job.tpu else DEFAULT_LOG_EVERY_STEPS


def make_estimator(job: Job, *, use_tpu: bool, cluster_resolver: Any = None, search_path: Sequence[str] = (),
                   model_dir: Optional[str] = None, export_to_tpu: bool = False):
    """A TPUEstimator for `job` with the portable model_fn (or the job's own `model.model_fn`)."""
    import tensorflow as tf

    from tpulaunch.engine.estimator.model_fn import make_model_fn

    eval_batch = job.eval.batch_size if job.eval else None
    return tf.compat.v1.estimator.tpu.TPUEstimator(
        model_fn=make_model_fn(job, use_tpu=use_tpu, search_path=search_path),
        config=run_config(job, use_tpu=use_tpu, cluster_resolver=cluster_resolver, model_dir=model_dir),
        use_tpu=use_tpu,
        train_batch_size=job.train.batch_size if job.train else (eval_batch or 1),
        eval_batch_size=eval_batch,
        predict_batch_size=None,
        eval_on_tpu=use_tpu,
        export_to_tpu=export_to_tpu and use_tpu,
    )


def _input_fn(job: Job, mode: str, use_tpu: bool, search_path: Sequence[str]):
    if job.data.input_fn:
        # Resolved here rather than in data.py: the job file's directory must be on the search path.
        from tpulaunch.job.imports import resolve

        return resolve(job.data.input_fn, search_path=search_path, what="input_fn")
    from tpulaunch.data.pipeline import make_input_fn

    return make_input_fn(job, mode, use_tpu=use_tpu)


# --------------------------------------------------------------------------------------- checkpoints

def checkpoint_step(model_dir: str) -> Optional[int]:
    """The global step of the latest checkpoint in `model_dir`, or None when there is none."""
    import tensorflow as tf

    path = tf.train.latest_checkpoint(model_dir)
    if not path:
        return None
    return int(tf.train.load_variable(path, "global_step"))


# Where a job holds mappings of the user's own keys: the only places a secret-looking name can be
# (everywhere else the schema fixes the key names, and `key` there is a TFRecord feature key).
_FREE_FORM = (("model", "params"), ("model", "optimizer", "args"))


def job_document(job: Job) -> dict:
    """The resolved job as plain data, with values under secret-looking keys in free-form mappings masked."""
    from tpulaunch.job.yamlfile import looks_secret

    def mask(value):
        if isinstance(value, dict):
            return {k: MASK if looks_secret(str(k)) else mask(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mask(v) for v in value]
        return value

    document = job.model_dump(mode="json", exclude_none=True)
    for keys in _FREE_FORM:
        parent = _get(document, keys[:-1])
        if isinstance(parent, dict) and keys[-1] in parent:
            parent[keys[-1]] = mask(parent[keys[-1]])
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

def _boundaries(start: int, steps: int, every: Optional[int]) -> List[int]:
    """Global steps to train to, one segment each; evaluation follows each when `every` is set."""
    if not every:
        return [steps]
    points = list(range((start // every + 1) * every, steps, every))
    return points + [steps]


def train(job: Job, *, local: bool, progress: Optional[TrainProgress] = None, stop: Optional[StopSignal] = None,
          cluster_resolver: Any = None, search_path: Sequence[str] = (), force: bool = False,
          watch: Optional["WatchPlan"] = None) -> TrainSummary:
    """Train to `job.train.steps`, resuming from model_dir's latest complete checkpoint, evaluating as the job says.

    Without `eval.every_steps` and with eval data, one evaluation runs at the end. Before every
    (re)start the checkpoint state is repaired: a checkpoint a preemption cut in half is skipped and
    training resumes from the one before it.

    Args:
        job: the validated job (needs `train` and `data.train`).
        local: run on this machine (use_tpu=False) even when the job has a `tpu:` section.
        progress: receives the events; a silent one when None.
        stop: records SIGINT/SIGTERM while training runs (a new one when None).
        cluster_resolver: the TPU's cluster resolver (TPU runs only).
        search_path: directories for the job's import paths (the job file's directory).
        force: resume even when model_dir was written by a job with another model or data spec.
        watch: watch the TPU node while training (`watchdog.WatchPlan`): stop cleanly when it is
            lost and, `watch.auto_resume` times at most, wait for it and resume. A TPU run gets a
            fresh cluster resolver for each resume. None: no watching.

    Returns:
        The summary (also printed by `progress`), with the TPU events and resumes.

    Raises:
        TrainingStopped: a signal arrived; a checkpoint was saved at the step where training stopped
            (or, while waiting for the TPU, the last complete checkpoint is kept).
        watchdog.NodeLost: the TPU was lost and no automatic resume was left (exit code 3).
        TpuLaunchError: the job cannot train (no train section or data, a model_dir of another job),
            or the TPU did not come back in time.
    """
    if job.train is None or (job.data.train is None and not job.data.input_fn):
        raise TpuLaunchError("the job has nothing to train on", hint="add a train: section and data.train")
    use_tpu = job.on_tpu and not local
    model_dir = job.run.model_dir
    if progress is None:
        from rich.console import Console

        progress = TrainProgress(Console(quiet=True), total_steps=job.train.steps, batch_size=job.train.batch_size,
                                 disable=True, model_dir=model_dir)
    stop = stop or StopSignal()

    with model_dir_errors(model_dir):
        _repair_checkpoints(model_dir, progress)
        write_job_copy(job, model_dir, force=force)
    start = checkpoint_step(model_dir) or 0
    if start >= job.train.steps:
        progress.at_step(start)
        progress.note(f"already at step {start} of {job.train.steps} in {model_dir}; nothing to train")
    elif start:
        progress.note(f"resumed from step {start} ({model_dir})")
    train_input = _input_fn(job, "train", use_tpu, search_path)

    from tpulaunch.run.progress import progress_hooks, skipped_records_hook
    from tpulaunch.run.signals import stop_hook

    steps_per_run = job.tpu.iterations_per_loop if use_tpu else 1
    hook, listener = progress_hooks(progress, steps_per_run=steps_per_run)
    hooks = [hook, stop_hook(stop), skipped_records_hook(progress)]
    dog = None
    if watch is not None:
        from tpulaunch.run.watchdog import Watchdog

        dog = Watchdog(watch)
        hooks.append(dog.hook())
    with stop:
        while True:
            estimator = make_estimator(job, use_tpu=use_tpu, cluster_resolver=cluster_resolver, search_path=search_path)
            with model_dir_errors(model_dir):
                event = _train_segments(estimator, job, train_input, hooks, listener, progress, stop, dog,
                                        use_tpu, search_path)
            if event is None:
                return progress.finish()
            cluster_resolver = _recover(event, job, watch, progress, stop, use_tpu)
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


def _repair_checkpoints(model_dir: str, progress: TrainProgress):
    """Point the checkpoint state at the newest complete checkpoint, saying what was skipped."""
    from tpulaunch.engine.estimator.checkpoints import describe_repair, repair_checkpoint_state

    repair = repair_checkpoint_state(model_dir)
    for line in describe_repair(repair):
        progress.note(line)
    return repair


def _train_segments(estimator, job: Job, train_input, hooks: list, listener, progress: TrainProgress,
                    stop: StopSignal, dog, use_tpu: bool, search_path: Sequence[str]):
    """Train (and evaluate) from the latest checkpoint to the end; the NodeEvent if the TPU was lost, else None."""
    model_dir = job.run.model_dir
    evaluates = job.eval is not None and (job.data.eval is not None or bool(job.data.input_fn))
    every = job.eval.every_steps if evaluates else None
    step = checkpoint_step(model_dir) or 0
    for boundary in _boundaries(step, job.train.steps, every):
        if step >= boundary:
            continue
        try:
            if dog is not None:
                dog.start()
            with naming_read_errors(job, "train"):
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
                _repair_checkpoints(model_dir, progress)
            step = checkpoint_step(model_dir) or step
            summary = progress.finish(stopped_by=stop.name)
            raise TrainingStopped(
                f"stopped at step {step}, checkpoint saved; rerun the same command to resume",
                signum=stop.received, step=step, summary=summary)
        if tripped is not None:
            return tripped
        step = checkpoint_step(model_dir) or step
        if every or (boundary == job.train.steps and evaluates):
            try:
                _evaluate_into(estimator, job, use_tpu, search_path, progress)
            except Exception as exc:
                if dog is None or not dog.record_error(exc):
                    raise
                return dog.tripped
    return None


def _recover(event, job: Job, watch, progress: TrainProgress, stop: StopSignal, use_tpu: bool):
    """After a lost TPU: keep the last complete checkpoint, then stop (NodeLost) or wait and return a resolver."""
    from tpulaunch.run.watchdog import NodeLost, wait_until_ready

    model_dir = job.run.model_dir
    event.step = progress.step
    repair = _repair_checkpoints(model_dir, progress)
    event.checkpoint_step = repair.step or 0
    progress.node_event(event)
    name = watch.ref.name
    if progress.resumes >= watch.auto_resume:
        summary = progress.finish(stopped_by=f"TPU {event.detail}")
        tried = f" after {progress.resumes} automatic resume{'s' if progress.resumes != 1 else ''}" \
            if progress.resumes else ""
        raise NodeLost(
            f"TPU node '{name}' lost ({event.detail}) at step {event.step}{tried}; the last complete checkpoint is "
            f"at step {event.checkpoint_step} ({event.steps_lost} steps lost)",
            hint="once the node is READY again (`gcloud compute tpus describe` / recreate a preempted node), rerun "
                 "the same command to resume from that checkpoint; add --auto-resume N to wait and resume "
                 "automatically",
            event=event, summary=summary)

    def waiting(status, problem, left):
        progress.node_waiting(problem or (lost_state(status) if status else "no answer"), left)

    status = wait_until_ready(watch, should_stop=lambda: stop.received is not None, on_wait=waiting)
    if status is None:
        summary = progress.finish(stopped_by=stop.name)
        raise TrainingStopped(
            f"stopped while waiting for TPU node '{name}'; the checkpoint at step {event.checkpoint_step} is kept: "
            "rerun the same command to resume",
            signum=stop.received, step=event.checkpoint_step, summary=summary)
    progress.node_ready(f"{status.state}/{status.health}", event.checkpoint_step, watch.auto_resume)
    if not use_tpu:
        return None
    from tpulaunch.tpu import node as cluster

    return cluster.cluster_resolver(watch.ref, watch.discovery_url)


def lost_state(status) -> str:
    """The node's state for a waiting line: 'PREEMPTED', 'READY/UNHEALTHY_TENSORFLOW', 'CREATING'."""
    if status.state == "READY" and status.health:
        return f"{status.state}/{status.health}"
    return str(status.state)


def _evaluate_into(estimator, job: Job, use_tpu: bool, search_path: Sequence[str], progress: Optional[TrainProgress],
                   checkpoint: Optional[str] = None) -> EvalResult:
    from tpulaunch.run.progress import skipped_records_counter

    hook, skipped = skipped_records_counter()
    with naming_read_errors(job, "eval"):
        results = estimator.evaluate(_input_fn(job, "eval", use_tpu, search_path), steps=job.eval.steps,
                                     checkpoint_path=checkpoint, hooks=[hook])
    step = int(results.get("global_step", 0))
    metrics = {k: float(v) for k, v in results.items() if k != "global_step"}
    if progress is not None:
        return progress.evaluated(step, metrics, skipped())
    return EvalResult(step, metrics, skipped())


def evaluate(job: Job, *, local: bool, checkpoint: Optional[str] = None, progress: Optional[TrainProgress] = None,
             cluster_resolver: Any = None, search_path: Sequence[str] = ()) -> EvalResult:
    """Evaluate the latest checkpoint in model_dir (or `checkpoint`) for `eval.steps` batches.

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
    return _evaluate_into(estimator, job, use_tpu, search_path, progress, checkpoint)


# ----------------------------------------------------------------------------------------- export

def serving_input_receiver_fn(job: Job):
    """Placeholders of the declared feature shapes (batch dim open), in the input_fn's structure."""
    import tensorflow as tf

    def receiver_fn():
        placeholders = {}
        for name, spec in job.data.features.items():
            dtype = "float32" if spec.dtype == "bfloat16" else spec.dtype
            placeholders[name] = tf.compat.v1.placeholder(dtype, [None, *spec.shape], name=name)
        if len(placeholders) == 1:
            (tensor,) = placeholders.values()
            return tf.estimator.export.TensorServingInputReceiver(tensor, placeholders)
        return tf.estimator.export.ServingInputReceiver(placeholders, placeholders)

    return receiver_fn


def export(job: Job, out_dir: str, *, checkpoint: Optional[str] = None, search_path: Sequence[str] = ()) -> str:
    """Write a SavedModel (CPU/GPU serving graph) of the latest checkpoint under `out_dir`.

    Returns:
        The SavedModel's directory (a timestamped subdirectory of `out_dir`).

    Raises:
        TpuLaunchError: no checkpoint to export.
    """
    if checkpoint is None and checkpoint_step(job.run.model_dir) is None:
        raise TpuLaunchError(f"no checkpoint in {job.run.model_dir} to export", hint="train first")
    estimator = make_estimator(job, use_tpu=False, search_path=search_path)
    path = estimator.export_saved_model(out_dir, serving_input_receiver_fn(job), checkpoint_path=checkpoint)
    return path.decode() if isinstance(path, bytes) else str(path)
