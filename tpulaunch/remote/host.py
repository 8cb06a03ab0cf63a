"""The host runner: what the startup script starts on every host of a `tpulaunch run` TPU VM.

    python -m tpulaunch.remote.host --stage URL --worker N --attempt A --disk DIR

It fetches the stage (the job file and its code) onto the host's disk, then, by the host's role, runs
`tpulaunch train` (worker 0: the one process that drives the slice for both engines today) or nothing, with
the train's output in `attempts/<A>/worker-<N>.log` under run.model_dir and the host's status beside it
(`worker-<N>.json`: when it booted, installed, started, the train's pid and host, how it ended). It exits with
the train's exit code, which the controller reads (`causes.py`) to decide between recovering and stopping.

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

from tpulaunch.remote import layout, store

SHIP_EVERY_S = 10.0
CHIEF = 0  # the worker that runs `tpulaunch train`


def _fetch(url: str) -> bytes:
    data = store.read(url)
    if data is None:
        raise SystemExit(f"tpulaunch | the stage has no {url}")
    return data


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


def train_command(manifest: dict, disk: str) -> List[str]:
    words = [sys.executable, "-m", "tpulaunch", "train", os.path.join(disk, "job", manifest["job"]["file"])]
    for value in manifest["sets"]:
        words += ["--set", value]
    if manifest["target"] == "local":
        words.append("--local")  # a rehearsal: this machine's CPU stands for the TPU
    else:
        words += ["--set", "tpu.name=local"]  # this TPU VM's own chips
    return words


class Status:
    """This host's status file under model_dir, rewritten whole at each change."""

    def __init__(self, url: str, **fields):
        self.url = url
        self.data = {"host": socket.gethostname(), **fields}

    def update(self, **fields) -> None:
        self.data.update(fields)
        store.write(self.url, (json.dumps(self.data, indent=1) + "\n").encode())


def _last_message(log_path: str) -> str:
    """The line a failed train ended with that says why (its `error:` line when it printed one)."""
    try:
        with open(log_path, errors="replace") as handle:
            lines = [line.rstrip() for line in handle if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or [""])[-1]


def run(stage_url: str, worker: int, attempt: int, disk: str, booted: Optional[float],
        installed: Optional[float]) -> int:
    manifest = fetch_stage(stage_url, disk)
    model_dir = manifest["model_dir"]
    status = Status(layout.host_status(model_dir, attempt, worker), worker=worker, attempt=attempt, booted=booted,
                    installed=installed, fetched=time.time(), role="train" if worker == CHIEF else "none",
                    exit_code=None)
    if worker != CHIEF:
        status.update(exit_code=0, ended=time.time(), message="nothing to run on this host: worker 0 trains")
        print(f"tpulaunch | worker {worker}: worker {CHIEF} runs the job; nothing to run here", flush=True)
        return 0
    remote_log = layout.host_log(model_dir, attempt, worker)
    shipped = store.is_gcs(remote_log)
    log_path = os.path.join(disk, f"worker-{worker}.log") if shipped else remote_log
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = train_command(manifest, disk)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, cwd=os.path.join(disk, "job"), env=env, stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT)
    status.update(started=time.time(), train_pid=process.pid)
    stop = threading.Event()
    if shipped:
        def ship():
            while not stop.wait(SHIP_EVERY_S):
                with open(log_path, "rb") as handle:
                    store.write(remote_log, handle.read())
        threading.Thread(target=ship, name="ship-log", daemon=True).start()
    code = process.wait()
    stop.set()
    if shipped:
        with open(log_path, "rb") as handle:
            store.write(remote_log, handle.read())
    status.update(exit_code=code, ended=time.time(), message=_last_message(log_path) if code else "")
    return code


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpulaunch.remote.host", description=__doc__.splitlines()[0])
    parser.add_argument("--stage", required=True)
    parser.add_argument("--worker", type=int, required=True)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--disk", required=True)
    parser.add_argument("--booted", type=float)
    parser.add_argument("--installed", type=float)
    args = parser.parse_args(argv)
    return run(args.stage, args.worker, args.attempt, args.disk, args.booted, args.installed)


if __name__ == "__main__":
    sys.exit(main())
