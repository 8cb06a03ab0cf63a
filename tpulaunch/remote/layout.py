"""Where a remote run keeps its files under run.model_dir (one place for every path)::

    model_dir/tpulaunch-remote/
        blobs/<sha256>                 staged files, named by their content (the job, its code, tpulaunch)
        stages/<sha256>.json           a stage's manifest: what the VM fetches and runs (named by its content)
        run.json                       the controller's record: the node, each VM it created, each recovery
        wheelhouse/<key>.tar, .json    the job's requirements as wheels, kept by the first host that installed them
                                       from the package index, for every later one (`boot_tools.py`)
        attempts/<n>/vm.json           the n-th VM's claim on its number: the run and stage it was created for
        attempts/<n>/worker-<i>.log    what host i of the n-th VM printed (`tpulaunch train`'s lines)
        attempts/<n>/worker-<i>.json   that host's status: its phase, when it booted, installed, started, how it ended
        attempts/<n>/worker-<i>.startup.log   its startup script's output, when a step of it failed

`n` numbers every VM created for this model_dir (the node's `tpulaunch-attempt` metadata), by all its runs: a
run's first VM takes the number after the last one taken (claimed with `vm.json` before the node is created),
so no run reads another run's files (a failed run's status, a shorter run's end), and a recreated node writes a
new folder, so the lines of a VM that was lost stay next to those of the one that replaced it.
"""

from __future__ import annotations

REMOTE_DIR = "tpulaunch-remote"
ATTEMPT_KEY = "tpulaunch-attempt"  # node metadata: which VM of the run this is
STAGE_KEY = "tpulaunch-stage"  # node metadata: the stage's digest (a node running another job is not reattached)
STARTUP_KEY = "startup-script"  # node metadata every TPU VM host runs at boot
GUEST_NAMESPACE, GUEST_FAILED_KEY = "tpulaunch", "failed"  # a host's failure that run.model_dir could not carry


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *[str(part).strip("/") for part in parts]])


def remote_dir(model_dir: str) -> str:
    return join(model_dir, REMOTE_DIR)


def blob(model_dir: str, digest: str) -> str:
    return join(remote_dir(model_dir), "blobs", digest)


def manifest(model_dir: str, digest: str) -> str:
    return join(remote_dir(model_dir), "stages", f"{digest}.json")


def wheelhouse(model_dir: str) -> str:
    return join(remote_dir(model_dir), "wheelhouse")


def run_record(model_dir: str) -> str:
    return join(remote_dir(model_dir), "run.json")


def attempts(model_dir: str) -> str:
    return join(remote_dir(model_dir), "attempts")


def vm_claim(model_dir: str, attempt: int) -> str:
    return join(attempts(model_dir), str(attempt), "vm.json")


def host_startup_log(model_dir: str, attempt: int, worker: int) -> str:
    return join(attempts(model_dir), str(attempt), f"worker-{worker}.startup.log")


def host_log(model_dir: str, attempt: int, worker: int) -> str:
    return join(remote_dir(model_dir), "attempts", str(attempt), f"worker-{worker}.log")


def host_status(model_dir: str, attempt: int, worker: int) -> str:
    return join(remote_dir(model_dir), "attempts", str(attempt), f"worker-{worker}.json")
