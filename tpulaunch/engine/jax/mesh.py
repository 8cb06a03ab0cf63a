"""Spatial partitioning on the jax engine: from `partition:` and the devices, a device mesh ("batch" x the split
axes) and the Keras 3 distribution over it.

A replica spans `cores` devices: tpu.cores_per_replica on a TPU, the largest product of the partition dims on this
machine's devices (`plan/build.device_cores`); the replicas are the devices over it. The mesh's first axis is
"batch" (one entry per replica), then one axis per split axis of the most split tensor (the image of
`[1, 2, 2, 1]`: two axes of 2). Every input is sharded along "batch" and its own split dims over those axes
(a `NamedSharding`); the variables are replicated. XLA's SPMD partitioner then splits the convolutions
across the split axes, exchanging the halos, which is what TPUEstimator's spatial partitioning does underneath.

Keras 3.15's distributions shard the inputs along the batch only (`DataParallel`, `ModelParallel.get_data_layout`),
so `SpatialParallel` is a `ModelParallel` (empty LayoutMap: every variable replicated) whose data layout also
shards the split dims. Keras asks it by the batch's shape alone, so the layouts are found by each tensor's shape
without the batch dim; two tensors of one shape get the first's (a layout never changes a value, only where it is
computed).

Pure Python at import (its rules run under `validate --static`); Keras and JAX are imported when training starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from tpulaunch.engine.core.build_failures import BuildError

BATCH = "batch"  # the mesh axis along which the replicas split each batch
# Why an uneven split is refused on this engine (plan/tpu_layout.split_findings says where and what would divide).
EVEN_ONLY = ("the jax engine shards an axis into equal pieces only (a JAX NamedSharding; TPUEstimator pads uneven "
             "pieces)")


@dataclass(frozen=True)
class SpatialSplit:
    """What partition: splits: `cores` devices per replica, each split tensor's dims (batch first), and the mesh's
    split axes ((name, size), ...) taken from the most split tensor, `main`."""

    cores: int
    dims: dict  # (group, name) -> dims, for the tensors split over more than one device
    main: str
    axes: tuple

    @property
    def text(self) -> str:
        """2x2 on image"""
        return f"{'×'.join(str(size) for _name, size in self.axes)} on {self.main}"


def spatial_split(feed, cores: int) -> Optional[SpatialSplit]:
    """The split of `feed` (a `Partition`, as the Plan resolved it) over replicas of `cores` devices; None when
    nothing is split."""
    if feed is None or cores <= 1:
        return None
    dims = {(group, name): list(d) for group in ("features", "labels")
            for name, d in getattr(feed, group).items() if d and math.prod(d) > 1}
    if not dims:
        return None
    (_group, main), main_dims = max(dims.items(), key=lambda item: math.prod(item[1]))  # the first of the largest
    axes = tuple((f"{main}_axis{axis}", ways) for axis, ways in enumerate(main_dims) if ways > 1)
    return SpatialSplit(cores, dims, main, axes)


def split_of(plan) -> Optional[SpatialSplit]:
    """The Plan's spatial split (None: data-parallel only)."""
    return None if plan is None else spatial_split(plan.feed_partition, plan.cores_per_replica)


def tensor_axes(dims: Sequence[int], axes: tuple) -> Optional[tuple]:
    """The mesh axes each axis of a tensor split by `dims` is sharded over, batch first (a name, a tuple of names,
    or None), or None when its split dims do not take the mesh's split axes in order (each one a product of
    consecutive ones)."""
    out, taken = [], 0
    for axis, ways in enumerate(dims):
        names, size = [BATCH] if axis == 0 else [], 1
        while size < ways and taken < len(axes):
            names.append(axes[taken][0])
            size *= axes[taken][1]
            taken += 1
        if size != ways:
            return None
        out.append(None if not names else names[0] if len(names) == 1 else tuple(names))
    return tuple(out) if taken == len(axes) else None


# ------------------------------------------------------------------------------------------ the rules

def mesh_problems(loaded) -> list:
    """Each split axis divides evenly (the batch too where the replicas are known: on a TPU), and each split tensor
    lines up with the device mesh; at `partition.<group>.<name>`, before anything is built."""
    from tpulaunch.checks.static import layout_of, per_replica_batch
    from tpulaunch.plan.build import device_cores, resolve_partition
    from tpulaunch.plan.partition import VALID_CORES_PER_REPLICA
    from tpulaunch.plan.tpu_layout import split_findings

    part, data, tpu = loaded.section("partition"), loaded.section("data"), loaded.section("tpu")
    if part is None or data is None or not loaded.usable("partition", "data", "tpu"):
        return []
    cores = tpu.cores_per_replica if tpu is not None else device_cores(part)
    if cores <= 1 or (tpu is not None and cores not in VALID_CORES_PER_REPLICA):
        return []  # nothing split, or the slice rule's
    if part == "auto" and (tpu is None or not all(spec.is_static for spec in data.features.values())):
        return []  # the partition rule refuses auto without tpu:; unknown shapes: the static-shape rule
    # The batch axis at each mode's per-replica batch, known only on a TPU (on this machine: when training starts).
    batches = [(f"{section}.batch_size", per_replica_batch(loaded, section) if tpu is not None else None)
               for section in ("train", "eval") if loaded.section(section) is not None] or [("train.batch_size", None)]
    layout = layout_of(loaded)
    chosen = resolve_partition(part, data.features, data.labels, cores, batches[0][1] or 1, even=True)
    split = spatial_split(chosen, cores)
    if split is None:
        return []
    problems = []
    for (group, name), dims in split.dims.items():
        declared = getattr(data, group).get(name)
        if declared is None or len(dims) != len(declared.shape) + 1 or math.prod(dims) != cores:
            continue  # unknown tensor, wrong rank or product: the partition rule reports those
        path = ("partition",) if part == "auto" else ("partition", group, name)
        seen = set()
        for batch_key, batch in batches:
            for f in split_findings(name, [batch, *declared.shape], dims, replicas=layout.replicas if layout else 1,
                                    batch_key=batch_key, why=EVEN_ONLY):
                if f.index not in seen:
                    seen.add(f.index)
                    where = path + (f.index,) if part != "auto" else path
                    problems.append(loaded.problem(where, f.code, f.message, f.hint))
        if tensor_axes(dims, split.axes) is None:
            problems.append(loaded.problem(
                path, "partition-off-mesh",
                f"the dims {dims} of '{name}' do not line up with the device mesh ({split.text}): each split axis "
                "of a tensor takes the mesh's split axes in order, whole",
                f"split '{name}' as '{split.main}' is, or replicate it (null)"))
    return problems


# ------------------------------------------------------------------------------------- at train time

@dataclass(frozen=True)
class DeviceLayout:
    """The run's devices as the mesh uses them: replicas of `split.cores` devices (one each when not split)."""

    devices: list
    replicas: int
    split: Optional[SpatialSplit]

    @property
    def platform(self) -> str:
        return self.devices[0].platform

    def describe(self) -> str:
        """The run's first line: what it trains on."""
        count = f"{len(self.devices)} {self.platform} device{'s' if len(self.devices) > 1 else ''}"
        if self.split is None:
            return f"jax | data-parallel over {count}"
        return (f"jax | {self.replicas} replica{'s' if self.replicas > 1 else ''} × {self.split.cores} cores "
                f"(spatial {self.split.text}) over {count}")

    def batch_shards(self) -> int:
        """Into how many pieces each batch is split along its first axis: the replicas, times a split of the
        per-replica batch where partition: splits it too."""
        if self.split is None:
            return len(self.devices)
        return self.replicas * max(dims[0] for dims in self.split.dims.values())


def device_layout(split: Optional[SpatialSplit], devices: list) -> DeviceLayout:
    """The devices as replicas of the split's cores; refused at `partition` when they do not divide."""
    if split is None:
        return DeviceLayout(devices, len(devices), None)
    count = len(devices)
    if count % split.cores:
        platform = devices[0].platform
        fewer = [d for d in range(2, count + 1) if count % d == 0]
        hint = (f"split over {' or '.join(map(str, fewer))} devices per replica (dims whose product divides {count})"
                if fewer else "remove partition: (this machine has one device)")
        if platform == "cpu":
            hint += (", or split the CPU into more devices: "
                     f"XLA_FLAGS=--xla_force_host_platform_device_count={split.cores}")
        raise BuildError(("partition",), "train", f"a replica spans {split.cores} devices (the product of the dims of "
                         f"'{split.main}'), which do not divide this machine's {count} {platform} device"
                         f"{'s' if count > 1 else ''}", hint, code="partition-devices")
    return DeviceLayout(devices, count // split.cores, split)


def check_batches(plan, layout: DeviceLayout) -> None:
    """Each of the Plan's global batches splits evenly over the batch shards (replicas, and a split batch axis),
    which only the devices JAX finds here say (`Plan.per_shard`: the one rule)."""
    shards = layout.batch_shards()
    over = (f"this machine's {shards} devices" if layout.split is None else
            f"{shards} batch shards ({layout.replicas} replicas of {layout.split.cores} devices each, of this "
            f"machine's {len(layout.devices)})")
    for batch in plan.batches:
        plan.per_shard(batch.split, shards, over)


def distribution(layout: DeviceLayout, job):
    """The Keras 3 distribution the run trains with: None on one device, DataParallel when nothing is split, else
    SpatialParallel over the mesh ("batch", *the split axes)."""
    import keras

    if layout.split is None:
        return keras.distribution.DataParallel(devices=layout.devices) if len(layout.devices) > 1 else None
    from jax.experimental import mesh_utils

    split = layout.split
    shape = (layout.replicas, *(size for _name, size in split.axes))
    names = [BATCH, *(name for name, _size in split.axes)]
    mesh = keras.distribution.DeviceMesh(shape, names, mesh_utils.create_device_mesh(shape, layout.devices))
    by_shape = {}
    for (group, name), dims in split.dims.items():
        by_shape.setdefault(tuple(getattr(job.data, group)[name].shape), tensor_axes(dims, split.axes))
    return _spatial_parallel_class(keras)(mesh, by_shape)


def _spatial_parallel_class(keras):
    class SpatialParallel(keras.distribution.ModelParallel):
        """ModelParallel with every variable replicated whose data layout shards the split dims too (by the
        tensor's shape without its batch dim; any other input along the batch only)."""

        def __init__(self, device_mesh, layouts: dict):
            super().__init__(layout_map=keras.distribution.LayoutMap(device_mesh), batch_dim_name=BATCH)
            self._layouts = layouts

        def get_data_layout(self, data_shape):
            axes = self._layouts.get(tuple(data_shape[1:]))
            if axes is None:
                return super().get_data_layout(data_shape)
            return keras.distribution.TensorLayout(axes, self.device_mesh)

    return SpatialParallel
