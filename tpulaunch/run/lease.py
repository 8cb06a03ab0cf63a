"""One writer per model_dir: the lease `train` and `evaluate` hold on model_dir while they run.

Two runs of one job started a second apart would otherwise both train, both print `done` and silently
overwrite each other's checkpoints (a relaunch of a run believed dead, a CI retry, a second VM). So a run
takes `model_dir/tpulaunch.lease` before it writes anything and before TensorFlow is imported, renews it
from a background thread while it lives and marks it released when it ends::

    {"state": "held", "host": "vm-1", "pid": 4242, "run_id": "20250101T100000Z-vm-1-4242-1a2b3c",
     "command": "train", "started": 1735725600.0, "renewed": 1735725630.0,
     "renew_every_s": 30.0, "stale_after_s": 180.0, "took_over": null}

Every change is atomic, so two runs can never both win:

- local: the first lease is made with an exclusive create (a complete temporary file, made with O_EXCL, linked
  to the lease's name: link() fails when it exists, and no reader sees a half-written lease). Every later change (renew,
  release, a takeover) rereads the file under a guard file made the same way, checks it is still what
  the change expects (ours; or the very stale lease it judged), and writes a temporary file renamed over
  the lease.
- gs://: Cloud Storage generation preconditions through google-cloud-storage (imported only then): create
  with if_generation_match=0, renew, release and take over with the generation last read. Releasing is a
  conditional rewrite marking the lease released, not a delete, so every change is a precondition a
  server checks.

A lease whose holder has not renewed it for `stale_after_s` (its holder was killed, its machine lost) is
taken over with a message; `--take-lease` takes a live one at once. Times are the holders' wall clocks
(UTC seconds): machines sharing a model_dir are assumed to keep time within seconds of each other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import secrets
import socket
import threading
import time
from typing import Callable, Iterator, Optional, Tuple

from tpulaunch.errors import TpuLaunchError, first_line

LEASE_FILE = "tpulaunch.lease"
RENEW_ENV = "TPULAUNCH_LEASE_RENEW_S"
STALE_ENV = "TPULAUNCH_LEASE_STALE_S"
RENEW_EVERY_S = 30.0
STALE_AFTER_S = 180.0  # six missed renewals: a slow filesystem or a short GCS outage does not lose the lease


class LeaseRefused(TpuLaunchError):
    """model_dir is held by another live run (or its lease cannot be read or written)."""


class _Conflict(Exception):
    """The lease changed between reading and writing it: someone else's change won."""


def _seconds(env: str, default: float) -> float:
    value = os.environ.get(env)
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise TpuLaunchError(f"${env}={value!r} is not a number of seconds", hint=f"unset it (default {default:g})")
    if not seconds > 0:
        raise TpuLaunchError(f"${env}={value!r} must be more than 0 seconds", hint=f"unset it (default {default:g})")
    return seconds


def lease_timing() -> Tuple[float, float]:
    """(renew every, stale after) in seconds: the defaults, or $TPULAUNCH_LEASE_RENEW_S / $TPULAUNCH_LEASE_STALE_S."""
    renew, stale = _seconds(RENEW_ENV, RENEW_EVERY_S), _seconds(STALE_ENV, STALE_AFTER_S)
    if stale <= renew:
        raise TpuLaunchError(f"the lease's stale time ({stale:g} s) must be longer than its renewal interval "
                             f"({renew:g} s)", hint=f"set ${STALE_ENV} to a few times ${RENEW_ENV}")
    return renew, stale


def new_run_id(clock: Callable[[], float] = time.time) -> str:
    """This run's id: start time (UTC), host, pid and a random tail (a pid is reused across machines and boots)."""
    moment = datetime.datetime.fromtimestamp(clock(), tz=datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{moment}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def lease_path(model_dir: str) -> str:
    return model_dir.rstrip("/") + "/" + LEASE_FILE


def age_text(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def holder_text(data: dict) -> str:
    """'host vm-1, pid 4242, run 2025...' of a lease's holder."""
    return f"host {data.get('host')}, pid {data.get('pid')}, run {data.get('run_id')}"


# ------------------------------------------------------------------------------------------- stores

class LocalStore:
    """The lease file on this machine's filesystem (or a mounted one)."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self.path = lease_path(model_dir)
        self.guard = self.path + ".lock"

    def read(self) -> Tuple[Optional[bytes], object]:
        try:
            with open(self.path, "rb") as handle:
                text = handle.read()
        except FileNotFoundError:
            return None, None
        return text, text  # the token: the content itself, compared again under the guard

    def _written(self, text: bytes) -> str:
        """A temporary file in model_dir holding `text`, flushed to disk."""
        temporary = f"{self.path}.{os.getpid()}.{secrets.token_hex(3)}.tmp"
        fd = os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        return temporary

    def create(self, text: bytes) -> object:
        # An exclusive create of a complete file: link() fails when the lease exists, like O_CREAT|O_EXCL, but
        # a reader never sees the lease empty (an O_EXCL file is visible before its content is written).
        os.makedirs(self.model_dir, exist_ok=True)
        temporary = self._written(text)
        try:
            os.link(temporary, self.path)
        except FileExistsError:
            raise _Conflict() from None
        finally:
            os.unlink(temporary)
        return text

    def replace(self, text: bytes, token: object, stale_after_s: float) -> object:
        """Write `text` over the lease if it still holds `token` (what we last read or wrote)."""
        with self._guarded(stale_after_s):
            current, _ = self.read()
            if current != token:
                raise _Conflict()
            os.replace(self._written(text), self.path)  # atomic: a reader sees the old lease or the new one
        return text

    @contextlib.contextmanager
    def _guarded(self, stale_after_s: float) -> Iterator[None]:
        """Hold the guard file (an exclusive create) for one read-check-write; it is held for milliseconds, so
        waiting a little is enough. A guard older than the stale time was left by a process killed inside
        its change: removed."""
        deadline = time.monotonic() + 10.0
        while True:
            try:
                os.close(os.open(self.guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                break
            except FileExistsError:
                with contextlib.suppress(FileNotFoundError):
                    if time.time() - os.stat(self.guard).st_mtime > stale_after_s:
                        os.unlink(self.guard)
                        continue
                if time.monotonic() > deadline:
                    raise _Conflict() from None
                time.sleep(0.01)
        try:
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.guard)


def _storage_client(storage):
    """A Cloud Storage client, or a located error when this machine has no Google Cloud credentials."""
    from google.auth.exceptions import DefaultCredentialsError

    try:
        return storage.Client()
    except DefaultCredentialsError:
        raise TpuLaunchError("no Google Cloud credentials to reach the model_dir lease on gs://",
                             hint="gcloud auth application-default login (or set GOOGLE_APPLICATION_CREDENTIALS); on a "
                                  "Cloud TPU VM the VM's service account is used") from None


class GcsStore:
    """The lease object in Cloud Storage; each change is conditional on the generation last read."""

    def __init__(self, model_dir: str):
        from google.cloud import storage  # only for a gs:// model_dir: the package is not needed otherwise

        self.model_dir = model_dir
        self.path = lease_path(model_dir)
        bucket, _, name = self.path[len("gs://"):].partition("/")
        self.blob_name = name
        self.bucket = _storage_client(storage).bucket(bucket)

    def read(self) -> Tuple[Optional[bytes], object]:
        from google.api_core import exceptions

        blob = self.bucket.get_blob(self.blob_name)
        if blob is None:
            return None, 0
        try:
            return blob.download_as_bytes(if_generation_match=blob.generation), blob.generation
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            return self.read()  # changed between the two requests: read the new one

    def _write(self, text: bytes, generation: int) -> object:
        from google.api_core import exceptions

        blob = self.bucket.blob(self.blob_name)
        try:
            blob.upload_from_string(text, content_type="application/json", if_generation_match=generation)
        except exceptions.PreconditionFailed:
            raise _Conflict() from None
        return blob.generation

    def create(self, text: bytes) -> object:
        return self._write(text, 0)  # 0: only if no such object exists

    def replace(self, text: bytes, token: object, stale_after_s: float) -> object:
        return self._write(text, int(token))


def store_for(model_dir: str):
    return GcsStore(model_dir) if model_dir.startswith("gs://") else LocalStore(model_dir)


def _decode(text: bytes, path: str) -> dict:
    try:
        data = json.loads(text.decode("utf-8"))
    except ValueError:
        data = None
    if not isinstance(data, dict) or data.get("state") not in ("held", "released") or not isinstance(
            data.get("renewed"), (int, float)):
        raise LeaseRefused(f"{path} is not a tpulaunch lease (corrupt, or written by something else)",
                           hint="if no other run uses this model_dir, remove the file and rerun")
    return data


def read_lease(model_dir: str) -> Optional[dict]:
    """The lease in model_dir as its holder wrote it, or None when there is none (for `status`)."""
    store = store_for(model_dir)
    text, _ = store.read()
    return None if text is None else _decode(text, store.path)


# -------------------------------------------------------------------------------------------- lease

@dataclasses.dataclass
class Lease:
    """The lease this run holds; `took_over` says from whom, when it was taken over."""

    store: object
    data: dict
    token: object
    renew_every_s: float
    stale_after_s: float
    clock: Callable[[], float] = time.time
    lost: Optional[dict] = None  # the lease someone else wrote over ours
    _stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    _thread: Optional[threading.Thread] = None
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @property
    def took_over(self) -> Optional[dict]:
        return self.data.get("took_over")

    def _put(self, data: dict) -> None:
        with self._lock:
            self.token = self.store.replace(_encode(data), self.token, self.stale_after_s)
            self.data = data

    def renew(self) -> bool:
        """Write a new renewal time; False (and `lost` set) when another run took the lease over."""
        if self.lost is not None:
            return False
        try:
            self._put({**self.data, "renewed": self.clock()})
        except _Conflict:
            text, _ = self.store.read()
            self.lost = _decode(text, self.store.path) if text else {"state": "missing"}
            return False
        return True

    def start_renewing(self, on_lost: Callable[[dict], None], on_error: Callable[[BaseException], None]) -> "Lease":
        def loop():
            while not self._stop.wait(self.renew_every_s):
                try:
                    if not self.renew():
                        on_lost(self.lost)
                        return
                except Exception as exc:  # a failed renewal is retried: the lease goes stale only after many
                    on_error(exc)

        self._thread = threading.Thread(target=loop, name="tpulaunch-lease", daemon=True)
        self._thread.start()
        return self

    def release(self) -> None:
        """Stop renewing and mark the lease released (left alone when another run holds it now)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        _HELD_HERE.discard(self.data["run_id"])  # ended, even if the write below fails (a full disk, say)
        if self.lost is not None:
            return
        try:
            self._put({**self.data, "state": "released", "renewed": self.clock()})
        except _Conflict:
            text, _ = self.store.read()
            self.lost = _decode(text, self.store.path) if text else {"state": "missing"}


def _encode(data: dict) -> bytes:
    return (json.dumps(data, indent=1) + "\n").encode()


def acquire(model_dir: str, *, run_id: str, command: str, take: bool = False,
            clock: Callable[[], float] = time.time, store=None) -> Lease:
    """Take model_dir's lease for this run.

    A released lease, or one whose holder has not renewed it for the stale time, is taken over (the new
    lease's `took_over` names the old holder and how stale it was); `take` takes a live one as well.

    Raises:
        LeaseRefused: another run holds a live lease (naming it and its last renewal's age), the lease file
            is not a lease, or model_dir cannot be written.
    """
    renew, stale = lease_timing()
    # Counted as this process's before it is written: another thread that reads it meanwhile sees a live run.
    _HELD_HERE.add(run_id)
    try:
        store = store or store_for(model_dir)
        return _acquire(store, model_dir, run_id, command, take, clock, renew, stale)
    except LeaseRefused:
        _HELD_HERE.discard(run_id)
        raise
    except Exception as exc:  # permissions, not a directory, no credentials, an unreachable bucket
        _HELD_HERE.discard(run_id)
        raise LeaseRefused(f"cannot take the lease on run.model_dir {model_dir}: {type(exc).__name__}: "
                           f"{first_line(exc)}",
                           hint="model_dir must be writable by this run (see docs/running.md: one writer per model_dir)") \
            from None


def _acquire(store, model_dir, run_id, command, take, clock, renew, stale) -> Lease:
    for _ in range(5):  # each pass loses only to another run's change, which the next pass reads
        text, token = store.read()
        now = clock()
        mine = {"state": "held", "host": socket.gethostname(), "pid": os.getpid(), "run_id": run_id,
                "command": command, "started": now, "renewed": now, "renew_every_s": renew, "stale_after_s": stale,
                "took_over": None}
        try:
            if text is None:
                token = store.create(_encode(mine))
            else:
                held = _decode(text, store.path)
                age = now - held["renewed"]
                if held["state"] == "held":
                    gone = holder_gone(held)
                    if age <= stale and not take and not gone:
                        raise LeaseRefused(
                            f"run.model_dir {model_dir} is in use: {held.get('command', 'a run')} by "
                            f"{holder_text(held)} holds its lease, last renewed {age_text(age)} ago",
                            hint=f"wait for that run to end; a lease not renewed for {stale:g} s is taken over "
                                 "(its holder is gone); --take-lease takes it now (only when that run is surely "
                                 "stopped); or use another --model-dir")
                    mine["took_over"] = {"host": held.get("host"), "pid": held.get("pid"),
                                         "run_id": held.get("run_id"), "renewed_s_ago": round(age, 3),
                                         "stale": age > stale, "gone": gone,
                                         "forced": age <= stale and not gone}
                token = store.replace(_encode(mine), token, stale)
        except _Conflict:
            continue
        return Lease(store, mine, token, renew, stale, clock)
    raise LeaseRefused(f"run.model_dir {model_dir}: its lease kept changing while this run tried to take it",
                       hint="another run is starting on the same model_dir: wait for it, or use another --model-dir")


# The run ids of the leases this process holds now: a lease that names this process but none of these was left
# by a run of this process that ended without releasing it (its release could not be written).
_HELD_HERE: set = set()


def holder_gone(held: dict) -> bool:
    """Whether the holder ran on this host and its process is no longer running (killed, crashed), or is this
    process and its run ended: its lease need not wait out the stale time. A holder on another host, or a
    process that still exists, is not known gone."""
    if held.get("host") != socket.gethostname() or not isinstance(held.get("pid"), int):
        return False
    if held["pid"] == os.getpid():
        return held.get("run_id") not in _HELD_HERE
    try:
        os.kill(held["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists (another user's process, say)
        return False
    return False


def lease_state(data: Optional[dict], now: float) -> str:
    """'held', 'stale' or 'released' (None: 'none')."""
    if data is None:
        return "none"
    if data["state"] == "released":
        return "released"
    return "stale" if now - data["renewed"] > float(data.get("stale_after_s") or STALE_AFTER_S) else "held"


def describe(data: Optional[dict], now: float) -> str:
    """One line for `status`."""
    state = lease_state(data, now)
    if state == "none":
        return "none held (no run has written this model_dir's lease)"
    age = age_text(now - data["renewed"])
    if state == "released":
        return f"none held (released {age} ago by {holder_text(data)})"
    if state == "stale":
        return (f"stale: {holder_text(data)} last renewed it {age} ago (stale after "
                f"{float(data.get('stale_after_s') or STALE_AFTER_S):g} s); the next run takes it over")
    return f"held by {holder_text(data)} ({data.get('command')}), last renewed {age} ago"
