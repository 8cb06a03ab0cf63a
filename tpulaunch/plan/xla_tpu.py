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

import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
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
_VERSIONS: dict = {}  # compiler python -> its jax, jaxlib and libtpu versions


class XlaUnavailable(Exception):
    """XLA cannot answer for this job (the reason says why); the estimate answers instead."""


def _versions(python: str) -> str:
    """The compiler environment's jax, jaxlib and libtpu versions (part of a cached answer's key)."""
    if python not in _VERSIONS:
        code = ("import importlib.metadata as m\nfor n in ('jax', 'jaxlib', 'libtpu'):\n"
                "    try: print(n, m.version(n))\n    except m.PackageNotFoundError: print(n, None)")
        try:
            done = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, timeout=120)
            _VERSIONS[python] = " ".join(done.stdout.split()) if done.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            _VERSIONS[python] = None
    return _VERSIONS[python]


def _cache_path(python: str, request: dict, hlo: bytes) -> Optional[Path]:
    """Where XLA's answer for this exported step on this topology, with this compiler (its versions, and
    `xla_compile.py`, which reads its figures), is kept; None when the versions cannot be read (nothing is cached)."""
    versions = _versions(python)
    if versions is None:
        return None
    said = {k: v for k, v in request.items() if k != "hlo"}
    compiler = Path(__file__).with_name("xla_compile.py").read_bytes()  # what it reports, and how
    key = hashlib.sha256(hlo + compiler + json.dumps([said, versions], sort_keys=True).encode()).hexdigest()
    return xla_home.cache_dir() / f"{key}.json"


def _progress(text: str) -> None:
    # On stderr: plan's stdout is its report (or its JSON).
    print(f"plan: XLA's TPU compiler: {text}", file=sys.stderr, flush=True)


def _compile(python: str, request: dict, what: str) -> dict:
    """Run `xla_compile.main` in the compiler's environment on `request`, or answer from the cache: an unchanged
    step (the same exported bytes, topology, layout and compiler) gets the answer it got before."""
    with open(request["hlo"], "rb") as f:
        hlo = f.read()
    cached = _cache_path(python, request, hlo)
    if cached is not None and cached.is_file():
        try:
            result = json.loads(cached.read_text())
            _progress(f"{what}: the answer cached in {cached}")
            return dict(result, cached=str(cached))
        except (OSError, ValueError):
            pass  # unreadable: compile again
    _progress(f"compiling {what} (minutes for a large step; cached in {xla_home.cache_dir()} for the next plan)")
    code = (f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); "
            "from tpulaunch.plan.xla_compile import main; main()")
    started = time.monotonic()
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
    result["compile_seconds"] = round(time.monotonic() - started, 1)
    if cached is not None:
        try:  # written whole, then renamed: a reader never sees half of it
            cached.parent.mkdir(parents=True, exist_ok=True)
            partial = cached.with_suffix(f".{os.getpid()}.part")
            partial.write_text(json.dumps(result))
            os.replace(partial, cached)
        except OSError as exc:  # a read-only cache costs the next plan time, not this one's answer
            _progress(f"could not cache the answer in {cached.parent}: {exc}")
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
        result = _compile(python, {"hlo": exported["hlo"], "format": exported.get("format", "hlo"),
                                   "topology": target.topology,
                                   "partitions": target.partitions, "shardings": shardings,
                                   "donated": exported["donated"]},
                          f"the step at {per_replica_batch} examples per replica for {target.topology}")
    result.update(topology=target.topology, partitions=target.partitions, per_replica_batch=per_replica_batch,
                  dims=list(dims) if dims else None, export_seconds=exported["seconds"])
    _RESULTS[key] = result
    return result


def usable_bytes(result: dict, plan: "Plan") -> int:
    """The one line a step must stay under: XLA's own limit for the topology (what its out-of-memory message calls
    available, `xla_compile.hbm_limit`); the slice's figure from XLA's published messages where it did not say."""
    return result.get("available_bytes") or plan.slice.usable_bytes_per_device


def fits(result: dict, plan: "Plan") -> bool:
    """XLA compiled the step and its peak stays under the usable line."""
    return bool(result["fits"]) and result["per_core_bytes"] <= usable_bytes(result, plan)


def _compiled(result: dict, plan: "Plan") -> dict:
    need = result["per_core_bytes"] if result["fits"] else result["required_bytes"]
    return {"per_replica_batch": result["per_replica_batch"], "fits": fits(result, plan), "bytes": need}


def _between(job: Job, plan: "Plan", fitting: dict, failing: dict, slots, tried: list) -> dict:
    """The batch interpolated between a fitting compile and a failing one (by XLA's figures), compiled: the fitting
    result with the larger batch (the interpolated one where it fits). Its compile is added to `tried`."""
    step = (fitting.get("dims") or [1])[0]  # a split batch axis needs a multiple of its ways
    low, high = fitting["per_replica_batch"], failing["per_replica_batch"]
    above = failing["per_core_bytes"] if failing["fits"] else failing["required_bytes"]
    slope = (above - fitting["per_core_bytes"]) / (high - low)
    room = usable_bytes(fitting, plan) - fitting["per_core_bytes"]
    guess = low + int(room / slope) if slope > 0 else high - step
    guess = min(high - step, guess // step * step)
    if guess <= low:
        return fitting
    result = compile_step(job, plan, guess, slots)
    tried.append(_compiled(result, plan))
    return result if fits(result, plan) else fitting


def nearest_fitting_batch(job: Job, plan: "Plan", failed: dict, slots: Optional[float] = None) -> Optional[dict]:
    """A per-replica batch XLA fits, close below the one that did not: halve until a compile fits, then one
    compile at the batch interpolated between it and the smallest failing one (by XLA's out-of-memory figure).
    Every batch it names was compiled; the answer is the largest compiled batch that fit, not a bound (XLA's
    memory is not monotonic in the batch). None when even one example per replica does not fit.

    (A line through two fitting compiles is not enough: XLA rematerialises and re-lays-out as memory tightens,
    so its need grows faster near the limit; a fit from 64 and 128 examples named 255 where 256 needed 19.25G.)
    """
    step = (failed.get("dims") or [1])[0]
    tried = [_compiled(failed, plan)]
    above, fitting = failed, None
    while above["per_replica_batch"] > step:
        candidate = max(step, (above["per_replica_batch"] // 2) // step * step)
        result = compile_step(job, plan, candidate, slots)
        tried.append(_compiled(result, plan))
        if fits(result, plan):
            fitting = result
            break
        above = result
    if fitting is None:
        return None
    return _found(_between(job, plan, fitting, above, slots, tried), tried)


def largest_compiled_fit(job: Job, plan: "Plan", fitting: dict, upward: int, slots: Optional[float] = None) -> dict:
    """For a step that fits: the largest batch among those compiled that fit, trying `upward` examples per replica
    (the estimate's largest) and, where that does not fit, one batch interpolated between the two."""
    tried = [_compiled(fitting, plan)]
    if upward > fitting["per_replica_batch"]:
        above = compile_step(job, plan, upward, slots)
        tried.append(_compiled(above, plan))
        fitting = above if fits(above, plan) else _between(job, plan, fitting, above, slots, tried)
    return _found(fitting, tried)


def _found(fitting: dict, tried: list) -> dict:
    failing = [t["per_replica_batch"] for t in tried if not t["fits"]]
    return {"per_replica_batch": fitting["per_replica_batch"], "per_core_bytes": fitting["per_core_bytes"],
            "compiled": sorted(tried, key=lambda t: t["per_replica_batch"]),
            "fails_at": min(failing) if failing else None}


def ask_xla(job: Job, plan: "Plan", slots: Optional[float] = None, nearest: bool = True,
            upward: Optional[int] = None) -> dict:
    """XLA's answer for the job's training step on its slice, as the memory section's `xla_tpu`:
    {"answered": "xla", "verdict", the figures, "usable_bytes", "nearest"} or {"answered": "estimate", "reason",
    "hint"}. "nearest": the largest compiled batch that fits (below the job's where it does not fit; up to `upward`
    examples per replica where it does)."""
    try:
        result = compile_step(job, plan, plan.per_replica_batch, slots)
    except XlaUnavailable as exc:
        fallback = {"answered": "estimate", "reason": str(exc)}
        if xla_home.compiler_python() is None:
            fallback["hint"] = xla_home.how_to_install()
        return fallback
    verdict = "fits" if fits(result, plan) else "may-fit" if result["fits"] else "does-not-fit"
    answer = dict(result, answered="xla", verdict=verdict, usable_bytes=usable_bytes(result, plan))
    if verdict == "may-fit":  # compiled, yet above XLA's own line: never called fitting
        answer["above_usable"] = True
    if nearest:
        try:
            if verdict == "fits":
                found = largest_compiled_fit(job, plan, result, upward or 0, slots) if upward else None
            else:
                found = nearest_fitting_batch(job, plan, result, slots)
        except XlaUnavailable:
            found = None
        if found:
            found["global_batch"] = found["per_replica_batch"] * plan.replicas
        answer["nearest"] = found
    return answer


def add_xla_answer(plan: "Plan", job: Job) -> "Plan":
    """XLA's TPU compiler's answer in the plan's memory section (`MemoryPlan.xla_tpu`), beside the estimate: where
    XLA answered, its verdict, its usable line and its recommended batch are the section's (`answered_by` "xla";
    the estimate's kept as `estimate_verdict`, `estimate_usable_bytes` and `estimate_recommendation`)."""
    section = plan.memory
    if plan.slice is None or not section or section.get("per_core_bytes") is None:
        return plan
    recommended = section.get("recommendation") or {}
    upward = recommended.get("per_replica_batch") if recommended.get("action") == "batch" else None
    section["xla_tpu"] = ask_xla(job, plan, slots=section.get("optimizer_slots"), upward=upward)
    xla = section["xla_tpu"]
    if xla.get("answered") == "xla":
        section["answered_by"], section["estimate_verdict"] = "xla", section["verdict"]
        section["verdict"] = xla["verdict"]
        section["estimate_usable_bytes"], section["usable_bytes"] = section.get("usable_bytes"), xla["usable_bytes"]
        section["estimate_recommendation"] = section.get("recommendation")
        found = xla.get("nearest")
        if found:
            section["recommendation"] = {
                "action": "batch" if xla["verdict"] == "fits" else "reduce-batch", "source": "xla",
                "per_replica_batch": found["per_replica_batch"], "global_batch": found["global_batch"],
                "per_core_bytes": found["per_core_bytes"]}
        elif xla["verdict"] == "fits" or recommended.get("action") != "partition":
            section["recommendation"] = None  # the estimate's batch is not XLA's; its partition advice stands
    return plan
