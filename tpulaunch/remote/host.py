"""The host runner: what the startup script starts on every host of a `tpulaunch run` TPU VM.

    python -m tpulaunch.remote.host --stage URL --worker N --hosts H --attempt A --disk DIR

It fetches the stage (the job file and its code) onto the host's disk, then runs this host's part: which hosts
run `tpulaunch train` is the engine's to say (`EngineAbout.on_tpu.hosts`): "chief", worker 0 alone (TPUEstimator:
its session drives every host of a -pod image); "every", each host, worker 0 the chief that alone holds
model_dir's lease and writes its shared files (the others are told they are not by $TF_CONFIG, the multi-worker
convention `run/workers.py` reads). A host with nothing to run says so in its status and exits 0.

The train's output goes to `attempts/<A>/worker-<N>.log` under run.model_dir and the host's status beside it
(`worker-<N>.json`: its phase, when it booted, installed (and from where: the run's wheelhouse or the package
index), started, the train's pid and host, how it ended, and
for a chief whose train failed while another run held model_dir's lease, that holder: `lease_holder`). It
exits with the train's exit code, which the controller reads (`causes.py`) to decide between recovering and
stopping.

The job's `${VAR}`s are read from Secret Manager here (`secret_manager.read_on_vm`) into the train's environment
alone: no value is written to the host's disk, its log or model_dir.

A local model_dir gets the log line by line; a gs:// one gets it copied every SHIP_EVERY_S seconds and at the end.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time
from typing import List, Optional

from tpulaunch import store
from tpulaunch.remote import layout, secret_manager
from tpulaunch.tpu import multislice

SHIP_EVERY_S = 10.0
CHIEF = 0  # the worker that holds the lease (and, for a "chief" engine, the only one that trains)
TRAIN, NONE = "train", "none"  # a host's role


def role(worker: int, hosts_run: str) -> str:
    """What host `worker` runs for an engine whose `tpu_hosts` is `hosts_run`."""
    return TRAIN if worker == CHIEF or hosts_run == "every" else NONE


def _fetch(url: str) -> bytes:
    found = store.read(url)
    if found is None:
        raise SystemExit(f"tpulaunch | the stage has no {url}")
    return found.data


def fetch_stage(stage_url: str, disk: str) -> dict:
    """The manifest, with the job file and its code extracted under `disk`/job."""
    manifest = json.loads(_fetch(stage_url))
    model_dir = manifest["model_dir"]
    job_dir = os.path.join(disk, "job")
    os.makedirs(job_dir, exist_ok=True)
    with open(os.path.join(job_dir, manifest["job"]["file"]), "wb") as handle:
        handle.write(_fetch(layout.blob(model_dir, manifest["job"]["blob"])))
    for bundle in manifest["bundles"]:
        into = os.path.join(disk, bundle["into"])
        os.makedirs(into, exist_ok=True)
        tarfile.open(fileobj=io.BytesIO(_fetch(layout.blob(model_dir, bundle["blob"])))).extractall(into)
    return manifest


def train_command(manifest: dict, disk: str, hosts: int = 1, zone: str = "") -> List[str]:
    words = [sys.executable, "-m", "tpulaunch", "train", os.path.join(disk, "job", manifest["job"]["file"])]
    for value in manifest["sets"]:
        words += ["--set", value]
    if manifest["target"] == "local":
        words.append("--local")  # a rehearsal: this machine's CPU stands for the TPU
    elif hosts == 1 or manifest.get("hosts") == "every":
        words += ["--set", "tpu.name=local"]  # this TPU VM host's own chips
    elif zone:
        # worker 0 drives every host of the slice, found by the node's name (the job's tpu.name) as a -pod image
        # expects, in the zone the VM was made in (which tpu.zones' fallback may have picked)
        words += ["--set", f"tpu.zones=[{zone}]", "--set", f"tpu.zone={zone}"]
    return words


def worker_env(worker: int, hosts: int, hosts_run: str, endpoints: List[str]) -> dict:
    """$TF_CONFIG for a host of an "every" engine on several hosts: its index among the slice's workers, so that
    only worker 0 counts as the chief (the lease, model_dir's shared files)."""
    if hosts_run != "every" or hosts < 2:
        return {}
    workers = endpoints if len(endpoints) == hosts else [f"worker-{i}:8470" for i in range(hosts)]
    return {"TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": worker}})}


def place_env(worker: int, hosts: int, hosts_run: str, endpoints: List[str], slice_id: int = 0, slices: int = 1,
              coordinator: str = "") -> dict:
    """What train's environment gets of this host's place in the run: $TF_CONFIG (`worker_env`, `worker` and `hosts`
    counted over every slice), and on a TPU VM of several slices (given its own slice's `endpoints`) the MEGASCALE_*
    values, as the JobSet gives them to a GKE pod (`tpu/multislice.py`)."""
    if slices > 1 and len(endpoints) * slices == hosts:
        endpoints = multislice.run_endpoints(endpoints, slice_id, slices, coordinator)
    return {**worker_env(worker, hosts, hosts_run, endpoints),
            **multislice.megascale_environment(coordinator, slices, slice_id)}


class Status:
    """This host's status file under model_dir, rewritten whole at each change, and its copy on the host's disk
    (`copy`), where the startup script reads whether the runner took the status over from it."""

    def __init__(self, url: str, copy: Optional[str] = None, **fields):
        self.url, self.copy = url, copy
        self.data = {"host": socket.gethostname(), **fields}

    def update(self, **fields) -> None:
        self.data.update(fields)
        text = (json.dumps(self.data, indent=1) + "\n").encode()
        store.write(self.url, text, private=True)
        if self.copy:
            with open(self.copy, "wb") as handle:
                handle.write(text)


def _last_message(log_path: str) -> str:
    """The line a failed train ended with that says why (its `error:` line when it printed one)."""
    try:
        with open(log_path, errors="replace") as handle:
            lines = [line.rstrip() for line in handle if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or [""])[-1]


def release_replaced_chief(model_dir: str, attempt: int) -> str:
    """On a JobSet's restart (every pod of attempt - 1 replaced: JobSet restarts them all), the lease its chief's
    train may still hold (its pod lost with its node, or killed past its grace in a step that did not return) is
    released, as the controller of a TPU VM run releases a lost VM's (`controller._release_lease`): this chief's
    train then takes it at once, where it would be refused until the lease went stale and the JobSet would fail as
    if for the job's own cause. Only that holder's (its host and pid, as its status said; conditional on the lease
    read); what was done, in words, or "" when there was nothing of it to release."""
    from tpulaunch.remote.follow import host_status
    from tpulaunch.run.lease import release_lost_holder

    replaced = host_status(model_dir, attempt - 1, CHIEF) or {}
    if replaced.get("train_pid") is None or replaced.get("host") is None:
        return ""
    if replaced.get("jobset") != os.environ.get("TPULAUNCH_JOBSET"):
        # Another JobSet's pods on the same model_dir numbered their attempts from the same base (both submitted
        # while neither had written yet, or one restarting while the other ran): not this JobSet's chief
        return ""
    try:
        done = release_lost_holder(model_dir, host=replaced["host"], pid=replaced["train_pid"],
                                   why=f"tpulaunch: the JobSet restarted, replacing attempt {attempt - 1}'s pods")
    except Exception as failed:  # the lease unreadable now: train says what it finds
        return f"could not release the replaced chief's lease on run.model_dir ({type(failed).__name__}: {failed})"
    return "released the lease the replaced chief's train held on run.model_dir" if done else ""


def run(stage_url: str, worker: int, attempt: int, disk: str, booted: Optional[float],
        installed: Optional[float], hosts: int = 1, endpoints: Optional[List[str]] = None, zone: str = "",
        installed_from: str = "", slice_id: int = 0, slices: int = 1, coordinator: str = "") -> int:
    manifest = fetch_stage(stage_url, disk)
    model_dir = manifest["model_dir"]
    hosts_run = manifest.get("hosts", "chief")
    mine = role(worker, hosts_run)
    status = Status(layout.host_status(model_dir, attempt, worker), os.path.join(disk, "status.json"), worker=worker,
                    attempt=attempt, hosts=hosts, booted=booted, installed=installed,
                    **({"installed_from": installed_from} if installed_from else {}), fetched=time.time(), role=mine,
                    phase="fetched", exit_code=None, **({"slice": slice_id} if slices > 1 else {}),
                    **({"jobset": os.environ["TPULAUNCH_JOBSET"]} if os.environ.get("TPULAUNCH_JOBSET") else {}))
    if mine == NONE:
        status.update(phase="ended", exit_code=0, ended=time.time(),
                      message=f"nothing to run on this host: worker {CHIEF} trains")
        print(f"tpulaunch | worker {worker}: worker {CHIEF} runs the job; nothing to run here", flush=True)
        return 0
    remote_log = layout.host_log(model_dir, attempt, worker)
    shipped = store.is_gcs(remote_log)
    log_path = os.path.join(disk, f"worker-{worker}.log") if shipped else remote_log
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    try:
        values = secret_manager.read_on_vm(manifest.get("secrets"))  # into train's environment only
    except secret_manager.SecretUnreadable as unreadable:
        message = f"error: {unreadable}"
        status.update(phase="ended", exit_code=1, ended=time.time(), message=message)
        print(f"tpulaunch | worker {worker}: {message}", flush=True)
        return 1
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           **place_env(worker, hosts, hosts_run, endpoints or [], slice_id, slices, coordinator), **values}
    command = train_command(manifest, disk, hosts, zone)
    if worker == CHIEF and int(os.environ.get("TPULAUNCH_RESTART_ATTEMPT") or 0) > 0:
        released = release_replaced_chief(model_dir, attempt)
        if released:
            print(f"tpulaunch | worker {worker}: {released}", flush=True)
    # Readable by this user alone: the train's output may quote anything of the job's.
    with os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
        process = subprocess.Popen(command, cwd=os.path.join(disk, "job"), env=env, stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT)
    status.update(phase="training", started=time.time(), train_pid=process.pid)
    if os.environ.get("TPU_WORKER_ID") is not None:  # a GKE pod (on a TPU VM every process hears the shutdown)
        _forward_stop_signals(process)
    stop = threading.Event()
    if shipped:
        def ship():
            while not stop.wait(SHIP_EVERY_S):
                with open(log_path, "rb") as handle:
                    store.write(remote_log, handle.read(), private=True)
        threading.Thread(target=ship, name="ship-log", daemon=True).start()
    code = process.wait()
    stop.set()
    if shipped:
        with open(log_path, "rb") as handle:
            store.write(remote_log, handle.read(), private=True)
    # a train refused model_dir's lease exits 1, one whose lease another run took over 5 (`tpulaunch.errors`)
    ended = {"lease_holder": _other_holder(model_dir, process.pid)} if code in (1, 5) and worker == CHIEF else {}
    status.update(phase="ended", exit_code=code, ended=time.time(), message=_last_message(log_path) if code else "",
                  **{key: value for key, value in ended.items() if value})
    return code


def _forward_stop_signals(process: subprocess.Popen) -> None:
    """A stop asked of this runner reaches the train: in a GKE pod only the container's first process gets the
    kubelet's SIGTERM (startup.sh passes it here), so train hears of a preemption and saves its checkpoint."""
    import signal

    def forward(signum, frame):
        if process.poll() is None:
            process.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)


def _other_holder(model_dir: str, train_pid: int) -> Optional[dict]:
    """The run that holds model_dir's lease now when it is not this host's train (which then was refused the lease,
    or lost it to that run): the controller tells contention from a failure of the job's own by it."""
    from tpulaunch.remote.contention import held_by_other

    try:
        return held_by_other(model_dir, socket.gethostname(), train_pid)
    except Exception:  # the lease unreadable now: the exit code alone is said
        return None


def arguments(argv=None) -> argparse.Namespace:
    """The host runner's command line, as the startup script writes it."""
    parser = argparse.ArgumentParser(prog="python -m tpulaunch.remote.host", description=__doc__.splitlines()[0])
    parser.add_argument("--stage", required=True)
    parser.add_argument("--worker", type=int, required=True)
    parser.add_argument("--hosts", type=int, default=1, help="hosts in the slice")
    parser.add_argument("--endpoints", default="", help="the slice's worker-network-endpoints (comma-separated)")
    parser.add_argument("--zone", default="", help="the zone the VM was made in")
    parser.add_argument("--slice", type=int, default=0, help="this host's slice (several slices: tpu-env's)")
    parser.add_argument("--slices", type=int, default=1, help="the run's slices")
    parser.add_argument("--coordinator", default="", help="the multislice coordinator (worker 0 of slice 0)")
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--disk", required=True)
    parser.add_argument("--booted", type=float)
    parser.add_argument("--installed", type=float)
    parser.add_argument("--installed-from", default="",
                        help="where the install came from: wheelhouse, index (none: nothing installed)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = arguments(argv)
    endpoints = [item for item in args.endpoints.split(",") if item]
    from tpulaunch.errors import TpuLaunchError

    try:
        return _run_host(args, endpoints)
    except TpuLaunchError as failed:  # e.g. run.model_dir not writable by the VM's service account
        print(f"tpulaunch | error: {failed.message}" + (f"\n  hint: {failed.hint}" if failed.hint else ""), flush=True)
        return int(failed.exit_code)


def _run_host(args, endpoints: List[str]) -> int:
    return run(args.stage, args.worker, args.attempt, args.disk, args.booted, args.installed, args.hosts, endpoints,
               args.zone, args.installed_from, args.slice, args.slices, args.coordinator)


if __name__ == "__main__":
    sys.exit(main())
