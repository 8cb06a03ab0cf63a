"""The physical layout of a Cloud TPU slice as TensorFlow's `Topology` describes it. Pure Python.

TensorFlow describes a slice by a 4-D mesh `[x, y, z, devices per chip]` and, per host, the mesh
coordinates of each of its TPU devices (`tensorflow/python/tpu/topology.py`). A real slice hands them
over from `initialize_tpu_system`; offline checks (`validate --tf` of the estimator and keras engines) fabricate them here
so that TensorFlow's own `DeviceAssignment.build` and TPUEstimator see the slice's shape:

* v2/v3: two TensorFlow devices per chip (mesh `[.., .., 1, 2]`), a 2-D torus of chips; a host owns a
  2x2 block of chips (v3-8 [2,2,1,2], v3-32 [4,4,1,2], v3-64 [8,4,1,2], v3-128 [8,8,1,2]).
* v4, v5p: one device per chip (megacore), a 3-D torus; a host owns 2x2x1 chips (v4-8 [2,2,1,1],
  v4-16 [2,2,2,1], v4-32 [2,2,4,1], v4-64 [2,4,4,1], v4-128 [4,4,4,1]).
* v5e, v6e: one core per chip, a 2-D torus (v5litepod-8 [2,4,1,1], -16 [4,4,1,1], -32 [4,8,1,1]); a
  single host serves up to 8 chips, multi-host slices have 4 chips (2x2) per host.

Sources: the Cloud TPU system architecture pages (chips per host, slice topologies such as 2x2x4) and
TPUEstimator's fixed computation shapes (`tpu_context.py` `_NUM_CORES_TO_COMPUTATION_SHAPE`), which fit
the v2/v3 meshes above exactly. Slices whose chip count is not a power of two (v5p-6144, v5p-12288) get
the power-of-two mesh stretched along its shortest axis: an approximation, marked as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from tpulaunch.tpu.types import TpuType

Coordinate = Tuple[int, int, int, int]


@dataclass(frozen=True)
class SliceTopology:
    """`mesh_shape` [x, y, z, devices per chip] and, per host, each TPU device's coordinates."""

    mesh_shape: Tuple[int, int, int, int]
    device_coordinates: Tuple[Tuple[Coordinate, ...], ...]


def grid(count: int) -> Tuple[int, int]:
    """Lay `count` blocks out as x*y with x >= y, as square as powers of two allow (x grows first)."""
    y = 2 ** ((count.bit_length() - 1) // 2)
    return (count // y, y) if count % y == 0 else (count, 1)


def _doubled(start: list, count: int, tie_order: Tuple[int, ...]) -> list:
    """`start` doubled along its smallest axis (ties broken by `tie_order`) until it holds `count`."""
    shape = list(start)
    product = 1
    for extent in shape:
        product *= extent
    while product < count and count % (product * 2) == 0:
        axis = min(tie_order, key=lambda a: (shape[a], tie_order.index(a)))
        shape[axis] *= 2
        product *= 2
    if product < count:  # a chip count that is not a power of two (v5p-6144): stretch the shortest axis
        axis = min(tie_order, key=lambda a: (shape[a], tie_order.index(a)))
        shape[axis] *= count // product
    return shape


def _layout(host_grid, block, devices_per_chip: int) -> SliceTopology:
    """Hosts laid out x-fastest over `host_grid`, each owning a `block` of chips (x-fastest inside)."""
    hosts_x, hosts_y, hosts_z = host_grid
    block_x, block_y, block_z = block
    coordinates = []
    for host in range(hosts_x * hosts_y * hosts_z):
        hx, rest = host % hosts_x, host // hosts_x
        hy, hz = rest % hosts_y, rest // hosts_y
        own = []
        for chip in range(block_x * block_y * block_z):
            cx, rest = chip % block_x, chip // block_x
            cy, cz = rest % block_y, rest // block_y
            for core in range(devices_per_chip):
                own.append((hx * block_x + cx, hy * block_y + cy, hz * block_z + cz, core))
        coordinates.append(tuple(own))
    mesh = (hosts_x * block_x, hosts_y * block_y, hosts_z * block_z, devices_per_chip)
    return SliceTopology(mesh_shape=mesh, device_coordinates=tuple(coordinates))


def core_pair_topology(devices: int, hosts: int) -> SliceTopology:
    """A v2/v3-style slice of `devices` TPU cores on `hosts` hosts (two cores per chip when a host's count is even).

    Two chips on a host go along y, so TPUEstimator's 4-core computation shape [1, 2, 1, 2] fits on them.

    Raises:
        ValueError: devices not a positive multiple of hosts.
    """
    if hosts < 1 or devices < hosts or devices % hosts:
        raise ValueError(f"devices ({devices}) must be a positive multiple of hosts ({hosts})")
    per_host = devices // hosts
    cores_per_chip = 2 if per_host % 2 == 0 else 1
    chips_per_host = per_host // cores_per_chip
    block = (1, 2, 1) if chips_per_host == 2 else grid(chips_per_host) + (1,)
    return _layout(grid(hosts) + (1,), block, cores_per_chip)


def slice_topology(tpu_type: TpuType) -> SliceTopology:
    """The topology TensorFlow reports for a slice of this accelerator type (see the module docstring)."""
    generation = tpu_type.generation
    if generation.devices_per_chip == 2:
        return core_pair_topology(tpu_type.devices, tpu_type.hosts)
    chips = tpu_type.chips
    chips_per_host = chips // tpu_type.hosts
    if generation.name in ("v4", "v5p"):
        mesh = _doubled([2, 2, 1] if chips >= 4 else [1, 1, 1], chips, (2, 1, 0))
        block = _doubled([1, 1, 1], chips_per_host, (0, 1, 2))
    else:  # v5e, v6e: a 2-D torus
        mesh = _doubled([1, 1, 1], chips, (1, 0))
        block = _doubled([1, 1, 1], chips_per_host, (1, 0))
    host_grid = tuple(m // b for m, b in zip(mesh, block))
    return _layout(host_grid, tuple(block), 1)
