"""The device mesh of an engine that shards each batch over the devices itself (`EngineAbout.layout.partition_on_devices`):
replicas along a "batch" axis, each of `cores` devices laid out as the split axes of partition:'s most split tensor.

It is the Plan's: the dims fed (`Plan.feed_partition`) and the devices a replica spans (`Plan.cores_per_replica`)
are resolved once, in `build.py`. On a TPU target the Plan's slice also says the replicas, and validate has checked
that they take the slice and each batch (`checks/static.py`, the engine's own mesh rules). On this machine the
devices are known only when the run starts: `Plan.device_mesh` is asked with their count, and applies there, once,
what the checks could not: the devices take whole replicas, and each batch divides over the batch shards.

The mesh's first axis is "batch" (one entry per replica), then one axis per split axis of the most split tensor
(the image of `[1, 2, 2, 1]`: two axes of 2). Every input is sharded along "batch" and its own split dims over
those axes (`tensor_axes`). Pure Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from tpulaunch.errors import TpuLaunchError

BATCH = "batch"  # the mesh axis along which the replicas split each batch


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


@dataclass(frozen=True)
class DeviceMesh:
    """The devices as replicas of `split.cores` devices (one each when nothing is split)."""

    replicas: int
    split: Optional[SpatialSplit]

    @property
    def shape(self) -> tuple:
        """(replicas, *the split axes' sizes)."""
        return (self.replicas, *(size for _name, size in self.split.axes)) if self.split else (self.replicas,)

    @property
    def axis_names(self) -> list:
        return [BATCH, *(name for name, _size in self.split.axes)] if self.split else [BATCH]

    def describe(self, devices: int, platform: str) -> str:
        """What it trains on, over `devices` of `platform`: `data-parallel over 8 cpu devices`, `2 replicas × 4
        cores (spatial 2×2 on image) over 8 cpu devices` (the run's first line, and a local plan's)."""
        count = f"{devices} {platform} device{'s' if devices > 1 else ''}"
        if self.split is None:
            return f"data-parallel over {count}"
        return (f"{self.replicas} replica{'s' if self.replicas > 1 else ''} × {self.split.cores} cores "
                f"(spatial {self.split.text}) over {count}")

    def batch_shards(self) -> int:
        """Into how many pieces each batch is split along its first axis: the replicas, times a split of the
        per-replica batch where partition: splits it too."""
        if self.split is None:
            return self.replicas
        return self.replicas * max(dims[0] for dims in self.split.dims.values())


class DevicesRefused(TpuLaunchError):
    """The devices found at run time do not take whole replicas: refused at `key`, where the split is declared."""

    key = ("partition",)


def device_mesh(plan, devices: int, platform: str) -> DeviceMesh:
    """The mesh of `plan` over the run's `devices` (`platform`: JAX's name for them, "cpu", "tpu", ...).

    Raises:
        DevicesRefused: on this machine, a replica's devices that do not divide `devices`.
        TpuLaunchError: on this machine, a batch that does not divide over the mesh's batch shards.
    """
    split = spatial_split(plan.feed_partition, plan.cores_per_replica)
    if plan.on_tpu:  # the slice's replicas, checked against the slice and the batches by validate
        return DeviceMesh(plan.replicas, split)
    if split is not None and devices % split.cores:
        message, hint = _devices_refusal(split, devices, platform)
        raise DevicesRefused(message, hint=hint, code="partition-devices")
    mesh = DeviceMesh(devices // split.cores if split else devices, split)
    shards = mesh.batch_shards()
    over = (f"this machine's {shards} devices" if split is None else
            f"{shards} batch shards ({mesh.replicas} replicas of {split.cores} devices each, of this "
            f"machine's {devices})")
    for batch in plan.batches:
        plan.per_shard(batch.split, shards, over)
    return mesh


def _devices_refusal(split: SpatialSplit, count: int, platform: str) -> tuple:
    fewer = [d for d in range(2, count + 1) if count % d == 0]
    hint = (f"split over {' or '.join(map(str, fewer))} devices per replica (dims whose product divides {count})"
            if fewer else "remove partition: (this machine has one device)")
    if platform == "cpu":
        hint += f", or split the CPU into more devices: XLA_FLAGS=--xla_force_host_platform_device_count={split.cores}"
    message = (f"a replica spans {split.cores} devices (the product of the dims of '{split.main}'), which do not "
               f"divide this machine's {count} {platform} device{'s' if count > 1 else ''}")
    return message, hint
