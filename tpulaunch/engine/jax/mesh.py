"""Spatial partitioning on the jax engine: its rules at `partition:`, and the Keras 3 distribution over the Plan's
device mesh (`plan/mesh.py`: "batch" x the split axes of the most split tensor, its replicas from the Plan's slice
on a TPU, from the devices JAX finds on this machine).

Every input is sharded along "batch" and its own split dims over the split axes (a `NamedSharding`); the variables
are replicated. XLA's SPMD partitioner then splits the convolutions across the split axes, exchanging the halos,
which is what TPUEstimator's spatial partitioning does underneath.

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

from tpulaunch.engine.core.build_failures import BuildError
from tpulaunch.plan.mesh import BATCH, DeviceMesh, DevicesRefused, spatial_split, tensor_axes

# Why an uneven split is refused on this engine (plan/tpu_layout.split_findings says where and what would divide).
EVEN_ONLY = ("the jax engine shards an axis into equal pieces only (a JAX NamedSharding; TPUEstimator pads uneven "
             "pieces)")


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
    """The run's devices as the Plan's mesh lays them out."""

    devices: list
    mesh: DeviceMesh

    @property
    def platform(self) -> str:
        return self.devices[0].platform

    @property
    def split(self):
        return self.mesh.split

    def describe(self) -> str:
        """The run's first line: what it trains on."""
        return f"jax | {self.mesh.describe(len(self.devices), self.platform)}"


def devices_here() -> tuple:
    """(how many, JAX's platform name) of the devices JAX finds on this machine, which a local Plan's replicas take
    (`EngineAbout.layout.devices_here`; on a CPU, as XLA_FLAGS' --xla_force_host_platform_device_count splits it)."""
    import jax

    devices = jax.devices()
    return len(devices), devices[0].platform


def device_layout(plan, devices: list) -> DeviceLayout:
    """`devices` as the Plan's mesh (`Plan.device_mesh`), or data-parallel over all of them without a Plan (the
    memory estimate's build); devices that do not take whole replicas refused at `partition`, before anything is
    built."""
    if plan is None:
        return DeviceLayout(devices, DeviceMesh(len(devices), None))
    try:
        return DeviceLayout(devices, plan.device_mesh(len(devices), devices[0].platform))
    except DevicesRefused as refused:
        raise BuildError(refused.key, "train", refused.message, refused.hint, code=refused.code) from None


def distribution(layout: DeviceLayout, job):
    """The Keras 3 distribution the run trains with: None on one device, DataParallel when nothing is split, else
    SpatialParallel over the mesh ("batch", *the split axes)."""
    import keras

    if layout.split is None:
        return keras.distribution.DataParallel(devices=layout.devices) if len(layout.devices) > 1 else None
    from jax.experimental import mesh_utils

    split, shape = layout.split, layout.mesh.shape
    mesh = keras.distribution.DeviceMesh(shape, layout.mesh.axis_names,
                                         mesh_utils.create_device_mesh(shape, layout.devices))
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
