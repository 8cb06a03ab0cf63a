"""A JobSet run on this machine, for `tpulaunch rehearse` of a job with gke:: the JobSet `run` would submit, its pods
local processes, JobSet's documented failure handling applied to them.

Which part is whose:
- the manifest, the startup script each pod runs, the host runner and `tpulaunch train` are the real ones (those of
  `tpulaunch run`), and so is every environment variable the manifest sets;
- what GKE and JobSet give a pod is modelled here: `TPU_WORKER_ID` (the pod's index in its slice),
  `TPU_WORKER_HOSTNAMES` (its slice's hosts), the downward API's values of the slice's Job index and the JobSet's
  restart attempt, and the pods' DNS names, which become 127.0.0.1 with a free port each (no cluster DNS here);
- the failure handling is JobSet's as its documentation states it: a pod failed with an exit code its Job's pod
  failure policy lists (`FailJob`) fails its Job with reason PodFailurePolicy, which the JobSet's failure policy
  turns into `FailJobSet`; any other failure (an exit code outside the list, a preempted pod: SIGTERM, then SIGKILL
  after the grace period) fails the Job by its backoff limit of 0, and the JobSet restarts (every pod of every slice
  recreated, the restart attempt one more) until `maxRestarts`, after which it fails. The JobSet completes when
  every pod exits 0. Kueue's admission and the scheduler are not modelled (every pod starts at once).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from tpulaunch.remote import jobset
from tpulaunch.remote.follow import HostLog, Recovery
from tpulaunch.tpu import multislice

Say = Callable[[str], None]
REHEARSAL_GRACE_S = 15


@dataclass
class Pod:
    slice_index: int
    host: int
    process: subprocess.Popen
    log: str

    @property
    def name(self) -> str:
        return f"slice {self.slice_index} host {self.host}"

    def exit_code(self) -> Optional[int]:
        """The container's exit code as Kubernetes reports it (128 + N when a signal N ended it), None if running.
        A container's processes end with its first one: what it leaves running is killed then."""
        code = self.process.poll()
        if code is None:
            return None
        self.kill_all()
        return 128 - code if code < 0 else code

    def terminate(self) -> None:
        """The kubelet's SIGTERM, which reaches the container's first process only."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def kill_all(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalJobSet:
    """Run `manifest` (a JobSet of tpulaunch's) with local processes for pods; `run()` returns how it ended."""

    def __init__(self, manifest: dict, model_dir: str, *, say: Say, out: Say, preempt_at: Sequence[int] = (),
                 poll_s: float = 0.2, hosts_environment: Callable[[str], Dict[str, str]] = lambda root: dict(os.environ),
                 keep_disks: bool = False):
        self.manifest, self.model_dir, self.say, self.out = manifest, model_dir, say, out
        self.pending = sorted(preempt_at)
        self.poll_s, self.keep_disks = poll_s, keep_disks
        self.root = tempfile.mkdtemp(prefix="tpulaunch-jobset-")
        self.env = hosts_environment(self.root)  # this machine's, with where --preempt-at holds the chief
        replicated = manifest["spec"]["replicatedJobs"][0]
        self.slices = replicated["replicas"]
        self.job_spec = replicated["template"]["spec"]
        self.hosts = self.job_spec["parallelism"]
        self.container = self.job_spec["template"]["spec"]["containers"][0]
        # the pods' grace period, at most REHEARSAL_GRACE_S here: a rehearsal need not wait a real one out
        self.grace_s = min(self.job_spec["template"]["spec"].get("terminationGracePeriodSeconds", 30), REHEARSAL_GRACE_S)
        self.max_restarts = manifest["spec"]["failurePolicy"]["maxRestarts"]
        self.restarts = 0
        self.recovery = Recovery()  # each restart's time back to training, said as `run` on GKE says it
        self._log: Optional[HostLog] = None  # the chief's log of the newest generation of pods
        self._failed_at = 0.0  # when a pod of it was seen failed
        env = {item["name"]: item.get("value") for item in self.container.get("env", [])}
        self.attempt_base = int(env.get("TPULAUNCH_ATTEMPT_BASE") or 0)  # model_dir's earlier runs' VMs

    # ------------------------------------------------------------------------------------------ JobSet's behaviour

    def fails_the_jobset(self, code: int) -> bool:
        """The pod failure policy's FailJob rule, and the JobSet's FailJobSet on reason PodFailurePolicy."""
        for rule in self.job_spec.get("podFailurePolicy", {}).get("rules", []):
            exits = rule.get("onExitCodes")
            if rule["action"] != "FailJob" or not exits:
                continue
            listed = code in exits["values"]
            if listed if exits["operator"] == "In" else not listed:
                return any("PodFailurePolicy" in r.get("onJobFailureReasons", []) and r["action"] == "FailJobSet"
                           for r in self.manifest["spec"]["failurePolicy"].get("rules", []))
        return False

    def run(self) -> int:
        name = self.manifest["metadata"]["name"]
        self.say(f"rehearsal | JobSet '{name}': {self.slices} slice{'s' if self.slices > 1 else ''} of "
                 f"{self.hosts} host{'s' if self.hosts > 1 else ''}, each pod a local process, at most "
                 f"{self.max_restarts} restart{'s' if self.max_restarts != 1 else ''}")
        try:
            while True:
                code = self._attempt()
                if code == 0:
                    self.say(f"rehearsal | JobSet '{name}' completed{self.recovery.summary()}")
                    return 0
                if self.fails_the_jobset(code):
                    self.say(f"rehearsal | JobSet '{name}' failed{self.recovery.summary()}: a pod exited {code}, the "
                             "job's own failure (PodFailurePolicy: not restarted)")
                    return code
                if self.restarts >= self.max_restarts:
                    self.say(f"rehearsal | JobSet '{name}' failed{self.recovery.summary()}: a pod exited {code} with "
                             f"no restart left (maxRestarts {self.max_restarts})")
                    return code
                self.restarts += 1
                self.recovery.lost(self._log, self._failed_at)
                self.say(f"rehearsal | JobSet '{name}' restarting ({self.restarts} of {self.max_restarts}): a pod "
                         f"exited {code}, every pod recreated")
        finally:
            if not self.keep_disks:
                shutil.rmtree(self.root, ignore_errors=True)

    def _attempt(self) -> int:
        """One generation of pods, to the first failure (every pod stopped then) or until all exit 0."""
        pods = self._start_pods()
        log = self._log = HostLog(self.model_dir, self.attempt_base + self.restarts + 1)
        preempted: Optional[Pod] = None
        killed_at = 0.0
        try:
            while True:
                self._read(log)
                if self.pending and log.step is not None and log.step >= self.pending[0]:
                    self.pending.pop(0)
                    preempted = pods[-1]
                    preempted.terminate()  # a node preempted: its pod gets SIGTERM and the grace period
                    killed_at = time.monotonic() + self.grace_s
                    self.say(f"rehearsal | preempted the pod of {preempted.name} at step {log.step}")
                if preempted is not None and time.monotonic() > killed_at:
                    preempted.kill_all()  # the grace period over: SIGKILL
                codes = [pod.exit_code() for pod in pods]
                failed = [code for code in codes if code not in (None, 0)]
                if failed:
                    self._failed_at = time.monotonic()  # a restart's time back counts from here
                    self._stop(pods)
                    self._read(log)
                    return failed[0]
                if all(code == 0 for code in codes):
                    self._read(log)
                    return 0
                time.sleep(self.poll_s)
        finally:
            self._stop(pods)

    def _read(self, log: HostLog) -> None:
        """The chief's new lines, out; after a restart, once it trains again, how long that took."""
        for line in log.new_lines():
            self.out(line)
        back = self.recovery.back(log, time.monotonic())
        if back:
            self.say(f"rehearsal | {back}")

    def _stop(self, pods: List[Pod]) -> None:
        """Every pod still running: SIGTERM, then SIGKILL after the grace period (as the kubelet deletes a pod)."""
        running = [pod for pod in pods if pod.exit_code() is None]
        for pod in running:
            pod.terminate()
        deadline = time.monotonic() + self.grace_s
        for pod in running:
            try:
                pod.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            pod.kill_all()
            pod.process.wait()

    # ------------------------------------------------------------------------------------------ pods

    def _start_pods(self) -> List[Pod]:
        addresses = [[f"127.0.0.1:{_free_port()}" for _ in range(self.hosts)] for _ in range(self.slices)]
        pods = []
        for slice_index in range(self.slices):
            for host in range(self.hosts):
                disk = os.path.join(self.root, f"attempt-{self.restarts + 1}", f"slice-{slice_index}-host-{host}")
                os.makedirs(disk)
                env = dict(self.env, HOME=disk, TPU_WORKER_ID=str(host),
                           TPU_WORKER_HOSTNAMES=",".join(a.rsplit(":", 1)[0] for a in addresses[slice_index]))
                env.update(self._container_env(slice_index, addresses))
                log = os.path.join(disk, "pod.log")
                with open(log, "wb") as handle:
                    process = subprocess.Popen(self.container["command"], cwd=disk, env=env, stdout=handle,
                                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               start_new_session=True)
                pods.append(Pod(slice_index, host, process, log))
        return pods

    def _container_env(self, slice_index: int, addresses: List[List[str]]) -> Dict[str, str]:
        """The manifest's env, its downward-API values resolved as the kubelet does; the pods' DNS names local."""
        values = {}
        for item in self.container.get("env", []):
            if "value" in item:
                values[item["name"]] = item["value"]
                continue
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            if jobset.JOB_INDEX_KEY in path:
                values[item["name"]] = str(slice_index)
            elif jobset.RESTART_ATTEMPT_KEY in path:
                values[item["name"]] = str(self.restarts)
        values["TPULAUNCH_RUN_HOSTS"] = ",".join(a for hosts in addresses for a in hosts)
        if multislice.COORDINATOR in values:
            values[multislice.COORDINATOR] = addresses[0][0]
        values.pop("TPULAUNCH_IMAGE_PYTHON", None)  # a rehearsal runs this machine's Python (the script's own)
        return values
