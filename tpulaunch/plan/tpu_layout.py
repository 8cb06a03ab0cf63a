"""How TPUStrategy lays a replica out on a TPU slice, and its rules for splitting inputs (the keras engine's). Pure Python.

The keras engine trains with `tf.distribute.TPUStrategy`. With `tpu.cores_per_replica` > 1 (TensorFlow's
"logical devices per replica") it builds a `DeviceAssignment` from the slice's topology with a
*computation shape* — the block of the 4-D mesh [x, y, z, devices per chip] one replica occupies — and
`devices // logical devices` replicas, as Model Garden's `official/vision/train_spatial_partitioning.py`
does; inside the step `strategy.experimental_split_to_logical_devices` tiles each input.

Computation shapes: on v2/v3 (two TensorFlow devices per chip) Model Garden's table, 1 [1,1,1,1],
2 [1,1,1,2], 4 [1,2,1,2], 8 [2,2,1,2], 16 [4,2,1,2], which is the start of TPUEstimator's table
(`plan.partition.COMPUTATION_SHAPES`, on to 128). That table assumes two devices per chip: on v4, v5p
(megacore) and v5e/v6e TensorFlow's mesh ends in 1, and `DeviceAssignment.build` refuses any shape
whose footprint exceeds the mesh ("computation footprint ... does not fit in TPU topology shape"), so
Model Garden's table cannot be used there as written. TensorFlow is right: there the block is grown
over chips, doubling its shortest axis (x before y before z), which keeps it compact and tiles the mesh.

Unlike TPUEstimator, `experimental_split_to_logical_devices` does not pad: every known axis must be
divisible by its split (TF 2.21 `tpu_strategy.py`), so an uneven split is an error here, not a warning.

No TensorFlow or numpy here: `validate --static` and `plan --no-memory` use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

from tpulaunch.plan import partition as rules
from tpulaunch.tpu.topology import slice_topology
from tpulaunch.tpu.types import TpuType, lookup

Shape4 = Tuple[int, int, int, int]


@dataclass(frozen=True)
class StrategyLayout:
    """One replica's block of the slice and how many replicas fill it."""

    logical_devices: int  # tpu.cores_per_replica: TPU devices one replica spans
    computation_shape: Shape4  # DeviceAssignment.build's computation_shape
    replicas: int  # DeviceAssignment.build's num_replicas: devices // logical_devices
    topology_shape: Shape4  # the slice's mesh [x, y, z, devices per chip]


def computation_shape(topology_shape: Sequence[int], logical_devices: int) -> Optional[Shape4]:
    """The computation shape for `logical_devices` on a mesh, or None for a count that has none.

    The result may not fit the mesh (too many devices): `fits` says; TensorFlow is asked with it anyway
    by `validate --tf`, so its refusal is its own words.
    """
    if logical_devices < 1 or logical_devices & (logical_devices - 1):
        return None  # blocks that tile a power-of-two mesh have power-of-two sizes
    if topology_shape[-1] == 2:
        return rules.COMPUTATION_SHAPES.get(logical_devices)
    shape = [1, 1, 1, 1]  # one device per chip: grow the block over chips
    for _ in range(logical_devices.bit_length() - 1):
        roomy = [a for a in range(3) if shape[a] * 2 <= topology_shape[a]] or [0]  # none left: overflow x
        shape[min(roomy, key=lambda a: (shape[a], a))] *= 2
    return tuple(shape)


def fits(topology_shape: Sequence[int], shape: Sequence[int]) -> bool:
    """The block fits the mesh and tiles it (DeviceAssignment.build's footprint check, no stride)."""
    return all(s <= t and t % s == 0 for s, t in zip(shape, topology_shape))


def layout_for_type(tpu_type: TpuType, logical_devices: int) -> Union[StrategyLayout, list]:
    """The layout of replicas of `logical_devices` on a slice, or the findings that make it impossible."""
    topology_shape = slice_topology(tpu_type).mesh_shape
    if logical_devices not in rules.VALID_CORES_PER_REPLICA:
        allowed = ", ".join(map(str, rules.VALID_CORES_PER_REPLICA))
        return [rules.Finding("error", "cores-per-replica-invalid",
                              f"{logical_devices} logical devices per replica is not one of {allowed}",
                              "a replica is a power-of-two block of the slice's TPU mesh; pick one of these")]
    sliced = rules.slice_layout(tpu_type.devices, tpu_type.hosts, logical_devices)
    if isinstance(sliced, list):
        return sliced
    shape = computation_shape(topology_shape, logical_devices)
    if shape is None or not fits(topology_shape, shape):
        largest = max((n for n in rules.VALID_CORES_PER_REPLICA
                       if (s := computation_shape(topology_shape, n)) is not None and fits(topology_shape, s)),
                      default=1)
        return [rules.Finding("error", "computation-shape-does-not-fit",
                              f"{logical_devices} logical devices per replica need the block "
                              f"{rules.shape_text(shape or [])} of TPU devices, which does not fit the "
                              f"{tpu_type.name} mesh {rules.shape_text(topology_shape)}",
                              f"use at most cores_per_replica: {largest} on {tpu_type.name}, or a larger slice")]
    return StrategyLayout(logical_devices, shape, tpu_type.devices // logical_devices, topology_shape)


def strategy_layout(job, plan=None) -> Optional[StrategyLayout]:
    """The layout a TPU job trains with, or None for a job without a tpu: section (or a slice that cannot
    hold it, which validate has refused). `plan`: a Plan for this machine (`plan.on_tpu` False) gives None."""
    if job.tpu is None or (plan is not None and not plan.on_tpu):
        return None
    tpu_type = lookup(job.tpu.type)
    if tpu_type is None:
        return None
    layout = layout_for_type(tpu_type, job.tpu.cores_per_replica)
    return None if isinstance(layout, list) else layout


# Why an engine that splits only evenly refuses an uneven split (the keras engine's; the jax engine gives its own).
TPU_STRATEGY_EVEN = ("the keras engine's TPUStrategy.experimental_split_to_logical_devices splits an axis only into "
                     "equal pieces (TPUEstimator pads uneven pieces; TPUStrategy refuses them)")


def split_findings(name: str, shape: Sequence[Optional[int]], dims: Sequence[int], *,
                   replicas: int = 1, batch_key: str = "train.batch_size", why: str = TPU_STRATEGY_EVEN) -> list:
    """Each axis of one tensor (batch first, per replica) that its split does not divide: errors for an engine
    that splits only evenly (`why` it does), with sizes and dims that would divide."""
    findings = []
    cores = 1
    for d in dims:
        cores *= d
    even_dims = rules.suggest(shape, cores, even=True)
    for axis, size, ways in rules.uneven_axes(shape, dims):
        lower, upper = size // ways * ways, (size // ways + 1) * ways
        sizes = " or ".join(str(v) for v in (lower, upper) if v > 0)
        if axis == 0:
            global_sizes = " or ".join(str(v * replicas) for v in (lower, upper) if v > 0)
            what = f"the per-replica batch of '{name}' is {size}, which {ways} does not divide"
            hint = (f"set {batch_key} to {global_sizes} (a per-replica batch divisible by {ways} over {replicas} "
                    "replica(s)), or do not split the batch axis")
        else:
            what = f"axis {axis} of '{name}' has size {size}, which {ways} does not divide"
            hint = f"use a size divisible by {ways} (e.g. {sizes})"
            if even_dims:
                hint += f", or dims that divide every axis: {even_dims}"
        findings.append(rules.Finding(
            "error", "partition-uneven-split",
            f"{what}: {why}", hint, index=axis))
    return findings
