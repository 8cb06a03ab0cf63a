"""TPU VMs as local processes, for the local Cloud TPU API server (`tpu/local_api.py`) and `tpulaunch rehearse`.

On Cloud TPU, every host of a slice is a VM that, when it boots, runs the `startup-script` in its node's
metadata as root and learns its place from the metadata server (`agent-worker-number`, `accelerator-type`,
`worker-network-endpoints`, the node's own metadata keys), asked over HTTP with the `Metadata-Flavor: Google`
header. Here each host is one process (`bash startup-script`) in a process group of its own, with a scratch
folder of its own as its disk (the script's working directory and $HOME), and its metadata served by the local
API server under a prefix of its own, named to the script by $TPULAUNCH_METADATA_URL (the real script falls back
to http://metadata.google.internal/computeMetadata/v1/), its service account's token among it; the server's
Secret Manager (`$TPULAUNCH_SECRET_MANAGER_URL`) answers a secret's value to that token only. Deleting or
preempting the node kills every host's process group at once, as losing the VM does: nothing the processes do
after that point happens.

What differs from a real TPU VM, said where it matters: the hosts share this machine (its Python, its files,
its network), run as the current user, and have no TPU. Their `worker-network-endpoints` are 127.0.0.1 with a
free port each, so that hosts that talk to each other (a multi-worker cluster) can.

Faults to rehearse, by worker numbers (separated by commas in the environment variables):

- `fail_install` ($TPULAUNCH_LOCAL_VM_FAIL_INSTALL): those hosts fail their startup script's install step: they
  are given $TPULAUNCH_REHEARSAL_REQUIRE, a package that is not installed, which a rehearsal's install check
  (`remote/startup.sh`) then reports as pip would;
- `hang` ($TPULAUNCH_LOCAL_VM_HANG): those hosts never run their startup script (a VM host that hangs at boot):
  they sleep until the node is deleted.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Set

from tpulaunch.tpu.lifecycle import GUEST_ATTRIBUTES_KEY

METADATA_URL_ENV = "TPULAUNCH_METADATA_URL"
SECRET_MANAGER_URL_ENV = "TPULAUNCH_SECRET_MANAGER_URL"  # the local server's Secret Manager (remote/secret_manager.py)
TOKEN_PATH = "instance/service-accounts/default/token"
METADATA_PREFIX = "/vm/"  # /vm/<vm id>/<worker>/computeMetadata/v1/...
GUEST_PREFIX = "instance/guest-attributes/"  # what a host writes of itself (PUT NS/KEY), read through the API
SCRIPT_LOG = "startup-script.log"  # on each host's disk: what the startup script printed
FAIL_INSTALL_ENV = "TPULAUNCH_LOCAL_VM_FAIL_INSTALL"  # workers whose install fails, e.g. "1" or "1,3"
HANG_ENV = "TPULAUNCH_LOCAL_VM_HANG"  # workers that never run their startup script
REQUIRE_ENV = "TPULAUNCH_REHEARSAL_REQUIRE"  # an extra requirement a rehearsal's install checks for
MISSING_PACKAGE = "tpulaunch-rehearsal-missing-package"


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _workers(text: str) -> Set[int]:
    return {int(item) for item in text.replace(" ", "").split(",") if item.isdigit()}


@dataclass
class Host:
    worker: int
    disk: str
    process: subprocess.Popen

    @property
    def running(self) -> bool:
        return self.process.poll() is None


@dataclass
class Vm:
    """One boot of a node's hosts: `vm_id` is new for every create (a recreated node is a new VM)."""

    vm_id: str
    node: str  # the node's full resource name
    accelerator_type: str
    metadata: Dict[str, str]
    endpoints: List[str]
    hosts: List[Host] = field(default_factory=list)
    guest: Dict[int, Dict[str, str]] = field(default_factory=dict)  # worker -> "NS/KEY" -> what it set there
    tpu_env: str = ""  # its `tpu-env` attribute (a multislice queued resource's slice: MEGASCALE_* values)

    @property
    def guest_attributes_enabled(self) -> bool:
        """As on Compute Engine: a VM's guest attributes are writable only when its metadata enables them."""
        return str(self.metadata.get(GUEST_ATTRIBUTES_KEY, "")).upper() == "TRUE"

    def attributes(self, worker: int) -> Dict[str, str]:
        """What host `worker` reads under instance/attributes/ (the node's own metadata included)."""
        return {**self.metadata, "agent-worker-number": str(worker), "accelerator-type": self.accelerator_type,
                "worker-network-endpoints": ",".join(self.endpoints),
                **({"tpu-env": self.tpu_env} if self.tpu_env else {})}


class LocalVms:
    """The TPU VMs of a local API server: booted when a node turns READY, killed when it is deleted or preempted.

    Args:
        root: where the hosts' disks go (`<root>/<node name>-<vm id>/worker-<i>`).
        env: the environment every host process starts with (this machine's, in a rehearsal).
        hosts: hosts per slice (None: as many as the accelerator type has, `tpu/types.py`).
        fail_install: workers whose startup script's install fails (None: $TPULAUNCH_LOCAL_VM_FAIL_INSTALL's).
        hang: workers that never run their startup script (None: $TPULAUNCH_LOCAL_VM_HANG's).
    """

    def __init__(self, root: str, env: Optional[Mapping[str, str]] = None, hosts: Optional[int] = None,
                 fail_install: Optional[Iterable[int]] = None, hang: Optional[Iterable[int]] = None):
        self.root = os.path.abspath(root)
        self.env = dict(os.environ if env is None else env)
        self.hosts = hosts
        self.fail_install = set(fail_install) if fail_install is not None else _workers(
            self.env.get(FAIL_INSTALL_ENV, ""))
        self.hang = set(hang) if hang is not None else _workers(self.env.get(HANG_ENV, ""))
        self.vms: Dict[str, Vm] = {}  # vm id -> Vm (also the halted ones: their disks stay for inspection)
        self.booted: List[str] = []  # vm ids, in boot order
        self.token = secrets.token_urlsafe(24)  # the VMs' service account's token (Secret Manager asks for it)
        self._lock = threading.Lock()

    def host_count(self, accelerator_type: str) -> int:
        if self.hosts:
            return self.hosts
        from tpulaunch.tpu.types import lookup

        found = lookup(accelerator_type)
        return found.hosts if found else 1

    def boot(self, node: dict, metadata_root: str,
             tpu_env: Callable[[List[str]], str] = lambda endpoints: "") -> Optional[Vm]:
        """Start every host of `node` (its API JSON), each running the node's startup script when it has one.

        `metadata_root` is the server's URL; each host's metadata lives under `<metadata_root>vm/<id>/<worker>/`;
        `tpu_env` gives its `tpu-env` attribute from its hosts' endpoints.
        """
        accelerator_type = node.get("acceleratorType") or "v3-8"
        count = self.host_count(accelerator_type)
        endpoints = [f"127.0.0.1:{_free_port()}" for i in range(count)]
        vm = Vm(secrets.token_hex(4), node["name"], accelerator_type, dict(node.get("metadata") or {}), endpoints,
                tpu_env=tpu_env(endpoints))
        short = node["name"].rsplit("/", 1)[-1]
        script = vm.metadata.get("startup-script")
        with self._lock:  # its metadata is served before any host starts: a host's first act is to read it
            self.vms[vm.vm_id] = vm
            self.booted.append(vm.vm_id)
        for worker in range(count):
            disk = os.path.join(self.root, f"{short}-{vm.vm_id}", f"worker-{worker}")
            os.makedirs(disk, exist_ok=True)
            env = {**self.env, "HOME": disk,
                   METADATA_URL_ENV: f"{metadata_root}vm/{vm.vm_id}/{worker}/computeMetadata/v1/",
                   SECRET_MANAGER_URL_ENV: f"{metadata_root}secretmanager/v1/"}
            if worker in self.fail_install:
                env[REQUIRE_ENV] = MISSING_PACKAGE
            if script is None or worker in self.hang:
                command = ["sleep", "infinity"]  # a VM with nothing to run (or hung) lives until it is deleted
            else:
                path = os.path.join(disk, "startup-script")
                with open(path, "w") as handle:
                    handle.write(script)
                command = ["bash", path]
            with open(os.path.join(disk, SCRIPT_LOG), "ab") as log:
                process = subprocess.Popen(command, cwd=disk, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)
            vm.hosts.append(Host(worker, disk, process))
        return vm

    def halt(self, node_name: str) -> int:
        """Kill every process of the node's running VM (each host's whole process group); how many hosts ran."""
        killed = 0
        with self._lock:
            vms = [vm for vm in self.vms.values() if vm.node == node_name]
        for vm in vms:
            for host in vm.hosts:
                if host.running:
                    killed += 1
                try:
                    os.killpg(host.process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                host.process.wait()
        return killed

    def halt_all(self) -> None:
        with self._lock:
            names = {vm.node for vm in self.vms.values()}
        for name in names:
            self.halt(name)

    def running(self, node_name: str) -> Optional[Vm]:
        """The node's VM whose hosts still run, if any."""
        with self._lock:
            for vm in self.vms.values():
                if vm.node == node_name and any(host.running for host in vm.hosts):
                    return vm
        return None

    def _host_path(self, path: str):
        """(its Vm, the worker, the rest of the path) for `path` after `/vm/`, or None."""
        parts = path.split("/", 4)
        if len(parts) < 5 or parts[2:4] != ["computeMetadata", "v1"] or not parts[1].isdigit():
            return None
        with self._lock:
            vm = self.vms.get(parts[0])
        if vm is None or int(parts[1]) >= len(vm.endpoints):  # every host of the slice, started or starting
            return None
        return vm, int(parts[1]), parts[4]

    def put_guest_attribute(self, path: str, value: str) -> Optional[int]:
        """A host setting one of its guest attributes (`<vm id>/<worker>/computeMetadata/v1/instance/
        guest-attributes/NS/KEY`): the HTTP status the metadata server answers."""
        found = self._host_path(path)
        if found is None or not found[2].startswith(GUEST_PREFIX) or found[2].count("/") != 3:
            return 404
        vm, worker, rest = found
        if not vm.guest_attributes_enabled:
            return 403  # "Guest attributes endpoint access is disabled."
        with self._lock:
            vm.guest.setdefault(worker, {})[rest[len(GUEST_PREFIX):]] = value
        return 200

    def guest_attributes(self, node_name: str, namespace: str) -> Optional[List[Dict[str, str]]]:
        """Each host's guest attributes under `namespace` (key -> value, in worker order) of the node's newest VM,
        or None when it has none."""
        with self._lock:
            vms = [self.vms[vm_id] for vm_id in self.booted if self.vms[vm_id].node == node_name]
            if not vms:
                return None
            vm = vms[-1]
            prefix = namespace.strip("/") + "/"
            return [{key[len(prefix):]: value for key, value in vm.guest.get(worker, {}).items()
                     if key.startswith(prefix)} for worker in range(len(vm.endpoints))]

    def metadata(self, path: str) -> Optional[str]:
        """The value at `path` (after `/vm/`: `<vm id>/<worker>/computeMetadata/v1/instance/...`), or None."""
        found = self._host_path(path)
        if found is None:
            return None
        vm, worker, rest = found
        if rest.startswith("instance/attributes/"):
            return vm.attributes(worker).get(rest[len("instance/attributes/"):])
        if rest == TOKEN_PATH:  # the service account's access token, as the metadata server gives it
            import json

            return json.dumps({"access_token": self.token, "expires_in": 3599, "token_type": "Bearer"})
        return {"instance/id": f"{vm.vm_id}-{worker}", "instance/hostname": f"{vm.vm_id}-w-{worker}",
                "instance/zone": f"projects/0/zones/{vm.node.split('/')[3]}",
                "project/project-id": vm.node.split("/")[1]}.get(rest)
