"""A TPU slice as GKE names it: the node labels a pod selects its slice by, and the chips each pod asks for.

GKE runs a slice of `tpu.type` as one node pool, one node per host; a pod on each node asks `google.com/tpu` for the
node's chips and selects the pool by two labels (Google's "Plan TPUs in GKE" page and its TPU workload examples,
checked against xpk 1.16.0's JobSet for v6e-16, `../shared/k8s/`):

- `cloud.google.com/gke-tpu-accelerator`: the generation's slice machine family — v4 `tpu-v4-podslice`, v5e
  `tpu-v5-lite-podslice`, v5p `tpu-v5p-slice`, v6e `tpu-v6e-slice`. GKE offers no v2 or v3 node pools.
- `cloud.google.com/gke-tpu-topology`: the slice's chips as a torus, `XxY` on the 2-D generations (v5e, v6e: v6e-16
  is `4x4`) and `XxYxZ` on the 3-D ones (v4, v5p: v4-16 is `2x2x2`, v4-8 `2x2x1`) — the mesh `topology.py` lays out.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpulaunch.tpu.topology import slice_topology
from tpulaunch.tpu.types import TpuType

ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
TPU_RESOURCE = "google.com/tpu"
# One child Job of a JobSet per node pool, so each slice is a whole pool of its own.
EXCLUSIVE_TOPOLOGY = {"alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}

ACCELERATORS = {"v4": "tpu-v4-podslice", "v5e": "tpu-v5-lite-podslice", "v5p": "tpu-v5p-slice",
                "v6e": "tpu-v6e-slice"}
THREE_D = ("v4", "v5p")


class NoGkeSlice(ValueError):
    """A TPU type GKE has no node pool for."""


@dataclass(frozen=True)
class GkeSlice:
    """One slice of a TPU type as a GKE node pool."""

    accelerator: str  # the gke-tpu-accelerator label's value
    topology: str  # the gke-tpu-topology label's value
    hosts: int  # nodes (pods) per slice
    chips_per_host: int  # what each pod asks of google.com/tpu

    @property
    def node_selector(self) -> dict:
        return {ACCELERATOR_LABEL: self.accelerator, TOPOLOGY_LABEL: self.topology}


def gke_slice(tpu_type: TpuType) -> GkeSlice:
    """The node pool of one `tpu_type` slice.

    Raises:
        NoGkeSlice: a generation GKE does not offer (v2, v3).
    """
    generation = tpu_type.generation.name
    if generation not in ACCELERATORS:
        offered = ", ".join(sorted(ACCELERATORS))
        raise NoGkeSlice(f"GKE has no {generation} node pools ({tpu_type.name}); it offers {offered}")
    mesh = slice_topology(tpu_type).mesh_shape
    axes = mesh[:3] if generation in THREE_D else mesh[:2]
    return GkeSlice(ACCELERATORS[generation], "x".join(str(n) for n in axes), tpu_type.hosts,
                    tpu_type.chips // tpu_type.hosts)
