"""`tpulaunch plan`: how a valid job lands on its slice. Pure Python, no TensorFlow.

Job -> Plan: the slice (devices, hosts, replicas), the batch arithmetic, and for every input tensor
its partition dims and the piece each core receives (TF's own uneven split), with bytes per piece
unpadded and padded to the TPU's (8, 128) layout tiles. `partition: auto` is shown as the dims it
resolves to. The per-core memory estimate (`tpulaunch.plan.memory`, which needs TensorFlow to build the
model's shapes) is added by `add_memory`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

from tpulaunch.plan import partition as rules
from tpulaunch.checks.static import layout_of, per_replica_batch, tpu_type_of
from tpulaunch.job.schema import DTYPE_BYTES, Job
from tpulaunch.job.load import LoadedJob

# A piece whose (8,128)-padded layout is this many times its real size is worth a warning.
PADDING_WARN_FACTOR = 4.0


@dataclass(frozen=True)
class TensorPlan:
    group: str  # "features" | "labels"
    name: str
    dtype: str
    shape: list  # per replica, batch dim first
    dims: Optional[list]  # None = replicated to every core of the replica
    sharding: str  # "tiled" | "replicated" | "core0"
    piece: list  # the largest piece one core receives
    pieces: list  # every core's piece, in logical core order
    even: bool
    piece_bytes: int
    piece_bytes_padded: int

    @property
    def padding_factor(self) -> float:
        return self.piece_bytes_padded / self.piece_bytes if self.piece_bytes else 1.0


@dataclass(frozen=True)
class SlicePlan:
    tpu_type: str
    generation: str
    devices: int
    chips: int
    hosts: int
    devices_per_host: int
    cores_per_replica: int
    replicas: int
    replicas_per_host: int
    input_fn_calls_per_host: int
    usable_bytes_per_device: int


@dataclass(frozen=True)
class BatchPlan:
    split: str
    global_batch: int
    per_replica: int
    per_host: int  # what one host's input pipeline produces per step (over its input_fn calls)
    params_batch_size: int  # what TPUEstimator passes as params['batch_size'] (PER_HOST_V2)


@dataclass
class Plan:
    job: str
    on_tpu: bool
    slice: Optional[SlicePlan]
    batches: list
    tensors: list
    warnings: list = field(default_factory=list)  # Problems (validate's warnings + plan's own)
    memory: Optional[dict] = None  # the memory section (MemoryPlan.to_dict()), when asked for
    partition: Optional[dict] = None  # the dims `partition: auto` chose, {"features": ..., "labels": ...}

    def to_dict(self) -> dict:
        return {
            "job": self.job,
            "on_tpu": self.on_tpu,
            "slice": asdict(self.slice) if self.slice else None,
            "batches": [asdict(b) for b in self.batches],
            "tensors": [dict(asdict(t), padding_factor=round(t.padding_factor, 2)) for t in self.tensors],
            "warnings": [w.to_dict() for w in self.warnings],
            "partition": self.partition,
            "memory": self.memory,
        }


def _sharding(dims) -> str:
    if dims is None:
        return "replicated"
    return "core0" if math.prod(dims) == 1 else "tiled"


def resolved_partition(job: Job, per_replica: int):
    """The job's Partition, with `partition: auto` replaced by the dims it chooses (None if it cannot)."""
    if job.partition != "auto":
        return job.partition
    from tpulaunch.plan.memory import auto_partition

    cores = job.tpu.cores_per_replica if job.tpu else 1
    return auto_partition(job.data.features, job.data.labels, cores, per_replica)


def tensor_plans(job: Job, per_replica: int) -> list:
    """Per-tensor pieces for one replica (every replica gets the same)."""
    out = []
    part = resolved_partition(job, per_replica)
    for group in ("features", "labels"):
        dims_by_name = getattr(part, group) if part else {}
        for name, spec in getattr(job.data, group).items():
            if not spec.is_static:
                continue
            shape = [per_replica] + list(spec.shape)
            dims = dims_by_name.get(name) if job.on_tpu else None
            sharding = _sharding(dims)
            if sharding == "tiled":
                pieces = [list(p) for p in rules.piece_shapes(shape, dims)]
            else:
                pieces = [list(shape)]  # replicated: each core a full copy; core0: core 0 only
            piece = list(max(pieces, key=math.prod))  # the largest piece, as memory.py takes it
            unpadded, padded = rules.layout_padding(piece, DTYPE_BYTES[spec.dtype])
            out.append(TensorPlan(group, name, spec.dtype, shape, list(dims) if dims else None, sharding, piece, pieces,
                                  even=all(p == pieces[0] for p in pieces), piece_bytes=unpadded, piece_bytes_padded=padded))
    return out


def build_plan(loaded: LoadedJob, problems=()) -> Plan:
    """The plan for a job that validated (`loaded.job` is set)."""
    job = loaded.job
    assert job is not None, "plan needs a valid job"
    layout = layout_of(loaded)
    tpu_type = tpu_type_of(loaded)
    slice_plan = None
    if job.tpu is not None and layout is not None and tpu_type is not None:
        slice_plan = SlicePlan(
            tpu_type=tpu_type.name, generation=tpu_type.generation.name, devices=tpu_type.devices, chips=tpu_type.chips,
            hosts=tpu_type.hosts, devices_per_host=tpu_type.devices_per_host, cores_per_replica=layout.cores_per_replica,
            replicas=layout.replicas, replicas_per_host=layout.replicas_per_host,
            input_fn_calls_per_host=layout.input_fn_calls_per_host,
            usable_bytes_per_device=tpu_type.usable_bytes_per_device,
        )
    replicas = layout.replicas if layout else 1
    # PER_HOST_V2: each input_fn call feeds one replica; a host holding replica starts makes this many
    calls_per_host = layout.input_fn_calls_per_host if layout else 1
    batches = []
    for split in ("train", "eval"):
        spec = getattr(job, split)
        if spec is None:
            continue
        per_replica = max(1, spec.batch_size // replicas)
        batches.append(BatchPlan(split, spec.batch_size, per_replica, per_host=per_replica * calls_per_host,
                                 params_batch_size=per_replica))
    per_replica = per_replica_batch(loaded, "train") or per_replica_batch(loaded, "eval") or 1
    tensors = tensor_plans(job, per_replica)
    warnings = [p for p in problems if not p.is_error]
    if job.on_tpu:
        for t in tensors:
            if t.padding_factor >= PADDING_WARN_FACTOR:
                path = ("partition", t.group, t.name) if t.dims else ("data", t.group, t.name)
                warnings.append(loaded.problem(
                    path, "layout-padding-waste",
                    f"each core's piece of '{t.name}' {_fmt_shape(t.piece)} takes {t.padding_factor:.0f}x its size in TPU memory: "
                    "the two minor dimensions are padded to (8, 128) layout tiles",
                    "keep the last dims large (e.g. fold small channel counts into the spatial dims, or partition a major axis instead)",
                    severity="warning"))
    chosen = None
    if job.partition == "auto":
        resolved = resolved_partition(job, per_replica)
        chosen = {"features": resolved.features, "labels": resolved.labels} if resolved else None
    return Plan(job.name, job.on_tpu, slice_plan, batches, tensors, warnings, partition=chosen)


def add_memory(plan: Plan, job: Job, xla: bool = False) -> Plan:
    """Add the per-core memory section (builds the model's layer shapes with TensorFlow).

    With `xla`, also XLA's own buffer-assignment total for one training step on the CPU (slow).
    """
    from tpulaunch.plan import memory

    section = memory.plan_memory(job)
    if xla and section.tile is not None:
        tile = memory.Tile(section.tile[0], tuple(section.tile[1:]), 1, None)
        try:
            section.xla = memory.xla_step_bytes(job, tile)
        except (RuntimeError, OSError) as exc:
            section.xla = {"error": str(exc)}
        except Exception as exc:  # noqa: BLE001 (subprocess timeout and friends: reported, not fatal)
            section.xla = {"error": f"{type(exc).__name__}: {exc}"}
    plan.memory = section.to_dict()
    return plan


def _fmt_shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"
