"""The boundary to `standalone.py`: the plain values it runs with, converted from a Job in one place,
and its errors turned into TpuLaunchError.

The engine (engine/pipeline.py, model_fn.py, runner.py) passes these values to standalone.py;
`tpulaunch explain` writes the same values into the program, each under the upper-case name of its
keyword, commented with the job key in `SOURCES`. Pure Python: TensorFlow is not imported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from tpulaunch.engine import plain as neutral
from tpulaunch.engine.plain import features_as_dict, log_every_steps, tensor_specs
from tpulaunch.job.schema import Job

if TYPE_CHECKING:
    from tpulaunch.plan.build import Plan

# Summaries are recorded every this many steps by default (writing one per step costs time on CPU).
DEFAULT_SUMMARY_STEPS = 100


def model_settings(job: Job) -> dict:
    """Keywords of `standalone.make_model_fn`, besides the builder, the callables, use_tpu and the policy.

    `labels` (the same value as make_dataset_fn's) names the model's heads, in declared order. The seed and
    the warm start are the run's: the builder's weights that start a fresh run are built with the same
    seed, and leave the warm-started variables alone.
    """
    spec = job.model
    metrics = {k: list(v) for k, v in spec.metrics.items()} if isinstance(spec.metrics, dict) else list(spec.metrics)
    return {"loss": dict(spec.loss) if isinstance(spec.loss, dict) else spec.loss, "metrics": metrics,
            "labels": tensor_specs(job.data.labels), "learning_rate": spec.optimizer.learning_rate,
            "model_dir": job.run.model_dir, "summary_steps": job.run.log_every_steps or DEFAULT_SUMMARY_STEPS,
            "seed": job.run.seed, **warm_start_settings(job), "outputs": spec.outputs_by_label(job.data.labels)}


def warm_start_settings(job: Job) -> dict:
    """`warm_start_from` and `warm_start_vars` for `run.warm_start` (None and '.*' without one)."""
    warm = job.run.warm_start
    return {"warm_start_from": warm.from_ if warm else None, "warm_start_vars": warm.vars if warm else ".*"}


def config_settings(job: Job, plan: "Plan", *, use_tpu: bool) -> dict:
    """Keywords of `standalone.run_config`, besides use_tpu and the cluster resolver.

    Cores per replica and the partition dims only when `use_tpu` (a TPU job run locally has neither).
    """
    cores = plan.cores_per_replica if use_tpu else 1
    return {
        "model_dir": job.run.model_dir,
        "iterations_per_loop": job.tpu.iterations_per_loop if job.tpu else 1,
        "num_cores_per_replica": cores if cores > 1 else None,
        "input_partition_dims": partition_dims(job, plan) if cores > 1 else None,
        "save_checkpoints_steps": job.run.save_checkpoints_steps,
        "keep_checkpoint_max": job.run.keep_checkpoint_max,
        "seed": job.run.seed,
        "log_every_steps": log_every_steps(job),
    }


def estimator_settings(job: Job, plan: "Plan") -> dict:
    """Keywords of `standalone.tpu_estimator`, besides the model_fn, the config and use_tpu."""
    from tpulaunch.engine.estimator.params import estimator_params

    return {"train_batch_size": plan.train_batch_size, "eval_batch_size": plan.eval_batch_size,
            "params": estimator_params(job), **warm_start_settings(job)}


# The job key each value comes from.
SOURCES = {
    **neutral.SOURCES,
    "num_cores_per_replica": ("tpu", "cores_per_replica"),
    "input_partition_dims": ("partition",),
    "params": ("model", "params"),
    "warm_start_from": ("run", "warm_start", "from"),
    "warm_start_vars": ("run", "warm_start", "vars"),
}


def partition_dims(job: Job, plan: "Plan") -> Optional[list]:
    """`TPUConfig.input_partition_dims` for the job: `[features_dims, labels_dims]`, or None.

    Each part mirrors the structure the input_fn yields: the dims list (or None) for a single
    tensor, a dict with every tensor's name for several (None = replicated), None for no labels.
    None overall when the plan feeds no partition (no `partition:`, one core per replica, local).
    The checks have refused the one structure TensorFlow cannot take (labels split beside a single
    unsplit feature: `partition-labels-without-feature`).
    """
    feed = plan.feed_partition
    if feed is None:
        return None
    feature_dims = _mirror(job.data.features, feed.features, as_dict=features_as_dict(job))
    label_dims = _mirror(job.data.labels, feed.labels) if job.data.labels else None
    if feature_dims is None and label_dims is None:
        return None
    return [feature_dims, label_dims]


def _mirror(specs: dict, dims: dict, as_dict: bool = False):
    if len(specs) == 1 and not as_dict:
        (name,) = specs
        value = dims.get(name)
        return list(value) if value is not None else None
    return {name: (list(dims[name]) if dims.get(name) is not None else None) for name in specs}


