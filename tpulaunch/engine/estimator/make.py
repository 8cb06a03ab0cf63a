"""The TPUEstimator a job runs with: its RunConfig/TPUConfig, the estimator, and the input_fn per mode.

The same functions run on a TPU slice (`use_tpu=True`, with a cluster resolver) and on this machine's
CPU or GPU (`use_tpu=False`): the model_fn and input_fn are the same, only the estimator's settings
differ. `train`, `evaluate`, `export` (runner.py) and validate's stopped build (stopped_run.py) all make
it here. TensorFlow is imported inside the functions that need it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from tpulaunch.engine.estimator.plain import config_settings, estimator_settings
from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.schema import Job
from tpulaunch.plan.build import Plan, build_plan


def run_config(job: Job, plan: Plan, *, cluster_resolver: Any = None, model_dir: Optional[str] = None):
    """The `tf.compat.v1.estimator.tpu.RunConfig` for `job`.

    Args:
        job: the validated job.
        plan: the job's Plan for its target: on a TPU (`plan.on_tpu`), the TPU parts are configured (cores per
            replica, input partitioning, PER_HOST_V2).
        cluster_resolver: a TPUClusterResolver for the TPU (None: nothing is contacted here).
        model_dir: overrides `job.run.model_dir`.
    """
    from tpulaunch.engine.estimator import standalone

    settings = config_settings(job, plan, use_tpu=plan.on_tpu)
    settings["model_dir"] = model_dir or settings["model_dir"]
    return standalone.run_config(use_tpu=plan.on_tpu, cluster_resolver=cluster_resolver, **settings)


def make_estimator(job: Job, plan: Plan, *, cluster_resolver: Any = None, search_path: Sequence[str] = (),
                   model_dir: Optional[str] = None, export_to_tpu: bool = False):
    """A TPUEstimator for `job` with the portable model_fn (or the job's own `model.model_fn` and its params), on
    `plan`'s target (`plan.on_tpu`)."""
    from tpulaunch.engine.estimator import standalone
    from tpulaunch.engine.estimator.model_fn import make_model_fn

    use_tpu = plan.on_tpu
    return standalone.tpu_estimator(
        make_model_fn(job, use_tpu=use_tpu, search_path=search_path),
        run_config(job, plan, cluster_resolver=cluster_resolver, model_dir=model_dir),
        use_tpu=use_tpu, export_to_tpu=export_to_tpu, **estimator_settings(job, plan))


def plan_on_this_machine(job: Job, plan: Optional[Plan] = None) -> Plan:
    """The Plan of a build on this machine's CPU/GPU, whatever the command's target: validate's stopped build,
    the input_fn signature check and export's serving graph run here even for a TPU job. The command's own
    Plan when it is for this machine already."""
    if plan is not None and not plan.on_tpu:
        return plan
    return build_plan(job, local=True)


def input_fn_for(job: Job, mode: str, use_tpu: bool, search_path: Sequence[str], *, unread_files: bool = False,
                 rolled_back: Callable[[], int] = lambda: 0):
    """The input_fn `train`/`evaluate` hand the estimator for `mode`: the job's own (`data.input_fn`), whose
    failures while building its dataset are reported at data.input_fn, or tpulaunch's pipeline called as
    TPUEstimator calls an input_fn (`standalone.params_input_fn`).

    `unread_files`: the pipeline is built over the data patterns as written, not the files they match (for a
    build that reads nothing: see stopped_run.py). `rolled_back()`: the steps the run rolled back from
    (`standalone.params_input_fn`).
    """
    if job.data.input_fn:
        # Resolved here rather than in data.py: the job file's directory must be on the search path.
        from tpulaunch.engine.estimator.locate import input_fn_key, located
        from tpulaunch.job.flags import apply_flags
        from tpulaunch.job.imports import resolve_input_fn

        if job.data.input_fn_for(mode) is None:
            raise TpuLaunchError(f"data.input_fn names no {mode} function",
                                 hint=f"add data.input_fn.{mode}: pkg.mod:{mode}_input_fn")
        apply_flags(job, search_path=search_path)  # a factory may read FLAGS as it builds the input_fn
        return located(resolve_input_fn(job.data, mode, search_path=search_path), job, mode,
                       input_fn_key(job.data, mode))
    from tpulaunch.engine.core.loop import evaluates
    from tpulaunch.engine.estimator.standalone import params_input_fn
    from tpulaunch.engine.pipeline import make_dataset_fn

    # The loop trains in segments between evaluations (engine/core/loop.py): a segment's pipeline is made anew
    segment_steps = job.eval.every_steps if evaluates(job) else None
    return params_input_fn(make_dataset_fn(job, mode, use_tpu=use_tpu, unread_files=unread_files),
                           training=mode == "train", segment_steps=segment_steps, rolled_back=rolled_back)
