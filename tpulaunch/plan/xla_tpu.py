"""Will it fit? XLA's own answer: the job's training step compiled by XLA's TPU compiler for the job's TPU type,
on this machine, without a TPU.

The step is built from the job's model in the step child of `plan/memory.py` (under the engine's TensorFlow)
and exported as HLO (`plan/xla_export.py`); the compiler's own environment (`plan/xla_home.py`) compiles it for
the slice's generation as a libtpu topology (`plan/xla_topology.py`) with the job's layout as XLA shardings
(`plan/xla_compile.py`): one replica's program, at the per-replica batch, on `cores_per_replica` devices, its
main feature split by the partition dims (SPMD), weights and slots replicated. Every replica runs the same
program, so what one device of it needs is the answer per core.

Where the exported step cannot stand for the TPU's, this says why and the estimate answers (marked so).
"""

from __future__ import annotations

import json
import math
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from tpulaunch.job.schema import Job
from tpulaunch.plan import xla_home
from tpulaunch.plan.xla_topology import target_for, tiled_sharding

if TYPE_CHECKING:
    from tpulaunch.plan.build import Plan

EXPORT_TIMEOUT_S = 600
COMPILE_TIMEOUT_S = 900
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding `tpulaunch/`
_RESULTS: dict = {}  # (job's model and data, target, batch) -> result, for this process (validate then plan)


class XlaUnavailable(Exception):
    """XLA cannot answer for this job (the reason says why); the estimate answers instead."""


def _compile(python: str, request: dict) -> dict:
    """Run `xla_compile.main` in the compiler's environment on `request`."""
    code = (f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); "
            "from tpulaunch.plan.xla_compile import main; main()")
    try:
        done = subprocess.run([python, "-I", "-c", code], input=json.dumps(request), capture_output=True, text=True,
                              timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise XlaUnavailable(f"XLA's TPU compiler did not finish within {COMPILE_TIMEOUT_S} s") from None
    except OSError as exc:
        raise XlaUnavailable(f"XLA's TPU compiler could not start ({python}): {exc}") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = [line for line in done.stderr.strip().splitlines() if line.strip()][-2:]
        raise XlaUnavailable(f"XLA's TPU compiler failed ({python}): " + " | ".join(tail))
    result = json.loads(lines[-1])
    if "error" in result:
        raise XlaUnavailable(result["error"])
    return result


def compile_step(job: Job, plan: "Plan", per_replica_batch: int, slots: Optional[float] = None) -> dict:
    """XLA's figures for one replica's training step at `per_replica_batch` examples on the job's slice.

    Returns:
        `xla_compile.compile_for_topology`'s answer, with "topology", "partitions", "per_replica_batch",
        "export_seconds", "compile_seconds".

    Raises:
        XlaUnavailable: no compiler, no slice, a step that cannot be exported or that XLA rejects for a reason
            other than memory.
    """
    import time

    from tpulaunch.plan.memory import Tile, main_feature, run_step_child, step_request
    from tpulaunch.seam.registry import about
    from tpulaunch.tpu.types import parse_tpu_type

    python = xla_home.compiler_python()
    if python is None:
        raise XlaUnavailable(xla_home.not_found_reason())
    if plan.slice is None:
        raise XlaUnavailable("the job runs on this machine: no TPU to compile for")
    if not job.model.builder:
        raise XlaUnavailable("a model.model_fn job's train step is the graph TPUEstimator's TPU rewrite builds "
                             "around the model_fn, which cannot be exported as one XLA step offline")
    target = target_for(parse_tpu_type(plan.slice.tpu_type), plan.cores_per_replica)
    feature = main_feature(job)
    fed = plan.feed_partition.features.get(feature) if plan.feed_partition else None
    dims = tuple(fed) if fed and math.prod(fed) > 1 else None
    key = (job.model_dump_json(include={"model", "data", "flags"}), target, dims, per_replica_batch, slots)
    if key in _RESULTS:
        return _RESULTS[key]
    inputs = list(job.data.features)
    with tempfile.TemporaryDirectory(prefix="tpulaunch-xla-") as scratch:
        shape = tuple(job.data.features[feature].shape)
        request = dict(step_request(job, Tile(per_replica_batch, shape, plan.cores_per_replica, None), slots),
                       export=True, dir=scratch, precision=job.model.precision)
        exporter = about(plan.engine).step_exporter
        if exporter:  # the engine lowers its own step, from the whole job (its loss, optimizer and metrics)
            request.update(exporter=exporter, job=job.model_dump(mode="json"))
        try:
            exported = run_step_child(request, timeout=EXPORT_TIMEOUT_S)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            raise XlaUnavailable(f"the step could not be exported for XLA: {exc}") from None
        shardings = [None] * exported["inputs"]
        if dims is not None:
            # The builder's inputs follow the features' order (one feature: the only input).
            shardings[inputs.index(feature) if len(inputs) == exported["inputs"] else 0] = tiled_sharding(dims)
        started = time.monotonic()
        result = _compile(python, {"hlo": exported["hlo"], "format": exported.get("format", "hlo"),
                                   "topology": target.topology,
                                   "partitions": target.partitions, "shardings": shardings,
                                   "donated": exported["donated"]})
    result.update(topology=target.topology, partitions=target.partitions, per_replica_batch=per_replica_batch,
                  dims=list(dims) if dims else None, export_seconds=exported["seconds"],
                  compile_seconds=round(time.monotonic() - started, 1))
    _RESULTS[key] = result
    return result


def nearest_fitting_batch(job: Job, plan: "Plan", failed: dict, slots: Optional[float] = None) -> Optional[dict]:
    """A per-replica batch XLA fits, close below the one that did not: halve until a compile fits, interpolate
    between that batch and the smallest failing one (XLA's out-of-memory message gives the failing one's
    temporaries), and confirm the interpolated batch with a compile; where it does not fit, the halved batch is
    the answer. Every batch it names was compiled. None when even one example per replica does not fit.

    (A line through two fitting compiles is not enough: XLA rematerialises and re-lays-out as memory tightens,
    so its need grows faster near the limit; a fit from 64 and 128 examples named 255 where 256 needed 19.25G.)
    """
    step = (failed.get("dims") or [1])[0]  # a split batch axis needs a multiple of its ways
    available = failed.get("available_bytes") or plan.slice.usable_bytes_per_device
    above, fitting = failed, None
    while above["per_replica_batch"] > step:
        candidate = max(step, (above["per_replica_batch"] // 2) // step * step)
        result = compile_step(job, plan, candidate, slots)
        if result["fits"]:
            fitting = result
            break
        above = result
    if fitting is None:
        return None
    low, high = fitting["per_replica_batch"], above["per_replica_batch"]
    fixed = fitting["per_core_bytes"] - fitting["temporaries"]  # arguments, outputs, code: nearly batch-free
    slope = (above["required_bytes"] + fixed - fitting["per_core_bytes"]) / (high - low)
    guess = low + int((available - fitting["per_core_bytes"]) / slope) if slope > 0 else low
    guess = min(high - step, guess // step * step)
    found = {"per_replica_batch": low, "per_core_bytes": fitting["per_core_bytes"], "fails_at": high, "tried": None}
    if guess > low:
        confirmed = compile_step(job, plan, guess, slots)
        if confirmed["fits"]:
            found.update(per_replica_batch=guess, per_core_bytes=confirmed["per_core_bytes"])
        else:
            found["tried"] = guess
    return found


def ask_xla(job: Job, plan: "Plan", slots: Optional[float] = None, nearest: bool = True) -> dict:
    """XLA's answer for the job's training step on its slice, as the memory section's `xla_tpu`:
    {"answered": "xla", "verdict", the figures, "nearest"} or {"answered": "estimate", "reason", "hint"}."""
    try:
        result = compile_step(job, plan, plan.per_replica_batch, slots)
    except XlaUnavailable as exc:
        fallback = {"answered": "estimate", "reason": str(exc)}
        if xla_home.compiler_python() is None:
            fallback["hint"] = xla_home.how_to_install()
        return fallback
    answer = dict(result, answered="xla", verdict="fits" if result["fits"] else "does-not-fit",
                  usable_bytes=result.get("available_bytes") or plan.slice.usable_bytes_per_device)
    if not result["fits"] and nearest:
        try:
            found = nearest_fitting_batch(job, plan, result, slots)
        except XlaUnavailable:
            found = None
        if found:
            found["global_batch"] = found["per_replica_batch"] * plan.replicas
        answer["nearest"] = found
    return answer



def add_xla_answer(plan: "Plan", job: Job) -> "Plan":
    """XLA's TPU compiler's answer in the plan's memory section (`MemoryPlan.xla_tpu`), beside the estimate: where
    XLA answered, its verdict is the section's (`answered_by` "xla", the estimate's kept as `estimate_verdict`)."""
    section = plan.memory
    if plan.slice is None or not section or section.get("per_core_bytes") is None:
        return plan
    section["xla_tpu"] = ask_xla(job, plan, slots=section.get("optimizer_slots"))
    if section["xla_tpu"].get("answered") == "xla":
        section["answered_by"], section["estimate_verdict"] = "xla", section["verdict"]
        section["verdict"] = section["xla_tpu"]["verdict"]
    return plan
