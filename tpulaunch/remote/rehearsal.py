"""This machine as Cloud TPU, for `tpulaunch rehearse`: the local Cloud TPU API v2 server (`tpu/local_api.py`)
in this process, whose TPU VMs are local processes (`tpu/local_vm.py`) running the node's startup script, and
preemptions on cue (`--preempt-at STEP`: the VM's processes killed at that step, the node PREEMPTED).

What stands for what: run.model_dir and the job's data as local folders stand for the bucket (gs:// ones are
used as they are); a folder (`--secrets DIR`, the file NAME for secret NAME) stands for Secret Manager, served by
the same local server, which gives a VM a secret's value only with its token, as the real one; each host's disk
is a scratch folder; the install reuses this machine's Python environment
(nothing is installed); the VM trains on this machine's CPU (`train --local`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Callable, List, Optional, Sequence

from tpulaunch.run import rehearsal_hold
from tpulaunch.tpu.local_api import STOCKOUT_ENV, TpuApiServer


def hosts_environment(root: str, preempt_at: Sequence[int] = ()) -> dict:
    """The environment a rehearsal's hosts run in: this machine's, and where `--preempt-at` holds the chief's train
    (`run/rehearsal_hold.py`: the preemption lands at the host's own step, whatever the log cadence)."""
    if not preempt_at:
        return dict(os.environ)
    folder = os.path.join(root, "holds")
    os.makedirs(folder, exist_ok=True)
    return {**os.environ, **rehearsal_hold.environment(preempt_at, folder)}


class Rehearsal:
    def __init__(self, *, hosts: Optional[int] = None, secrets_dir: Optional[str] = None,
                 preempt_at: Sequence[int] = ()):
        self.root = tempfile.mkdtemp(prefix="tpulaunch-rehearsal-")
        self.server = TpuApiServer().start()
        self.server.secrets_from(secrets_dir)  # a folder stands for Secret Manager: the file NAME is secret NAME
        self.server.stockouts_from(os.environ.get(STOCKOUT_ENV, ""))  # zones without capacity, to rehearse fallback
        self.server.run_vms(self.root, env=hosts_environment(self.root, preempt_at), hosts=hosts)

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
