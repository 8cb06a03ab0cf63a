"""Why a remote run stopped, and whether `tpulaunch run --recreate N` recovers from it: by cause, never blindly.

Infrastructure failures are recovered (at most N times): the TPU VM is deleted, created again with the same
startup script, and the job resumes from its newest complete checkpoint. The job's own failures are never
retried: the run ends with the host's message and its exit code, since rerunning a bad job, a NaN or a crash
fails the same way and costs TPU time.

| what the controller sees | cause |
|---|---|
| the node PREEMPTED, TERMINATED, being deleted, or gone | infrastructure |
| worker 0's train exited 3: the TPU was lost under it (TensorFlow's lost-TPU errors) | infrastructure |
| exited 137 or 143 (SIGKILL, SIGTERM: the VM shutting down), or killed by another signal (129-255, not 130) | infrastructure |
| exited 1 (the job's mistake, a NaN loss, a failed graph), 2, 70 (a crash), 130 (stopped by hand on the VM), any other | the job's |
| a host not started within --host-timeout (hung at boot, or cannot write model_dir) | infrastructure |
| a host whose startup script failed a step (its install): the same script fails the same way on a new VM | not retried |
| worker 0's train refused model_dir's lease, or its lease taken over (exit 1 or 5 with another live holder, as its status's `lease_holder` says): another run writes model_dir | contention: not retried, the holder named |

On a multi-host slice the exit codes are those of every host that trains (worker 0's, or each host's for an
engine whose hosts all train).
"""

from __future__ import annotations

from typing import Optional

from tpulaunch.errors import ExitCode
from tpulaunch.tpu import node as cluster

INFRASTRUCTURE = "infrastructure"
JOB = "job"
CONTENTION = "contention"  # another run holds model_dir's lease: neither the job's failure nor a lost VM

LOST_TPU_EXIT = int(ExitCode.CLUSTER)  # train's own exit code when the TPU it drove was lost


def node_cause(state: Optional[str]) -> Optional[str]:
    """INFRASTRUCTURE for a node state that no longer runs the job (None: missing), else None."""
    state = state or cluster.NOT_FOUND
    return INFRASTRUCTURE if state in cluster.RECREATE_STATES else None


def exit_cause(code: int) -> str:
    """Whether the host's exit code is an infrastructure failure or the job's own."""
    if code == LOST_TPU_EXIT:
        return INFRASTRUCTURE
    if code > 128 and code != int(ExitCode.INTERRUPTED):
        return INFRASTRUCTURE  # killed by a signal: the VM went down under it
    return JOB


def infrastructure_exit_codes() -> list:
    """The exit codes (1-255) a recovery answers, as `exit_cause` reads them: what a JobSet restarts on and fails on
    none of (`jobset.py`), so both `run` targets recover from the same causes."""
    return [code for code in range(1, 256) if exit_cause(code) == INFRASTRUCTURE]


def exit_text(code: int) -> str:
    names = {1: "the job failed", 2: "a usage error", 3: "the TPU was lost", 4: "no capacity",
             70: "tpulaunch crashed", 130: "stopped by hand (SIGINT)", 137: "killed (SIGKILL)",
             143: "stopped (SIGTERM: the VM shut down)"}
    return f"exit code {code}" + (f": {names[code]}" if code in names else "")
