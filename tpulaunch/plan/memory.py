"""Will it fit? The per-core memory of one training step, estimated before any TPU is allocated.

Per core = weights + gradients + optimizer slots (every core of every replica holds a full copy:
spatial partitioning splits only activations) + a bfloat16 copy of the weights under bfloat16
precision + the activations the backward pass keeps for the core's tile, with TPU layout padding.
The runtime's own reserve is already out of `TpuType.usable_bytes_per_device`.

What the backward pass keeps is read from the training step the job's engine builds (its real
model_fn, loss and optimizer, `Engine.step_tensors`), not from a model of it: the forward tensors
that the gradient computation's non-elementwise ops read (convolution, matmul and batch-norm
inputs; ReLU outputs and pooling tensors, which XLA could recompute), in the dtype the graph gives
them. Elementwise chains (a loss's sigmoids and products, casts) fuse and are recomputed, so they
keep nothing. The same network written functionally, as a Sequential, as a subclass or as a
hand-written model_fn gets the same estimate; custom layers are seen through. A lower bound
separates "may-fit" (only with XLA rematerialisation: slower) from "does-not-fit": no layout padding,
and ReLU/pooling tensors recomputed. Checked against the published Cloud TPU runs (DESIGN.md
"Memory model"), including XLA's own out-of-memory report for UNet3D 256^3 on one v3 core ("Used 27.90G").

Spatial partitioning: each core keeps its tile of every activation; a convolution's input on a split
axis also holds the halo it reads from the neighbouring tiles ((kernel - 1) * dilation rows, unpadded).

Layout padding: a TPU buffer's two minor dims are padded to (8, 128) tiles. XLA's layout assignment
chooses the dim order of intermediate buffers, so each kept tensor is charged the least-padded order;
padding is real when every axis is small (thin tiles, e.g. a one-channel 3D tile of 32^3: x4).
Charging the channel dim as minor for every tensor contradicts the published runs (RetinaNet 1280^2
x 8 and UNet3D 128^3 x 4 would not fit a v3 core; they do).

TensorFlow is imported only to build the step: once per job and target, symbolically in a throw-away
graph at two examples (no weights are initialised, no step runs), then scaled to the tile.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from tpulaunch.job.schema import Job
from tpulaunch.plan import partition as rules
from tpulaunch.plan.auto import main_feature as _main_of, suggest_dims as _suggest_dims

if TYPE_CHECKING:
    from tpulaunch.plan.build import Plan

GiB = 1024 ** 3

# The optimizer's memory is counted in the step the engine builds: the slot variables its optimizer made
# (`StepTensors.optimizer_bytes`). Only where a build could not count them is it assumed, from
# model.optimizer.name, and said to be an assumption: v1 optimizer slot variables per weight
# (tensorflow/python/training/*.py `_create_slots`).
OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2, "adagrad": 1, "rmsprop": 2}
# An optimizer given as an import path: assume Adam's two slots (the common worst case).
UNKNOWN_OPTIMIZER_SLOTS = 2
COUNTED = "counted"  # MemoryPlan.optimizer_source: the slot variables of the built step's optimizer

# Spatial partitioning's efficiency: 2560^2 x 8 per replica on 8 cores took 822 ms a step, against
# 910 ms for 1280^2 x 8 on one core (4x the pixels on 8x the cores: ideal 455 ms): 455 / 822 = 0.55.
PARTITION_EFFICIENCY = 0.55

# "fits with large headroom": the estimate uses at most this share of the usable memory.
HEADROOM_SHARE = 0.5

VERDICTS = ("fits", "may-fit", "does-not-fit")

# ------------------------------------------------------------------------------------ small rules
def optimizer_slots(name: str, args: Optional[Mapping] = None) -> int:
    """Slot variables per weight of the job's v1 optimizer (RMSProp centered keeps one more)."""
    args = args or {}
    if name not in OPTIMIZER_SLOTS:
        return UNKNOWN_OPTIMIZER_SLOTS
    slots = OPTIMIZER_SLOTS[name]
    if name == "rmsprop" and args.get("centered"):
        slots += 1
    return slots


def assumed_source(name: str) -> str:
    """How an assumed slot count was reached (MemoryPlan.optimizer_source), said as the assumption it is."""
    if name in OPTIMIZER_SLOTS:
        return f"assumed from model.optimizer.name {name!r}: the built step's slots could not be counted"
    return (f"assumed: {UNKNOWN_OPTIMIZER_SLOTS} per weight (Adam's) for {name!r}: the built step's slots could "
            "not be counted")


def optimizer_memory(job: Job, shapes) -> tuple:
    """(the optimizer's bytes, slots per weight, how they were found) for one step's `shapes`: counted from the
    slot variables its optimizer made, else assumed from model.optimizer.name (and said to be)."""
    counted = getattr(shapes, "optimizer_bytes", None)
    if counted is not None:
        slots = counted / (shapes.trainable_params * 4) if shapes.trainable_params else 0
        return counted, (int(round(slots)) if abs(slots - round(slots)) < 0.005 else round(slots, 2)), COUNTED
    slots = optimizer_slots(job.model.optimizer.name, job.model.optimizer.args)
    return shapes.trainable_params * 4 * slots, slots, assumed_source(job.model.optimizer.name)


padded_elements = rules.padded_elements


# ----------------------------------------------------------------------- what the training step keeps
_SHAPES_CACHE: dict = {}

# The engine's step builder (`Engine.step_tensors(job, use_tpu=...)`): what one training step keeps, from the
# graph the engine builds. The memory plan is given it; it never looks an engine up.
BuildStep = Callable[..., Any]


def step_shapes(job: Job, build_step: BuildStep, *, use_tpu: bool):
    """What one training step of `job` keeps for its backward pass, read from the graph its engine builds
    (`build_step`): per example, with dtypes and convolution halos. Cached per job, engine and target."""
    # The step depends on the model (and which of its loss, optimizer and metrics the job sets: a compiled model keeps
    # its own for the others), the data specs and the flags, not on batch sizes or the slice.
    key = (job.model_dump_json(include={"model", "data", "flags"}), job.model.set_in_job(), tuple(job.search_path),
           use_tpu,
           getattr(build_step, "__qualname__", repr(build_step)))
    if key not in _SHAPES_CACHE:
        _SHAPES_CACHE[key] = build_step(job, use_tpu=use_tpu)
    return _SHAPES_CACHE[key]


# ------------------------------------------------------------------------------------ the estimate
@dataclass(frozen=True)
class Tile:
    """What one core computes: `batch` examples of `shape` (the main feature's per-core piece)."""

    batch: int
    shape: tuple  # per example, no batch dim
    cores_per_replica: int
    dims: Optional[tuple]  # the main feature's partition dims (batch first), None = unpartitioned


@dataclass(frozen=True)
class MemoryEstimate:
    tile: Tile
    params: int
    optimizer_slots: float  # slot variables per trainable weight (an int where they are whole)
    weights: int
    gradients: int
    optimizer: int
    bf16_weights: int
    activations: int  # unpadded
    padding: int  # what (8, 128) layout tiles add to the activations
    lower_bound: int  # unpadded, with activation and pooling outputs rematerialised
    method: str  # "built at tile" | "scaled from <shape>"
    optimizer_source: str = COUNTED  # or the assumption made (`assumed_source`)

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.bf16_weights + self.activations + self.padding

    @property
    def breakdown(self) -> dict:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "bf16_weights": self.bf16_weights, "activations": self.activations, "padding": self.padding}


def verdict(total: int, lower_bound: int, usable: int) -> str:
    """"fits", "may-fit" (only with XLA rematerialisation: slower) or "does-not-fit"."""
    if total <= usable:
        return "fits"
    return "may-fit" if lower_bound <= usable else "does-not-fit"


def main_feature(job: Job) -> str:
    """The feature whose shape drives the model: the only one, else the largest."""
    return _main_of(job.data.features)


def tile_for(job: Job, per_replica_batch: int, dims: Optional[Sequence[int]], cores_per_replica: int) -> Tile:
    """The largest piece one core receives of the main feature (TF's uneven split)."""
    spec = job.data.features[main_feature(job)]
    shape = [per_replica_batch] + list(spec.shape)
    if dims and math.prod(dims) > 1:
        piece = max(rules.piece_shapes(shape, dims), key=math.prod)
        return Tile(piece[0], tuple(piece[1:]), cores_per_replica, tuple(dims))
    return Tile(per_replica_batch, tuple(spec.shape), cores_per_replica, None)


def _builder_takes_input_shape(job: Job) -> bool:
    import inspect

    from tpulaunch.job.imports import resolve

    if not job.model.builder:
        return False
    try:
        builder = resolve(job.model.builder, search_path=job.search_path, what="model builder")
        return "input_shape" in inspect.signature(builder).parameters
    except (TypeError, ValueError):
        return False


def at_tile(job: Job, tile_shape: tuple) -> Job:
    """The job with its main feature declared at the tile's shape, and each label that shares the feature's
    spatial axes (a per-voxel mask) at the same spatial size: the step one core computes."""
    name = main_feature(job)
    feature = job.data.features[name]
    spatial, tile_spatial = list(feature.shape[:-1]), list(tile_shape[:-1])
    labels = {}
    for label_name, label in job.data.labels.items():
        shape = list(label.shape)
        if spatial and shape[:len(spatial)] == spatial:
            shape = tile_spatial + shape[len(spatial):]
        labels[label_name] = label.model_copy(update={"shape": shape})
    features = dict(job.data.features, **{name: feature.model_copy(update={"shape": list(tile_shape)})})
    data = job.data.model_copy(update={"features": features, "labels": labels})
    return job.model_copy(update={"data": data})


def shapes_for_tile(job: Job, tile: Tile, build_step: BuildStep) -> tuple:
    """(StepTensors, method): the step built at the tile when the builder takes `input_shape` (and the model
    builds there), else built at the declared shapes and scaled to the tile."""
    use_tpu = job.on_tpu
    if len(job.data.features) == 1 and _builder_takes_input_shape(job):
        try:
            return step_shapes(at_tile(job, tuple(tile.shape)), build_step, use_tpu=use_tpu), "built at tile"
        except Exception:  # noqa: BLE001 (e.g. a tile the model's pyramid cannot divide: scale the declared build)
            pass
    reference = tuple(job.data.features[main_feature(job)].shape)
    return step_shapes(job, build_step, use_tpu=use_tpu), f"scaled from {list(reference)}"


def _scaled(shape: tuple, built: tuple, target: tuple) -> tuple:
    """A kept tensor's shape for input `target`, from a model built for input `built`.

    Tensors of the input's rank scale axis by axis (spatial axes; channels stay); others (e.g.
    per-anchor outputs) scale their largest axis by the total spatial factor.
    """
    if tuple(built) == tuple(target):
        return shape
    factors = [t / b for b, t in zip(built[:-1], target[:-1])]
    if len(shape) == len(built):
        return tuple(max(1, math.ceil(d * f)) for d, f in zip(shape[:-1], factors)) + (shape[-1],)
    if not shape:
        return shape
    axis = max(range(len(shape)), key=lambda i: shape[i])
    out = list(shape)
    out[axis] = max(1, math.ceil(shape[axis] * math.prod(factors)))
    return tuple(out)


def _with_halo(shape: tuple, halo: tuple, split: Sequence[int]) -> tuple:
    """A convolution input on a split spatial axis also holds its halo from the neighbouring tiles."""
    if not halo or not split or len(halo) != len(shape) - 1:
        return shape
    return tuple(d + h if ways > 1 else d for d, h, ways in zip(shape[:-1], halo, split)) + (shape[-1],)


def estimate(job: Job, tile: Tile, shapes=None, method: Optional[str] = None,
             build_step: Optional[BuildStep] = None) -> MemoryEstimate:
    """The per-core memory of one training step of `job` for `tile`.

    Args:
        job: a job with `model.builder` (a Keras builder).
        tile: the per-core batch and piece.
        shapes: the model's shapes to scale from (default: built for the tile, or the declared shape).
        method: how `shapes` relate to the tile (for the report).
        build_step: the engine's step builder, when `shapes` must be built.
    """
    if shapes is None:
        shapes, method = shapes_for_tile(job, tile, build_step)
    elif method is None:
        method = f"scaled from {list(shapes.input_shape)}"
    activations = padded = required = 0
    split = tile.dims[1:1 + len(tile.shape) - 1] if tile.dims else ()  # ways per spatial axis
    for kept in shapes.kept:
        shape = (tile.batch,) + _scaled(kept.shape, shapes.input_shape, tile.shape)
        # The halo rows are exchanged slices next to the tile, charged unpadded on top of it.
        halo = math.prod((tile.batch,) + _with_halo(shape[1:], kept.halo, split)) - math.prod(shape)
        size = kept.bytes_per_element
        activations += (math.prod(shape) + halo) * size
        padded += (padded_elements(shape) + halo) * size
        if kept.required:
            required += (math.prod(shape) + halo) * size
    optimizer, slots, source = optimizer_memory(job, shapes)
    weights = shapes.params * 4
    gradients = shapes.trainable_params * 4
    bf16 = shapes.params * 2 if job.model.precision != "float32" else 0
    fixed = weights + gradients + optimizer + bf16
    return MemoryEstimate(tile, shapes.params, slots, weights, gradients, optimizer, bf16, activations,
                          padded - activations, fixed + required, method, source)


# ------------------------------------------------------------------------------ recommendations
def suggest_dims(job: Job, cores: int, per_replica_batch: int) -> Optional[tuple]:
    """Partition dims of the main feature over `cores`: the largest spatial axes first."""
    return _suggest_dims(job.data.features, cores, per_replica_batch)


def smallest_fitting_partition(job: Job, devices: int, usable: int, per_replica_batch: int,
                               start: int = 1, shapes=None, build_step: Optional[BuildStep] = None) -> Optional[dict]:
    """The fewest cores per replica (and their dims) whose estimate fits, keeping the per-replica batch.

    Candidates are TF's valid cores_per_replica values that divide the slice; each is first sized by
    scaling `shapes` (fast), and the chosen one is confirmed with an estimate built for its tile.
    """
    for cores in rules.VALID_CORES_PER_REPLICA:
        if cores < start or cores > devices or devices % cores:
            continue
        dims = suggest_dims(job, cores, per_replica_batch) if cores > 1 else None
        if cores > 1 and dims is None:
            continue
        tile = tile_for(job, per_replica_batch, dims, cores)
        quick = estimate(job, tile, shapes, build_step=build_step)
        if quick.total > usable * 1.05:
            continue
        # Scaling is close (a few %); build the model for the tile only when it is close to the line.
        exact = quick if quick.total < usable * 0.9 else estimate(job, tile, build_step=build_step)
        if exact.total <= usable:
            return {"cores_per_replica": cores, "dims": {main_feature(job): list(dims) if dims else None},
                    "per_core_bytes": exact.total, "tile": [tile.batch, *tile.shape]}
    return None


def largest_batch(job: Job, tile: Tile, usable: int, shapes) -> int:
    """The largest per-core batch whose estimate still fits (binary search: memory grows with the batch).

    Padding per example can shrink as the batch grows (the batch becomes a well-filled layout dim),
    so the unpadded size bounds the search from above.
    """
    def total(batch: int) -> int:
        return estimate(job, Tile(batch, tile.shape, tile.cores_per_replica, tile.dims), shapes).total

    one = estimate(job, Tile(1, tile.shape, tile.cores_per_replica, tile.dims), shapes)
    fixed = one.total - one.activations - one.padding
    low, high = 1, max(1, (usable - fixed) // max(1, one.activations))
    while low < high:
        middle = (low + high + 1) // 2
        if total(middle) <= usable:
            low = middle
        else:
            high = middle - 1
    return int(low)


def _smaller_batch(job: Job, tile: Tile, usable: int, shapes, devices: int, cores: int) -> Optional[dict]:
    """The largest per-core batch below the tile's that fits, as a recommendation; None if even one example does not."""
    if tile.batch <= 1 or estimate(job, Tile(1, tile.shape, cores, tile.dims), shapes).total > usable:
        return None
    best = min(largest_batch(job, tile, usable, shapes), tile.batch - 1)
    per_replica = best * (tile.dims[0] if tile.dims else 1)  # a split batch axis multiplies it back
    return {"action": "reduce-batch", "per_replica_batch": per_replica, "global_batch": per_replica * (devices // cores),
            "per_core_bytes": estimate(job, Tile(best, tile.shape, cores, tile.dims), shapes).total}


def partition_cost(cores: int) -> dict:
    """Expected cost of spatial partitioning over `cores` (from the published step times)."""
    efficiency = 1.0 if cores <= 1 else PARTITION_EFFICIENCY
    return {"efficiency": efficiency, "core_time_per_example": round(1 / efficiency, 2)}


# ----------------------------------------------------------------------------------- the section
@dataclass
class MemoryPlan:
    """The `memory` section of `tpulaunch plan` (`to_dict` is the JSON contract)."""

    verdict: str  # fits | may-fit | does-not-fit | unknown
    per_core_bytes: Optional[int]
    usable_bytes: Optional[int]
    breakdown: dict = field(default_factory=dict)
    recommendation: Optional[dict] = None
    lower_bound_bytes: Optional[int] = None
    tile: Optional[list] = None  # [batch, *piece] of the main feature on one core
    feature: Optional[str] = None
    params: Optional[int] = None
    optimizer_slots: Optional[float] = None
    optimizer_source: Optional[str] = None  # "counted" (the built step's slot variables), or the assumption made
    precision: Optional[str] = None
    method: Optional[str] = None
    auto_partition: Optional[dict] = None  # the dims `partition: auto` chose
    reason: Optional[str] = None  # why the verdict is unknown
    xla: Optional[dict] = None  # plan --xla: XLA's CPU buffer assignment for one step (float32)
    # XLA's TPU compiler's answer for the step on the job's slice (`plan/xla_tpu.py`), or why the estimate answered
    xla_tpu: Optional[dict] = None
    answered_by: str = "estimate"  # "xla" when XLA's TPU compiler gave the verdict
    estimate_verdict: Optional[str] = None  # the estimate's own verdict, where XLA's replaced it

    def to_dict(self) -> dict:
        return asdict(self)


def plan_memory(job: Job, plan: "Plan", build_step: BuildStep) -> MemoryPlan:
    """The memory section for a valid job on its plan: estimate, verdict and recommendation (builds the model's
    shapes with the engine's `build_step`)."""
    spec = job.data.features[main_feature(job)]
    if not spec.is_static:
        return MemoryPlan("unknown", None, None, reason="the feature's shape has unknown dims")
    cores = plan.cores_per_replica
    devices = plan.slice.devices if plan.slice else None
    batch = plan.per_replica_batch
    auto = plan.to_dict()["partition"]
    fed = plan.feed_partition.features.get(main_feature(job)) if plan.feed_partition else None
    dims = tuple(fed) if fed and math.prod(fed) > 1 else None
    tile = tile_for(job, batch, dims, cores)
    try:
        shapes, method = shapes_for_tile(job, tile, build_step)
    except Exception as exc:  # noqa: BLE001 (a user's builder can fail any way; plan reports it, not crash)
        if isinstance(exc, ImportError) and exc.name in ("tensorflow", "keras"):
            reason = "TensorFlow is not installed: install tpulaunch[cpu] (or use plan --no-memory)"
        else:
            from tpulaunch.errors import TpuLaunchError

            # A located build error already names the key and the error; anything else gets its type.
            said = exc.message if isinstance(exc, TpuLaunchError) else f"{type(exc).__name__}: {exc}"
            reason = f"building the model failed: {said}"
        return MemoryPlan("unknown", None, None, reason=reason)
    est = estimate(job, tile, shapes, method)
    common = dict(breakdown=est.breakdown, lower_bound_bytes=est.lower_bound, tile=[tile.batch, *tile.shape],
                  feature=main_feature(job), params=est.params, optimizer_slots=est.optimizer_slots,
                  optimizer_source=est.optimizer_source,
                  precision=job.model.precision, method=method, auto_partition=auto)
    if plan.slice is None:
        return MemoryPlan("unknown", est.total, None, reason="runs locally: no TPU memory to compare against", **common)
    usable = plan.slice.usable_bytes_per_device
    result = verdict(est.total, est.lower_bound, usable)
    recommendation = None
    if result != "fits":
        # First the largest per-core batch that fits (full speed), then spatial partitioning at this batch
        # (with its cost): partitioning first only when even one example per core does not fit.
        partition = None
        found = smallest_fitting_partition(job, devices, usable, batch, start=cores + 1, shapes=shapes,
                                           build_step=build_step)
        if found:
            replicas = devices // found["cores_per_replica"]
            partition = dict(found, action="partition", per_replica_batch=batch, global_batch=batch * replicas,
                             cost=partition_cost(found["cores_per_replica"]))
        smaller = _smaller_batch(job, tile, usable, shapes, devices, cores)
        if smaller is not None:
            recommendation = dict(smaller, alternative=partition)
        elif partition is not None:
            recommendation = partition
        else:
            recommendation = {"action": "none", "reason": f"no cores_per_replica up to {devices} fits at "
                                                          f"{batch} examples per replica; reduce the batch or the input"}
    elif est.total <= usable * HEADROOM_SHARE:  # large headroom: the largest batch that fits
        best = largest_batch(job, tile, usable, shapes)
        if best > tile.batch:
            per_replica = best * (tile.dims[0] if tile.dims else 1)  # a split batch axis multiplies it back
            recommendation = {"action": "batch", "per_replica_batch": per_replica,
                              "global_batch": per_replica * (devices // cores),
                              "per_core_bytes": estimate(job, Tile(best, tile.shape, cores, tile.dims), shapes).total}
    return MemoryPlan(result, est.total, usable, recommendation=recommendation, **common)


# ------------------------------------------------------------------------ XLA's own figure (plan --xla)
XLA_TIMEOUT_S = 900


def step_request(job: Job, tile: Tile, slots: Optional[float] = None) -> dict:
    """What the step child builds: the job's model (its builder and arguments, at the tile's shape when the
    builder takes `input_shape`), the batch, and the optimizer's slot variables per weight (the memory plan's
    count; default: assumed from its name)."""
    from tpulaunch.job.builder_args import builder_kwargs
    from tpulaunch.job.imports import resolve

    kwargs = builder_kwargs(resolve(job.model.builder, search_path=job.search_path, what="model builder"),
                            job.model.params, job.data.features)
    if len(job.data.features) == 1 and _builder_takes_input_shape(job):
        kwargs["input_shape"] = list(tile.shape)
    return {"builder": job.model.builder, "kwargs": kwargs, "batch": tile.batch, "search_path": job.search_path,
            "slots": int(round(slots)) if slots is not None else optimizer_slots(job.model.optimizer.name,
                                                                                  job.model.optimizer.args)}


def run_step_child(request: dict, timeout: int = XLA_TIMEOUT_S) -> dict:
    """Run the step child (`_xla_child`) on `request`; its JSON answer, with the seconds it took.

    The step is built in a child process: XLA reads its flags once per process, and the job's model is built
    in a graph of its own that nothing in this process keeps.

    Raises:
        RuntimeError: the child failed or answered nothing.
    """
    import json
    import subprocess
    import sys
    import time

    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", "from tpulaunch.plan.memory import _xla_child; _xla_child()"],
                          input=json.dumps(request), capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        said = (done.stderr or done.stdout).strip().splitlines()
        # TensorFlow's own words for an op XLA has no kernel for, else the traceback's end.
        unsupported = [line for line in said if "Detected unsupported operations" in line]
        raise RuntimeError("XLA compile failed: " + (unsupported[0].split(": ", 1)[-1][:400] if unsupported
                                                     else " | ".join(said[-3:])))
    result = json.loads(lines[-1])
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def xla_step_bytes(job: Job, tile: Tile, timeout: int = XLA_TIMEOUT_S, slots: Optional[float] = None) -> dict:
    """XLA's buffer-assignment total for one training step of the job's model on the tile, on the CPU.

    A cross-check, not a TPU number: float32 only, CPU layouts (no (8, 128) tiles). The step is
    compiled (never run) in a child process, because XLA reads its dump flags once per process.

    `slots`: the optimizer's slot variables per weight (the memory plan's count; default: assumed from its name).

    Returns:
        {"total_bytes", "input_shape" (per example, as built), "seconds"}.

    Raises:
        RuntimeError: the compile failed or wrote no buffer assignment.
    """
    return run_step_child(step_request(job, tile, slots), timeout)


def _xla_child() -> None:
    """Child process of `run_step_child`: request JSON on stdin, result JSON on stdout. A request with
    "export" writes the functional step's HLO for XLA's TPU compiler (`plan/xla_export.py`); else the CPU
    buffer-assignment total."""
    import json
    import shutil
    import sys
    import tempfile

    from tpulaunch.tf_env import skip_collection_at_exit

    skip_collection_at_exit()
    request = json.load(sys.stdin)
    if request.get("exporter"):  # an engine that lowers its own step (`EngineAbout.step_exporter`)
        from tpulaunch.seam.about import load_attribute

        print(json.dumps(load_attribute(request["exporter"])(request)), flush=True)
        return
    if request.get("export"):
        from tpulaunch.plan.xla_export import export_step, set_precision

        set_precision(request.get("precision", "float32"))  # before the model's layers are made
        print(json.dumps(export_step(request, _child_model(request))), flush=True)
        return
    dump = tempfile.mkdtemp(prefix="tpulaunch-xla-")
    try:
        _xla_step(request, dump)
    finally:  # XLA's dump is this child's scratch: nothing of it stays, however the step ends
        shutil.rmtree(dump, ignore_errors=True)


def _child_model(request: dict):
    """The job's model, built by its builder in the step child."""
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tpulaunch.job.imports import resolve

    return resolve(request["builder"], search_path=request["search_path"], what="model builder")(**request["kwargs"])


def _xla_step(request: dict, dump: str) -> None:
    """Build one training step with XLA, dumping into `dump`; print XLA's buffer total as JSON."""
    import glob
    import json
    import os
    import re

    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump}").strip()
    import tensorflow as tf

    model = _child_model(request)
    weights = model.trainable_weights
    slots = [[tf.Variable(tf.zeros_like(w), trainable=False) for w in weights] for _ in range(request["slots"])]

    @tf.function(jit_compile=True)
    def step(*inputs):
        with tf.GradientTape() as tape:
            outputs = model(list(inputs) if len(inputs) > 1 else inputs[0], training=True)
            # Any scalar of every output makes the backward pass keep what the real loss would.
            loss = tf.add_n([tf.reduce_mean(tf.square(tf.cast(o, tf.float32))) for o in tf.nest.flatten(outputs)])
        grads = tape.gradient(loss, weights)
        for i, (w, g) in enumerate(zip(weights, grads)):
            for slot in slots:
                slot[i].assign(0.9 * slot[i] + g)
            w.assign_sub(0.01 * (slots[0][i] if slots else g))
        return loss

    specs = [tf.TensorSpec([request["batch"], *t.shape[1:]], t.dtype) for t in tf.nest.flatten(model.inputs)]
    step.experimental_get_compiler_ir(*specs)(stage="optimized_hlo")
    totals = []
    for path in glob.glob(os.path.join(dump, "*buffer-assignment.txt")):
        with open(path) as f:
            found = re.search(r"Total bytes used: (\d+)", f.read())
        if found:
            totals.append(int(found.group(1)))
    if not totals:
        raise SystemExit("no buffer assignment was written")
    input_shape = [int(d) for d in tf.nest.flatten(model.inputs)[0].shape[1:]]
    print(json.dumps({"total_bytes": max(totals), "input_shape": input_shape}))


def add_memory(plan: "Plan", job: Job, build_step: BuildStep, xla: bool = False) -> "Plan":
    """Add the per-core memory section (builds the model's layer shapes with the engine's `build_step`).

    With `xla`, also XLA's own buffer-assignment total for one training step on the CPU (slow). XLA's TPU
    compiler's answer is added by `plan/xla_tpu.py`'s `add_xla_answer`.
    """
    section = plan_memory(job, plan, build_step)
    if xla and section.tile is not None:
        tile = Tile(section.tile[0], tuple(section.tile[1:]), 1, None)
        try:
            section.xla = xla_step_bytes(job, tile, slots=section.optimizer_slots)
        except (RuntimeError, OSError) as exc:
            section.xla = {"error": str(exc)}
        except Exception as exc:  # noqa: BLE001 (subprocess timeout and friends: reported, not fatal)
            section.xla = {"error": f"{type(exc).__name__}: {exc}"}
    plan.memory = section.to_dict()
    return plan
