"""The Plan: how a valid job lands on its target, computed once and handed to everything downstream.

Job -> Plan: the slice (devices, hosts, replicas), the batch arithmetic (global, per replica, per
host, per `input_fn` call), the partition the engine feeds (`partition: auto` resolved here and
nowhere else) and, for every input tensor, the piece each core receives (TF's own uneven split)
with its bytes unpadded and padded to the TPU's (8, 128) layout tiles. Pure Python, no TensorFlow.
The engine, the memory estimate, explain, the TensorFlow oracle and the reports read these numbers
from the Plan; the checks use the same functions on the sections that validated.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Optional

from tpulaunch.seam import registry
from tpulaunch.job.schema import DTYPE_BYTES, Job, Partition
from tpulaunch.plan import partition as rules
from tpulaunch.plan.auto import auto_partition
from tpulaunch.plan.mesh import DeviceMesh, device_mesh
from tpulaunch.tpu.types import TpuType, lookup


# ------------------------------------------------------------------------------- the arithmetic

def tpu_type_for(tpu) -> Optional[TpuType]:
    """What the job trains on: the accelerator type of a `tpu:` section, times `tpu.slices` (a multislice run's
    devices, chips and hosts are all its slices'), or None (no section, or a name no generation offers)."""
    found = lookup(tpu.type) if tpu is not None else None
    slices = getattr(tpu, "slices", 1) or 1
    if found is None or slices == 1:
        return found
    return replace(found, name=f"{found.name} x {slices}", chips=found.chips * slices, cores=found.cores * slices,
                   devices=found.devices * slices, hosts=found.hosts * slices)


def layout_for(tpu) -> Optional[rules.SliceLayout]:
    """How replicas sit on the slice of a `tpu:` section, or None when there is none or it is impossible."""
    tpu_type = tpu_type_for(tpu)
    if tpu_type is None or tpu.cores_per_replica not in rules.VALID_CORES_PER_REPLICA:
        return None
    layout = rules.slice_layout(tpu_type.devices, tpu_type.hosts, tpu.cores_per_replica)
    return None if isinstance(layout, list) else layout


def per_replica(global_batch: int, layout: Optional[rules.SliceLayout]) -> int:
    """One replica's share of a global batch (TPUEstimator's `params['batch_size']` under PER_HOST_V2)."""
    return max(1, global_batch // (layout.replicas if layout else 1))


def device_cores(partition) -> int:
    """The devices one replica spans on this machine (no TPU) for an engine that splits inputs over them: the
    largest product of partition:'s dims (1 for `partition: auto`, which needs tpu.cores_per_replica)."""
    if not isinstance(partition, Partition):
        return 1
    groups = (partition.features, partition.labels)
    return max([math.prod(dims) for group in groups for dims in group.values() if dims], default=1)


def resolve_partition(partition, features, labels, cores_per_replica: int, per_replica_batch: int, *,
                      even: bool = False) -> Optional[Partition]:
    """The dims each tensor is fed with: the job's own, or what `partition: auto` chooses (None if it cannot;
    `even`: only even splits, for the keras engine)."""
    if partition == "auto":
        return auto_partition(features, labels, cores_per_replica, per_replica_batch, even=even)
    return partition


# ------------------------------------------------------------------------------------ the Plan

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
    per_host: int  # examples one host's input pipeline produces per step (its dataset, dequeued once per replica)
    params_batch_size: int  # what each input_fn call gets as params['batch_size'] (PER_HOST_V2); an engine that
    # batches per replica: the per-replica batch InputContext.get_per_replica_batch_size gives each input pipeline


@dataclass(frozen=True)
class DeviceAssignmentPlan:
    """A TPUStrategy layout (`plan/tpu_layout.py`) and its input pipelines, for an engine whose replica is a
    block of the slice's topology (`EngineAbout.layout.device_assignment`)."""

    logical_devices: int  # per replica (tpu.cores_per_replica)
    computation_shape: list  # DeviceAssignment.build's block, [x, y, z, devices per chip]
    replicas: int
    topology_shape: list  # the slice's mesh
    input_pipelines: int  # distribute_datasets_from_function: one per host that feeds a replica's logical device 0
    replicas_per_pipeline: int


@dataclass(frozen=True)
class LocalDevices:
    """This machine's devices as a local run lays them out (an engine that shards each batch over them itself)."""

    count: int
    platform: str  # the framework's name for them: "cpu", "gpu"
    mesh: DeviceMesh

    def describe(self) -> str:
        return self.mesh.describe(self.count, self.platform)

    def to_dict(self) -> dict:
        return {"count": self.count, "platform": self.platform, "replicas": self.mesh.replicas,
                "mesh": list(self.mesh.shape), "text": self.describe()}


@dataclass
class Plan:
    job: str
    on_tpu: bool
    slice: Optional[SlicePlan]
    batches: list
    tensors: list
    warnings: list = field(default_factory=list)  # validate's warnings, for the report
    memory: Optional[dict] = None  # the memory section (MemoryPlan.to_dict()), when asked for
    feed_partition: Optional[Partition] = None  # the dims the engine feeds; None: no spatial partitioning
    auto_partition: bool = False  # feed_partition was chosen by `partition: auto`
    cores_per_replica: int = 1  # as the job declares it (the checks say whether the slice allows it)
    engine: str = ""  # the engine the plan is for (run.engine, else the installed TensorFlow's): build_plan sets it
    device_assignment: Optional[DeviceAssignmentPlan] = None  # on a TPU, for an engine that assigns devices
    local_devices: Optional[LocalDevices] = None  # on this machine, the devices its run splits batches over

    @property
    def replicas(self) -> int:
        if self.slice:
            return self.slice.replicas
        return self.local_devices.mesh.replicas if self.local_devices else 1

    def batch(self, split: str) -> Optional[BatchPlan]:
        return next((b for b in self.batches if b.split == split), None)

    @property
    def per_replica_batch(self) -> int:
        """The batch one replica's tensors are shaped with: train's, else eval's, else 1."""
        chosen = self.batch("train") or self.batch("eval")
        return chosen.per_replica if chosen else 1

    @property
    def train_batch_size(self) -> int:
        """The global train batch TPUEstimator is built with: train's, else eval's (an evaluate-only job), else 1."""
        chosen = self.batch("train") or self.batch("eval")
        return chosen.global_batch if chosen else 1

    def per_shard(self, split: str, shards: int, over: str) -> int:
        """`split`'s global batch (train's, for an evaluation without a batch of its own) per shard, over `shards`
        pieces an engine finds only when it runs on this machine (its devices or hosts, `over` says which). On a TPU
        the Plan's own replicas divide the batch, checked before the run (`checks/static.check_batches`); this is
        the same rule (`partition.check_batch`), refused with its fix, for what only the run knows."""
        from tpulaunch.errors import TpuLaunchError

        batch = self.batch(split) or self.batch("train")
        for finding in rules.check_batch(split, batch.global_batch, shards):
            raise TpuLaunchError(f"{batch.split}.batch_size {batch.global_batch} does not divide over {over}",
                                 hint=finding.hint, code=finding.code)
        return batch.global_batch // shards

    def device_mesh(self, devices: int, platform: str) -> DeviceMesh:
        """The device mesh of an engine that shards each batch over the devices itself, over the run's `devices`
        (`plan/mesh.py`: from the Plan's replicas on a TPU, from `devices` on this machine, refused there when they
        do not take whole replicas or a batch does not divide over them)."""
        return device_mesh(self, devices, platform)

    @property
    def eval_batch_size(self) -> Optional[int]:
        chosen = self.batch("eval")
        return chosen.global_batch if chosen else None

    def to_dict(self) -> dict:
        chosen = None
        if self.auto_partition and self.feed_partition is not None:
            chosen = {"features": self.feed_partition.features, "labels": self.feed_partition.labels}
        return {
            "job": self.job,
            "engine": self.engine,
            "on_tpu": self.on_tpu,
            "device_assignment": asdict(self.device_assignment) if self.device_assignment else None,
            "local_devices": self.local_devices.to_dict() if self.local_devices else None,
            "slice": asdict(self.slice) if self.slice else None,
            "batches": [asdict(b) for b in self.batches],
            "tensors": [dict(asdict(t), padding_factor=round(t.padding_factor, 2)) for t in self.tensors],
            "warnings": [w.to_dict() for w in self.warnings],
            "partition": chosen,
            "memory": self.memory,
        }


def _sharding(dims) -> str:
    if dims is None:
        return "replicated"
    return "core0" if math.prod(dims) == 1 else "tiled"


def tensor_plans(job: Job, per_replica_batch: int, feed: Optional[Partition]) -> list:
    """Per-tensor pieces for one replica (every replica gets the same)."""
    out = []
    for group in ("features", "labels"):
        dims_by_name = getattr(feed, group) if feed else {}
        for name, spec in getattr(job.data, group).items():
            if not spec.is_static:
                continue
            shape = [per_replica_batch] + list(spec.shape)
            dims = dims_by_name.get(name)
            sharding = _sharding(dims)
            if sharding == "tiled":
                pieces = [list(p) for p in rules.piece_shapes(shape, dims)]
            else:
                pieces = [list(shape)]  # replicated: each core a full copy; core0: core 0 only
            piece = list(max(pieces, key=math.prod))  # the largest piece, as the memory estimate takes it
            unpadded, padded = rules.layout_padding(piece, DTYPE_BYTES[spec.dtype])
            out.append(TensorPlan(group, name, spec.dtype, shape, list(dims) if dims else None, sharding, piece, pieces,
                                  even=all(p == pieces[0] for p in pieces), piece_bytes=unpadded, piece_bytes_padded=padded))
    return out


def build_plan(job: Job, *, local: bool = False, engine: Optional[str] = None) -> Plan:
    """The plan for a job that passed the checks; `local`: for this machine (no TPU, one replica, no partitioning
    but on an engine that splits inputs over this machine's devices, `EngineAbout.layout.partition_on_devices`);
    `engine`: the job's engine as the checks worked it out (None: worked out here, from `run.engine`)."""
    tpu = None if local else job.tpu
    tpu_type = tpu_type_for(tpu)
    layout = layout_for(tpu)
    slice_plan = None
    if layout is not None:
        slice_plan = SlicePlan(
            tpu_type=tpu_type.name, generation=tpu_type.generation.name, devices=tpu_type.devices, chips=tpu_type.chips,
            hosts=tpu_type.hosts, devices_per_host=tpu_type.devices_per_host, cores_per_replica=layout.cores_per_replica,
            replicas=layout.replicas, replicas_per_host=layout.replicas_per_host,
            input_fn_calls_per_host=layout.input_fn_calls_per_host,
            usable_bytes_per_device=tpu_type.usable_bytes_per_device,
        )
    engine = engine or registry.engine_name(job.run)
    about = registry.about(engine)
    assigned = _device_assignment(job, tpu_type) if about.layout.device_assignment and layout is not None else None
    if assigned is not None or (about.layout.batches_per_host and slice_plan is not None):
        # One dataset_fn call per input pipeline (a host), batched per replica, dequeued once per replica it feeds
        # (or, batched per host, its share of the global batch).
        slice_plan = replace(slice_plan, input_fn_calls_per_host=1)
    replicas_per_host = assigned.replicas_per_pipeline if assigned else max(1, layout.replicas_per_host) if layout else 1
    batches = []
    for split in ("train", "eval"):
        spec = getattr(job, split)
        if spec is None:
            continue
        share = per_replica(spec.batch_size, layout)
        host_batch = (spec.batch_size // tpu_type.hosts if about.layout.batches_per_host and tpu is not None
                      else share * replicas_per_host)
        batches.append(BatchPlan(split, spec.batch_size, share, per_host=host_batch,
                                 params_batch_size=host_batch if about.layout.batches_per_host else share))
    cores = tpu.cores_per_replica if tpu is not None else 1
    if tpu is None and about.layout.partition_on_devices:  # its replicas span partition:'s devices on this machine
        cores = device_cores(job.partition)
    plan = Plan(job.name, tpu is not None, slice_plan, batches, [], cores_per_replica=cores, engine=engine,
                device_assignment=assigned)
    if cores > 1 and job.partition is not None:
        plan.feed_partition = resolve_partition(job.partition, job.data.features, job.data.labels, cores,
                                                plan.per_replica_batch, even=about.layout.even_splits)
        plan.auto_partition = job.partition == "auto"
    plan.tensors = tensor_plans(job, plan.per_replica_batch, plan.feed_partition)
    return plan


def on_devices(plan: Plan, job: Job, devices: int, platform: str) -> Plan:
    """A local Plan of an engine that shards each batch over this machine's devices itself (`EngineAbout.
    devices_here`), over the `devices` it finds there: the replicas its device mesh takes (`Plan.device_mesh`), each
    batch per replica and the tensors' pieces at it, as its run splits them. Raises what the run would refuse
    (devices that do not take whole replicas, a batch that does not divide over them)."""
    mesh = plan.device_mesh(devices, platform)
    placed = replace(plan, batches=[replace(b, per_replica=b.global_batch // mesh.replicas) for b in plan.batches],
                     local_devices=LocalDevices(devices, platform, mesh))
    placed.tensors = tensor_plans(job, placed.per_replica_batch, placed.feed_partition)
    return placed


def _device_assignment(job: Job, tpu_type: TpuType) -> Optional[DeviceAssignmentPlan]:
    """The TPUStrategy layout, or None when the slice cannot hold it (validate says why)."""
    from tpulaunch.plan.tpu_layout import strategy_layout

    layout = strategy_layout(job)
    if layout is None:
        return None
    # TPUStrategy feeds each replica through the host of its logical device 0; replicas are packed compactly,
    # so that is every host when a replica fits in one, else one host per replica (`validate --tf` asks TF).
    pipelines = min(tpu_type.hosts, layout.replicas)
    return DeviceAssignmentPlan(layout.logical_devices, list(layout.computation_shape), layout.replicas,
                          list(layout.topology_shape), pipelines, max(1, layout.replicas // pipelines))
