"""Several slices of one job (multislice): the facts every place that runs them shares.

- The nodes of a multislice queued resource: Cloud TPU names them `<node_id_prefix>-0 … <prefix>-(N-1)`
  (`QueuedResource.Tpu.NodeSpec.MultisliceParams`: "If node_count = 3 and node_id_prefix = "np", node ids of nodes
  created will be "np-0", "np-1", "np-2""); tpulaunch's prefix is the job's node name (`slice_node_names`).
- What libtpu's multislice and JAX's cluster detection read (`megascale_environment`): the coordinator (worker 0 of
  slice 0), the number of slices and this host's slice. GKE's pods get them from the JobSet (`remote/jobset.py`); a
  TPU VM of a multislice queued resource from its `tpu-env` metadata (`KEY: 'value'` lines, which JAX reads too:
  `jax._src.clusters.cloud_tpu_cluster.get_tpu_env_value`), and the host runner sets them in train's environment.
- The run's hosts, slice after slice (`run_host_index`): worker 0 of slice 0 is the chief.
"""

from __future__ import annotations

from typing import Dict, List, Optional

# The generations Cloud TPU makes multislice queued resources of (https://cloud.google.com/tpu/docs/multislice-introduction)
MULTISLICE_PREFIXES = ("v4", "v5litepod", "v5p", "v6e")
MEGASCALE_PORT = 8080  # libtpu's multislice coordinator (the port Google's multislice examples use)
COORDINATOR = "MEGASCALE_COORDINATOR_ADDRESS"
NUM_SLICES = "MEGASCALE_NUM_SLICES"
SLICE_ID = "MEGASCALE_SLICE_ID"
PORT = "MEGASCALE_PORT"
TPU_ENV_KEY = "tpu-env"  # a TPU VM's metadata attribute that carries the MEGASCALE_* values


def slices_of(job_tpu) -> int:
    """The job's `tpu.slices` as a number: 1 when it is unset, or not a number above 1."""
    slices = getattr(job_tpu, "slices", 1)
    return slices if isinstance(slices, int) and slices > 1 else 1


def slice_node_names(prefix: str, slices: int) -> List[str]:
    """The nodes of the job's TPU: its node name alone, or on several slices Cloud TPU's names for a multislice queued
    resource's nodes, `<prefix>-<slice>`."""
    return [prefix] if slices <= 1 else [f"{prefix}-{index}" for index in range(slices)]


def tpu_words(prefix: str, slices: int) -> str:
    """The job's TPU as messages name it: its node, or on several slices the queued resource and its nodes (what
    `tpulaunch down` deletes, what a recovery recreates)."""
    if slices <= 1:
        return f"TPU node '{prefix}'"
    names = slice_node_names(prefix, slices)
    nodes = ", ".join(names) if slices <= 3 else f"{names[0]} … {names[-1]}"
    return f"queued resource '{prefix}' of {slices} slices (TPU nodes {nodes})"


def megascale_environment(coordinator: str, slices: int, slice_id: Optional[int]) -> Dict[str, str]:
    """The MEGASCALE_* variables of a host of slice `slice_id` (None: the caller fills MEGASCALE_SLICE_ID itself, as
    the JobSet does from the downward API); {} on one slice."""
    if slices <= 1:
        return {}
    return {COORDINATOR: coordinator, NUM_SLICES: str(slices),
            **({SLICE_ID: str(slice_id)} if slice_id is not None else {SLICE_ID: ""}), PORT: str(MEGASCALE_PORT)}


def tpu_env_text(values: Dict[str, str]) -> str:
    """`values` as a TPU VM's `tpu-env` metadata writes them, one `KEY: 'value'` line each."""
    return "".join(f"{key}: '{value}'\n" for key, value in values.items())


def read_tpu_env(text: str) -> Dict[str, str]:
    """The values of a `tpu-env` metadata text (what `tpu_env_text` writes; JAX reads it the same way)."""
    values = {}
    for line in (text or "").splitlines():
        key, colon, value = line.partition(":")
        if colon:
            values[key.strip()] = value.strip().strip("'")
    return values


def run_host_index(slice_id: int, hosts_per_slice: int, worker: int) -> int:
    """A host's index among the run's hosts, slice after slice (worker 0 of slice 0, the chief, is 0)."""
    return slice_id * hosts_per_slice + worker


def run_endpoints(own: List[str], slice_id: int, slices: int, coordinator: str) -> List[str]:
    """The run's hosts as a TPU VM host knows them: its own slice's endpoints, the coordinator first (worker 0 of
    slice 0), the other slices' hosts by name only (`slice-S-worker-W`): a TPU VM is not told their addresses, and
    JAX on a TPU finds its peers itself (what it is told is how many there are and which one it is)."""
    hosts = len(own)
    names = []
    for index in range(slices):
        for worker in range(hosts):
            if index == slice_id:
                names.append(own[worker])
            elif (index, worker) == (0, 0):
                names.append(coordinator)
            else:
                names.append(f"slice-{index}-worker-{worker}")
    return names
