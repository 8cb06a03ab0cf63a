"""The jax engine over several hosts: every host runs `tpulaunch train`, joins the others through
`jax.distributed.initialize()` before anything asks JAX for its devices, feeds its own share of each batch, and
only process 0 (the chief) writes model_dir.

Which process this is comes from $TF_CONFIG, the multi-worker convention `run/workers.py` reads and `remote/host.py`
gives every host of a multi-host slice (an "every" engine), so the keras engine's workers and this engine's hosts
agree on who is the chief. On a TPU VM JAX finds its peers itself (the TPU's metadata); anywhere else (a rehearsal,
the tests) the coordinator is the first worker's address in $TF_CONFIG, and CPU devices talk through gloo.
"""

from __future__ import annotations

import json
import os
from typing import Callable, List, Optional, Tuple

_JOINED: List[bool] = []  # jax.distributed.initialize() runs once per process


def workers() -> Optional[Tuple[List[str], int]]:
    """(the workers' addresses, this process's index) when $TF_CONFIG names several workers; None otherwise."""
    from tpulaunch.run.workers import worker_task

    task = worker_task()
    if task is None:
        return None
    cluster = json.loads(os.environ["TF_CONFIG"]).get("cluster", {})
    addresses = list(cluster.get("chief", [])) + list(cluster.get("worker", []))
    if len(addresses) < 2:
        return None
    kind, index = task
    return addresses, index + (len(cluster.get("chief", [])) if kind == "worker" else 0)


def join(*, on_tpu: bool, say: Callable[[str], None] = lambda text: None) -> int:
    """Join the other hosts (once per process, before JAX picks its devices); how many processes train. It waits
    for all of them, and a peer that never comes makes JAX end this process itself after its timeout (5 minutes,
    "Terminating process because the JAX distributed service detected fatal errors"), so it says first what it
    waits for."""
    import jax

    from tpulaunch.errors import TpuLaunchError, first_line

    found = workers()
    if found is None:
        return 1
    addresses, index = found
    if _JOINED:
        return len(addresses)
    coordinator = "the TPU VM's metadata" if on_tpu else addresses[0]
    say(f"jax | joining {len(addresses)} hosts as host {index} ($TF_CONFIG), coordinator {coordinator}")
    try:
        if on_tpu:
            jax.distributed.initialize()  # the TPU VM's metadata names the coordinator, the count and this host
        else:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices across processes
            jax.distributed.initialize(coordinator_address=addresses[0], num_processes=len(addresses),
                                       process_id=index)
    except Exception as exc:  # what JAX raises rather than ending the process (an address it cannot use)
        raise TpuLaunchError(f"host {index} could not join the other {len(addresses) - 1} through jax.distributed "
                             f"(coordinator {coordinator}): {type(exc).__name__}: {first_line(exc)[:300]}",
                             hint="every host of $TF_CONFIG's cluster must run the job; unset TF_CONFIG to train "
                                  "on this machine alone") from None
    _JOINED.append(True)
    if jax.process_count() != len(addresses):  # JAX's peers (a TPU VM's metadata) against $TF_CONFIG's
        raise TpuLaunchError(f"JAX joined {jax.process_count()} processes where $TF_CONFIG names {len(addresses)} "
                             "hosts", hint="run the job with the $TF_CONFIG `tpulaunch run` gives each host of the "
                                           "slice (remote/host.py)")
    return len(addresses)


def hosts_problems(loaded, code: str) -> list:
    """A spatial split (partition:) on a slice of several hosts is not run yet: each host would feed a share of the
    batch that a split dim spans across hosts. Pure Python (validate --static)."""
    from tpulaunch.tpu.types import lookup

    tpu = loaded.section("tpu")
    found = lookup(tpu.type) if tpu is not None and loaded.usable("tpu") else None
    if loaded.section("partition") is None or found is None or found.hosts < 2:
        return []
    return [loaded.problem(("partition",), code, f"the jax engine splits inputs spatially on one host so far; "
                           f"{found.name} has {found.hosts} hosts", "remove partition: (data-parallel over every "
                           "host's chips), or choose a one-host type")]


def refuse_split_over_hosts(layout) -> None:
    """The same at train time, where the hosts come from $TF_CONFIG (a rehearsal's, whose train runs --local)."""
    from tpulaunch.errors import TpuLaunchError

    count = share()[1]
    if layout.split is not None and count > 1:
        raise TpuLaunchError(f"the jax engine splits inputs spatially on one host so far; this run has {count} hosts",
                             hint="remove partition:, or train on one host")


def share() -> Tuple[int, int]:
    """(this process's index, how many processes feed the batch): each reads and feeds 1/count of it."""
    import jax

    return jax.process_index(), jax.process_count()
