"""validate refuses what XLA's TPU compiler says cannot fit: the job's step compiled for its TPU type, at its
batch and partition (`plan/xla_tpu.py`), where the compiler is installed. Without it, nothing is said here:
`plan` shows the estimate and how to get XLA's answer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpulaunch.plan import xla_home

if TYPE_CHECKING:
    from tpulaunch.job.load import LoadedJob
    from tpulaunch.plan.build import Plan


def xla_fit_problems(loaded: "LoadedJob", plan: "Plan") -> list:
    """One located problem when XLA says the step does not fit (at train.batch_size, with XLA's numbers and the
    nearest batch that fits), or when XLA rejects it for another reason (a warning at model.builder)."""
    job = loaded.job
    if job is None or plan.slice is None or not job.model.builder or xla_home.compiler_python() is None:
        return []
    from tpulaunch.plan.xla_tpu import XlaUnavailable, compile_step, fits, nearest_fitting_batch, usable_bytes
    from tpulaunch.plan.xla_words import figures_text, human_bytes, nearest_text

    try:
        result = compile_step(job, plan, plan.per_replica_batch)
    except XlaUnavailable as exc:
        said = str(exc)
        # Where the cause lies: the slice XLA was asked to compile for, else the step the model makes (a key the
        # file leaves out is placed at its section).
        if "libtpu does not know the topology" in said:
            path = ("tpu", "type")
        elif "devices, fewer than" in said:
            path = ("tpu", "cores_per_replica")
        else:
            path = ("model", "builder")
        return [loaded.problem(path, "xla-no-answer", f"XLA's TPU compiler could not answer: {said}",
                               "plan shows the estimate instead", severity="warning")]
    if fits(result, plan):
        return []
    if result["fits"]:  # compiled, yet its peak is above XLA's own line: said, not refused
        return [loaded.problem(("train", "batch_size"), "xla-above-usable",
                               f"{figures_text(result)}, above the usable {human_bytes(usable_bytes(result, plan))}",
                               "a smaller train.batch_size leaves XLA room", severity="warning")]
    try:
        found = nearest_fitting_batch(job, plan, result)
    except XlaUnavailable:
        found = None
    if found:
        found["global_batch"] = found["per_replica_batch"] * plan.replicas
        hint = f"XLA: {nearest_text(found)}; or split the input over more cores (partition:, tpu.cores_per_replica)"
    else:
        hint = ("not even the smallest batch tried fits: split the input over more cores (partition:, "
                "tpu.cores_per_replica) or use a generation with more HBM")
    path = ("train", "batch_size") if loaded.section("train") is not None else ("tpu", "type")
    return [loaded.problem(path, "xla-does-not-fit", f"the training step does not fit a {plan.slice.tpu_type} core: "
                           + figures_text(result), hint)]
