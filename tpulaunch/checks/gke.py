"""Rules of a job that runs past one TPU VM: `gke:` (a JobSet on a GKE cluster) and `tpu.slices` (multislice: on GKE,
or on TPU VMs as one multislice queued resource)."""

from __future__ import annotations

from tpulaunch.job.load import LoadedJob
from tpulaunch.tpu.multislice import MULTISLICE_PREFIXES
from tpulaunch.tpu.gke import NoGkeSlice, gke_slice
from tpulaunch.tpu.types import UnknownTpuType, parse_tpu_type


def gke_problems(loaded: LoadedJob) -> list:
    """What the engine runs (in a container, on several slices), what GKE offers, and what the job names."""
    if loaded.local:  # on this machine (`--local`, a rehearsal's hosts): tpu: and gke: do not apply
        return []
    gke, tpu, about = loaded.section("gke"), loaded.section("tpu"), loaded.engine_about
    problems = []
    if gke is not None:
        if tpu is None:
            problems.append(loaded.problem(("gke",), "gke-without-tpu",
                                           "gke: runs the job on the cluster's TPU node pools, but the job has no "
                                           "tpu: section saying which slice",
                                           "add tpu: {type: v6e-16} (the node pool's slice; tpu.name and tpu.zone "
                                           "are not used on GKE)"))
        if about is not None and about.on_tpu.container_image is None:
            problems.append(loaded.problem(("gke",), "gke-engine",
                                           f"the {about.display} runs on TPU VM images only: its TPU runtime has "
                                           "no container a GKE pod could run",
                                           "set run.engine: jax (or keras), or drop gke: and use `tpulaunch run` on "
                                           "a TPU VM"))
    if tpu is None:
        return problems
    try:
        tpu_type = parse_tpu_type(tpu.type)
    except UnknownTpuType:
        return problems  # check_slice says so
    if gke is not None:
        try:
            gke_slice(tpu_type)
        except NoGkeSlice as exc:
            problems.append(loaded.problem(("tpu", "type"), "gke-tpu-type", str(exc),
                                           "choose a v4, v5e (v5litepod), v5p or v6e type, or drop gke: and use a "
                                           "TPU VM"))
    if tpu.slices > 1:
        if about is not None and not about.layout.multislice:
            problems.append(loaded.problem(("tpu", "slices"), "slices-engine",
                                           f"{tpu.slices} slices train data-parallel over the data-center network "
                                           f"(multislice), which only JAX does; the {about.display} has no such "
                                           "training",
                                           "set run.engine: jax, or tpu.slices: 1 and a larger tpu.type"))
        elif gke is None and tpu_type.generation.prefix not in MULTISLICE_PREFIXES:
            problems.append(loaded.problem(("tpu", "type"), "slices-tpu-type",
                                           f"{tpu.slices} slices on TPU VMs are one multislice queued resource, "
                                           f"which Cloud TPU makes of v4, v5e, v5p and v6e slices, not "
                                           f"{tpu_type.generation.name}",
                                           "choose a v4, v5e (v5litepod), v5p or v6e type, or tpu.slices: 1"))
        elif gke is not None and tpu_type.hosts < 2:
            problems.append(loaded.problem(("tpu", "slices"), "slices-single-host",
                                           f"GKE runs multislice only on multi-host slices; {tpu_type.name} is one "
                                           "host",
                                           "choose a multi-host tpu.type (e.g. v6e-16, v5litepod-16, v4-16), or "
                                           "tpu.slices: 1"))
    return problems
