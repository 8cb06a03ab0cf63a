"""The rules of train's and evaluate's own options, held against the job's engine and Plan before the run starts."""

from __future__ import annotations

from typing import Optional

from tpulaunch.errors import TpuLaunchError


def cpu_replicas_for(engine: str, cpu_replicas: Optional[int], plan) -> Optional[int]:
    """`--cpu-replicas` for the engine (None when not asked): only an engine that splits this machine into
    replicas (`EngineAbout.layout.cpu_replicas`) runs them, and only on this machine. Every engine takes the option; this
    is the one place that refuses it.

    Raises:
        TpuLaunchError: the job's engine cannot, or the run is on a TPU.
    """
    if cpu_replicas is None:
        return None
    from tpulaunch.seam.registry import about, names

    if not about(engine).layout.cpu_replicas:
        able = " or ".join(name for name in names() if about(name).layout.cpu_replicas)
        raise TpuLaunchError(f"--cpu-replicas needs an engine that splits this machine into replicas ({able})",
                             hint=f"set run.engine: {able}, or drop --cpu-replicas")
    if plan.on_tpu:
        raise TpuLaunchError("--cpu-replicas runs on this machine", hint="add --local, or drop --cpu-replicas")
    return cpu_replicas
