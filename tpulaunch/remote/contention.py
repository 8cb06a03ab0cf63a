"""Who else writes run.model_dir: its lease's live holder, and whether that is the train of a VM an earlier run
left behind.

A VM's `train` writes model_dir only while it holds model_dir's lease (`run/lease.py`), so a second writer shows
there first. The controller reads the lease before it creates a VM (`controller.py`): a live holder that is the
train of one of model_dir's VMs (its host and pid, as that VM's status says) whose TPU node no API knows — a
rehearsal killed with its local API leaves its VM's processes training — is an orphan, stopped before a new VM
starts; any other live holder refuses the run before anything is created. The host runner reads it when its
train failed (`host.py`): a train refused the lease, or whose lease another run took over, failed for
contention, not for a fault of the job's.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Iterable, Optional, Tuple

from tpulaunch.remote.follow import host_status

STOP_WAIT_S = 120.0  # an orphan's train, sent SIGTERM, saves a checkpoint and ends within this (else it is killed)


def live_holder(model_dir: str) -> Optional[dict]:
    """The lease as its holder wrote it while a run holds it (held, renewed within its stale time, its process not
    known to be gone), else None (no lease, released, stale, or unreadable: the VM's train says what is wrong)."""
    from tpulaunch.run import lease as leases

    try:
        data = leases.read_lease(model_dir)
    except leases.LeaseRefused:
        return None
    if data is None or leases.lease_state(data, time.time()) != "held" or leases.holder_gone(data):
        return None
    return data


def held_by_other(model_dir: str, host: str, pid: int) -> Optional[dict]:
    """The live holder of model_dir's lease when it is not the process `pid` on `host`, else None."""
    holder = live_holder(model_dir)
    if holder is not None and (holder.get("host"), holder.get("pid")) != (host, pid):
        return holder
    return None


def orphan_vm(model_dir: str, holder: dict, vms: Iterable[int]) -> Optional[Tuple[int, dict]]:
    """The VM of model_dir (of `vms`, the newest first) whose chief's train is `holder`, with that host's status."""
    for vm in vms:
        status = host_status(model_dir, vm, 0)
        if status and status.get("host") == holder.get("host") and status.get("train_pid") == holder.get("pid"):
            return vm, status
    return None


def _still_holds(model_dir: str, holder: dict) -> bool:
    now = live_holder(model_dir)
    return now is not None and now.get("run_id") == holder.get("run_id")


def stop_local(model_dir: str, holder: dict, wait_s: float = STOP_WAIT_S, poll_s: float = 0.2) -> str:
    """Stop an orphan's train that runs on this machine (`holder`, its lease) as a VM shutting down does: SIGTERM,
    on which train saves a checkpoint, releases the lease and exits 143; its process group (the VM's host) is
    killed, and the lease released for it, when it has not ended within `wait_s`. How it ended, in words."""
    pid = int(holder["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not _still_holds(model_dir, holder):
            return "it saved a checkpoint and released the lease (SIGTERM)"
        time.sleep(poll_s)
    try:
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    except ProcessLookupError:
        pass
    from tpulaunch.run.lease import release_lost_holder

    release_lost_holder(model_dir, host=holder["host"], pid=pid, why="tpulaunch run: an orphan VM, stopped")
    return f"killed: it had not ended {wait_s:g} s after SIGTERM (its lease released for it)"
