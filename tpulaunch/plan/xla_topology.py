"""A TPU slice as libtpu's compile-only topology: the name `get_topology_desc` takes, and how many of its
devices one replica's step is compiled for.

Shared by every engine that asks XLA (the exported TensorFlow step here, a JAX engine's own step tomorrow).
The topology is the smallest Cloud TPU slice of the generation (of at least 4 chips, one host's 2x2) that
holds one replica (XLA compiles the replica's program; every replica runs the same one), laid out as TensorFlow
lays out slices (`tpu/topology.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from tpulaunch.tpu.topology import slice_topology
from tpulaunch.tpu.types import TpuType, parse_tpu_type

# libtpu's names per generation, and whether its mesh has a z axis.
_LIBTPU_NAMES = {"v2": ("v2", False), "v3": ("v3", False), "v4": ("v4", True), "v5e": ("v5e", False),
                 "v5p": ("v5p", True), "v6e": ("v6e", False)}


@dataclass(frozen=True)
class CompileTarget:
    topology: str  # libtpu's name, e.g. "v3:2x2"
    partitions: int  # devices one replica spans (cores_per_replica)
    slice_name: str  # the Cloud TPU slice the topology stands for


def target_for(tpu_type: TpuType, cores_per_replica: int) -> CompileTarget:
    """The topology to compile one replica of `cores_per_replica` devices for, on `tpu_type`'s generation."""
    generation = tpu_type.generation
    name, three_d = _LIBTPU_NAMES[generation.name]
    smallest = tpu_type
    for size in sorted(generation.sizes):
        candidate = parse_tpu_type(f"{generation.prefix}-{size}")
        # libtpu's topologies start at one host's 2x2 chips (v5e:1x1 is refused).
        if candidate.devices >= cores_per_replica and candidate.chips >= 4:
            smallest = candidate
            break
    x, y, z, _ = slice_topology(smallest).mesh_shape
    shape = (x, y, z) if three_d else (x, y * z)
    return CompileTarget(f"{name}:" + "x".join(str(d) for d in shape), cores_per_replica, smallest.name)


def tiled_sharding(dims: Optional[Sequence[int]]) -> Optional[str]:
    """An input split by partition dims (batch first) as HLO sharding text, over partitions 0..n-1: what
    TPUEstimator's spatial partitioning asks XLA for. None when unsplit (replicated)."""
    if not dims or math.prod(dims) <= 1:
        return None
    devices = ",".join(str(i) for i in range(math.prod(dims)))
    return "{devices=[" + ",".join(str(int(d)) for d in dims) + "]" + devices + "}"
