"""This machine as Cloud TPU, for `tpulaunch rehearse`: the local Cloud TPU API v2 server (`tpu/local_api.py`)
in this process, whose TPU VMs are local processes (`tpu/local_vm.py`) running the node's startup script, and
preemptions on cue (`--preempt-at STEP`: the VM's processes killed at that step, the node PREEMPTED).

What stands for what: run.model_dir and the job's data as local folders stand for the bucket (gs:// ones are
used as they are); a folder (`--secrets DIR`, the file NAME for secret NAME) stands for Secret Manager, served by
the same local server, which gives a VM a secret's value only with its token, as the real one; each host's disk
is a scratch folder; the install reuses this machine's Python environment (nothing is installed), or, with
`--install`, is the TPU VM's own (`remote/startup.sh`: a venv made by `python3 -m venv`, the job's requirements
installed into it from the package index, the run's wheelhouse kept under run.model_dir and reused by every later
host), with this machine's base Python as the image's `python3` (`installing_environment`); the VM trains on this
machine's CPU (`train --local`).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import Callable, List, Optional, Sequence

from tpulaunch.run import rehearsal_hold
from tpulaunch.tpu.local_api import STOCKOUT_ENV, TpuApiServer


# What would make a host's install other than a fresh TPU VM's: this process's venv and import path, and a pip cache
# or user site shared with this machine (a host's $HOME is its own disk, so its pip cache starts empty)
NOT_ON_A_FRESH_VM = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "XDG_CACHE_HOME", "PIP_CACHE_DIR",
                     "PIP_NO_CACHE_DIR", "PIP_USER", "PIP_REQUIRE_VIRTUALENV", "PIP_TARGET", "PIP_PREFIX")


def base_python() -> str:
    """This machine's Python beneath any venv it runs in: what a `--install` rehearsal's hosts make their venv with."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def installing_environment(env: dict, root: str, python: Optional[str] = None) -> dict:
    """`env` for hosts that run the startup script's real install (`rehearse --install`): `python3` on PATH is this
    machine's base Python (`python`, default `base_python()`), standing for the TPU image's; what would tie the
    install to this process's environment is dropped. This machine's pip configuration (its index, certificates,
    proxy) stays: it is how pip reaches the package index from here."""
    folder = os.path.join(root, "bin")
    os.makedirs(folder, exist_ok=True)
    link = os.path.join(folder, "python3")
    if not os.path.lexists(link):
        os.symlink(python or base_python(), link)
    clean = {key: value for key, value in env.items() if key not in NOT_ON_A_FRESH_VM}
    clean["PATH"] = folder + os.pathsep + env.get("PATH", os.defpath)
    return clean


def hosts_environment(root: str, preempt_at: Sequence[int] = (), install: bool = False) -> dict:
    """The environment a rehearsal's hosts run in: this machine's, and where `--preempt-at` holds the chief's train
    (`run/rehearsal_hold.py`: the preemption lands at the host's own step, whatever the log cadence); `install`: made
    for the startup script's real install (`installing_environment`)."""
    env = dict(os.environ)
    if preempt_at:
        folder = os.path.join(root, "holds")
        os.makedirs(folder, exist_ok=True)
        env.update(rehearsal_hold.environment(preempt_at, folder))
    return installing_environment(env, root) if install else env


class Rehearsal:
    def __init__(self, *, hosts: Optional[int] = None, secrets_dir: Optional[str] = None,
                 preempt_at: Sequence[int] = (), install: bool = False):
        self.root = tempfile.mkdtemp(prefix="tpulaunch-rehearsal-")
        self.server = TpuApiServer().start()
        self.server.secrets_from(secrets_dir)  # a folder stands for Secret Manager: the file NAME is secret NAME
        self.server.stockouts_from(os.environ.get(STOCKOUT_ENV, ""))  # zones without capacity, to rehearse fallback
        self.server.run_vms(self.root, env=hosts_environment(self.root, preempt_at, install), hosts=hosts)

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def preempting(self, node: Callable[[], object], steps: Sequence[int],
                   say: Callable[[str], None]) -> Callable[[int], None]:
        """A controller's `on_step` that preempts the node (`node()`: its NodeRef now, in the zone it was created
        in) once at each of `steps` (global steps, in order)."""
        pending: List[int] = sorted(steps)

        def on_step(step: int) -> None:
            if pending and step >= pending[0]:
                pending.pop(0)
                ref = node()
                killed = self.server.preempt(ref.name, ref.project, ref.zone)
                say(f"rehearsal | preempted TPU node '{ref.name}' at step {step}: {killed} host process"
                    f"{'es' if killed != 1 else ''} killed, the node PREEMPTED")

        return on_step

    def stop(self, *, keep_disks: bool = False) -> None:
        """Stop the server and every VM it still runs; the hosts' disks are removed unless kept."""
        self.server.stop()
        if not keep_disks:
            shutil.rmtree(self.root, ignore_errors=True)
