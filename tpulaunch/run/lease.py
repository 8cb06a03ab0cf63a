"""One writer per model_dir: the lease `train` and `evaluate` hold on model_dir while they run.

Two runs of one job started a second apart would otherwise both train, both print `done` and silently
overwrite each other's checkpoints (a relaunch of a run believed dead, a CI retry, a second VM). So a run
takes `model_dir/tpulaunch.lease` before it writes anything and before TensorFlow is imported, renews it
from a background thread while it lives and marks it released when it ends::

    {"state": "held", "host": "vm-1", "pid": 4242, "run_id": "20250101T100000Z-vm-1-4242-1a2b3c",
     "holder": "5f0c2a9e41d7b3c8", "command": "train", "started": 1735725600.0, "renewed": 1735725630.0,
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

Fencing: a holder that was frozen (SIGSTOP, a paused VM, a partition) past the stale time and thaws must not
write into the model_dir its successor now holds. `ensure_held(model_dir)` (before every checkpoint save and
evaluation: a reread of the lease, on gs:// of its generation) and `raise_if_lost(model_dir)` (after every
step: what the renewal thread found, no I/O) raise `LeaseLost`, so the window is at most a save already
under way when the process froze, never the rest of the run.

A storage outage is not a takeover: only a lease naming another run fences this one. A change refused by its
precondition reads the lease back, and one that is held and names this lease's `holder` (a random token made when
it was taken, beside the run's `run_id`: start time, host, pid, random tail) is this run's own write whose reply
was lost: adopted, generation and all. A store that cannot be reached is
waited for before a write, up to the stale time (`StoreUnreachable` past it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import re
import secrets
import socket
import threading
import time
from typing import Callable, Iterator, Optional, Tuple

from tpulaunch.errors import ExitCode, TpuLaunchError, first_line

LEASE_FILE = "tpulaunch.lease"
RENEW_ENV = "TPULAUNCH_LEASE_RENEW_S"
STALE_ENV = "TPULAUNCH_LEASE_STALE_S"
RENEW_EVERY_S = 30.0
STALE_AFTER_S = 180.0  # six missed renewals: a slow filesystem or a short GCS outage does not lose the lease
# Cloud Storage time budgets (each request's timeout, and its retries together). `status` reads with READ_BUDGET_S:
# an unreachable bucket is said within seconds, not after the client's default two minutes of retries. A running
# train's renewals each try for an interval (READ_BUDGET_S at least), then again at the next: an outage is said
# within seconds, and a short one does not fail the run. Its check before a save tries for CHECK_BUDGET_S at a
# time, and waits for the store up to the stale time (`Lease.ensure_held`).
READ_BUDGET_S = 5.0
CHECK_BUDGET_S = 10.0


class LeaseRefused(TpuLaunchError):
    """model_dir is held by another live run (or its lease cannot be read or written)."""


class LeaseLost(TpuLaunchError):
    """Another run took model_dir's lease over while this run held it: this run stops writing there (fenced).

    `holder`: the lease as the new holder wrote it ({"state": "missing"} when someone removed it)."""

    exit_code = ExitCode.LEASE_LOST

    def __init__(self, model_dir: str, holder: dict):
        who = (holder_text(holder) if holder.get("host") else
               "someone (the lease file was removed)" if holder.get("state") == "missing" else
               "another run (its lease could not be read back)")
        super().__init__(f"lease lost: {who} took run.model_dir {model_dir} over while this run held it; this run "
                         "stopped without writing there again",
                         hint="that run owns model_dir now; rerun this job with another --model-dir, or after that "
                              "run ends (it resumes from the newest checkpoint there)")
        self.model_dir = model_dir
        self.holder = holder


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
        """A temporary file in model_dir holding `text`, flushed to disk; removed when writing it fails (a full
        disk, a quota), so a failed change leaves nothing behind."""
        temporary = f"{self.path}.{os.getpid()}.{secrets.token_hex(3)}.tmp"
        fd = os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            _remove(temporary)
            raise
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

    def replace(self, text: bytes, token: object, stale_after_s: float, budget_s: Optional[float] = None) -> object:
        """Write `text` over the lease if it still holds `token` (what we last read or wrote). (`budget_s`: a
        Cloud Storage request's; a local write has none.)"""
        with self._guarded(stale_after_s) as still_mine:
            current, _ = self.read()
            if current != token:
                raise _Conflict()
            temporary = self._written(text)
            try:
                if not still_mine():  # frozen inside this change past the stale time: another run removed our guard
                    raise _Conflict()
                os.replace(temporary, self.path)  # atomic: a reader sees the old lease or the new one
            except BaseException:
                _remove(temporary)
                raise
        return text

    def version(self, budget_s: Optional[float] = None) -> object:
        """What `read` returns as the token, for comparing with the one last written."""
        return self.read()[1]

    @contextlib.contextmanager
    def _guarded(self, stale_after_s: float) -> Iterator[Callable[[], bool]]:
        """Hold the guard file (an exclusive create, naming its holder) for one read-check-write; yields a check
        that the guard is still this change's.

        It is held for milliseconds, so waiting a few seconds is enough. A guard whose holder ran on this host and
        is gone (killed inside its change), or older than the stale time (a holder elsewhere, killed or frozen), is
        removed; a holder frozen inside its change finds its guard gone (the check) and leaves the lease alone.
        A guard still held after the wait stops the change, naming its holder."""
        mark = f"{socket.gethostname()} {os.getpid()} {secrets.token_hex(4)}".encode()
        deadline = time.monotonic() + 10.0
        while True:
            try:
                fd = os.open(self.guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileNotFoundError:  # model_dir is gone, and the lease with it: not the one expected
                raise _Conflict() from None
            except FileExistsError:
                holder = self._guard_holder()
                with contextlib.suppress(FileNotFoundError):
                    if _process_gone(holder) or time.time() - os.stat(self.guard).st_mtime > stale_after_s:
                        os.unlink(self.guard)
                        continue
                if time.monotonic() > deadline:
                    who = f"host {holder['host']}, pid {holder['pid']}" if holder.get("host") else "another process"
                    raise LeaseRefused(
                        f"{self.guard} is held by {who}, inside a change of the lease for over 10 s (frozen there?)",
                        hint=f"it is removed once older than {stale_after_s:g} s; remove it by hand only when no "
                             "run uses this model_dir") from None
                time.sleep(0.01)
                continue
            try:
                os.write(fd, mark)
            except BaseException:
                os.close(fd)
                _remove(self.guard)
                raise
            os.close(fd)
            break

        def still_mine() -> bool:
            try:
                with open(self.guard, "rb") as handle:
                    return handle.read() == mark
            except FileNotFoundError:
                return False

        try:
            yield still_mine
        finally:
            if still_mine():
                _remove(self.guard)

    def _guard_holder(self) -> dict:
        """{"host", "pid"} of the guard's holder as it wrote them ({} when unreadable or not written yet)."""
        try:
            with open(self.guard, "rb") as handle:
                host, pid, _ = handle.read().decode().split(" ")
            return {"host": host, "pid": int(pid)}
        except (OSError, ValueError):
            return {}


def reason(exc: BaseException) -> str:
    """An unreachable endpoint's reason in a few words ("ConnectionError: [Errno 111] Connection refused"), not the
    HTTP library's nested retelling of the request."""
    text = first_line(exc)
    errno_said = re.findall(r"\[Errno -?\d+\] [^\"')\]]+", text)
    return f"{type(exc).__name__}: {errno_said[-1] if errno_said else text[:200]}"


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


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
    """The lease object in Cloud Storage; each change is conditional on the generation last read.

    `read_budget_s`: the seconds a read may take, its retries included (None: the client's defaults, minutes);
    a read that cannot reach the bucket within it raises `LeaseRefused` naming the bucket."""

    def __init__(self, model_dir: str, read_budget_s: Optional[float] = None):
        from google.cloud import storage  # only for a gs:// model_dir: the package is not needed otherwise

        self.model_dir = model_dir
        self.path = lease_path(model_dir)
        bucket, _, name = self.path[len("gs://"):].partition("/")
        self.bucket_name, self.blob_name = bucket, name
        self.read_budget_s = read_budget_s
        self.bucket = _storage_client(storage).bucket(bucket)

    def _budget(self, budget_s: Optional[float]) -> dict:
        """The timeout and retry arguments of a request that must answer within `budget_s` (None: defaults)."""
        if budget_s is None:
            return {}
        from google.cloud.storage.retry import DEFAULT_RETRY

        retry = DEFAULT_RETRY.with_timeout(budget_s) if hasattr(DEFAULT_RETRY, "with_timeout") else \
            DEFAULT_RETRY.with_deadline(budget_s)
        return {"timeout": budget_s, "retry": retry}

    @contextlib.contextmanager
    def _reaching(self, budget_s: Optional[float]) -> Iterator[None]:
        """A request that could not reach the bucket within its budget: said with the bucket's name."""
        from google.api_core import exceptions

        began = time.monotonic()
        try:
            yield
        except (exceptions.RetryError, exceptions.ServiceUnavailable, exceptions.GatewayTimeout,
                exceptions.InternalServerError, ConnectionError, OSError) as exc:
            if budget_s is None:
                raise
            cause = exc.cause if isinstance(exc, exceptions.RetryError) and exc.cause is not None else exc
            raise LeaseRefused(
                f"could not reach Cloud Storage bucket gs://{self.bucket_name} to read the lease {self.path} within "
                f"{budget_s:g} s ({time.monotonic() - began:.1f} s tried): {reason(cause)}",
                hint="check this machine's network and the bucket's name; $STORAGE_EMULATOR_HOST, when set, "
                     "redirects Cloud Storage") from None

    def read(self, budget_s: Optional[float] = None) -> Tuple[Optional[bytes], object]:
        from google.api_core import exceptions

        budget_s = self.read_budget_s if budget_s is None else budget_s
        with self._reaching(budget_s):
            blob = self.bucket.get_blob(self.blob_name, **self._budget(budget_s))
            if blob is None:
                return None, 0
            try:
                return (blob.download_as_bytes(if_generation_match=blob.generation, **self._budget(budget_s)),
                        blob.generation)
            except (exceptions.PreconditionFailed, exceptions.NotFound):
                pass
        return self.read(budget_s)  # changed between the two requests: read the new one

    def version(self, budget_s: Optional[float] = None) -> object:
        """The lease object's generation (0: none), one metadata request: what a change of it is compared with."""
        with self._reaching(budget_s):
            blob = self.bucket.get_blob(self.blob_name, **self._budget(budget_s))
        return 0 if blob is None else blob.generation

    def _write(self, text: bytes, generation: int, budget_s: Optional[float] = None) -> object:
        """Upload `text` if the object's generation is still `generation`. Retried (the client's retries, within
        `budget_s`) when its reply does not come: a retry of a write the server applied fails the precondition,
        a `_Conflict` the lease resolves by reading the object back (`Lease._settle`)."""
        from google.api_core import exceptions

        blob = self.bucket.blob(self.blob_name)
        try:
            blob.upload_from_string(text, content_type="application/json", if_generation_match=generation,
                                    **self._budget(budget_s))
        except exceptions.PreconditionFailed:
            raise _Conflict() from None
        return blob.generation

    def create(self, text: bytes) -> object:
        return self._write(text, 0)  # 0: only if no such object exists

    def replace(self, text: bytes, token: object, stale_after_s: float, budget_s: Optional[float] = None) -> object:
        return self._write(text, int(token), budget_s)


def store_for(model_dir: str, read_budget_s: Optional[float] = None):
    return GcsStore(model_dir, read_budget_s) if model_dir.startswith("gs://") else LocalStore(model_dir)


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


def read_lease(model_dir: str, budget_s: Optional[float] = READ_BUDGET_S) -> Optional[dict]:
    """The lease in model_dir as its holder wrote it, or None when there is none (for `status`).

    On gs:// the read answers within `budget_s` (retries included), else raises `LeaseRefused` naming the bucket."""
    store = store_for(model_dir, budget_s)
    text, _ = store.read()
    return None if text is None else _decode(text, store.path)


# -------------------------------------------------------------------------------------------- lease

class StoreUnreachable(TpuLaunchError):
    """model_dir's store could not be reached for the lease's stale time: another run may take model_dir over
    meanwhile (the lease is stale), so this run stops writing there. Not a takeover: no run is known to hold it."""

    def __init__(self, model_dir: str, since: float, seconds: float, cause: BaseException):
        super().__init__(f"could not reach the store of run.model_dir {model_dir} for {age_text(seconds)} (since "
                         f"{clock_text(since)}; {reason(cause)}): past the lease's stale time another run may take "
                         "it over, so this run stopped without writing there again",
                         hint="rerun once the store answers: it resumes from the newest checkpoint there")


def clock_text(when: float) -> str:
    """'06:31:02 UTC' of a wall-clock time."""
    return datetime.datetime.fromtimestamp(when, tz=datetime.timezone.utc).strftime("%H:%M:%S UTC")


@dataclasses.dataclass
class Lease:
    """The lease this run holds; `took_over` says from whom, when it was taken over.

    A lease read back that is `held` and names this run and this lease (its `run_id`, and `holder`: a random token
    made when the lease was taken; never another run's, a restarted process's with the same pid included) is this
    run's own, whatever its generation: a write the store applied but whose reply was lost (the client's retry
    then fails its precondition) is adopted, not taken for a takeover. Only a lease naming another run, or
    released by someone else, fences this run."""

    store: object
    data: dict
    token: object
    renew_every_s: float
    stale_after_s: float
    clock: Callable[[], float] = time.time
    lost: Optional[dict] = None  # the lease someone else wrote over ours
    # Said when the store stops answering (wall-clock time since when, the error) and when it answers again (since
    # when, seconds it did not answer): by whichever of the renewal thread and the checks finds it first.
    on_unreachable: Callable[[float, BaseException], None] = lambda since, exc: None
    on_reachable: Callable[[float, float], None] = lambda since, seconds: None
    # When the lease was last known ours (time.monotonic(): a renewal written, a check passed).
    _known_at: float = dataclasses.field(default_factory=time.monotonic)
    _unreachable_since: Optional[Tuple[float, float]] = None  # (wall clock, monotonic) of the first failure
    _stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    _thread: Optional[threading.Thread] = None
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    _said: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @property
    def took_over(self) -> Optional[dict]:
        return self.data.get("took_over")

    def is_ours(self, data: Optional[dict]) -> bool:
        """Whether `data` (a lease as read) is this run's, still held."""
        return bool(data) and data.get("state") == "held" and data.get("run_id") == self.data["run_id"] and \
            data.get("holder") == self.data["holder"]

    def _put(self, data: dict, budget_s: Optional[float] = None) -> None:
        with self._lock:
            try:
                self.token = self.store.replace(_encode(data), self.token, self.stale_after_s, budget_s)
            except _Conflict:
                self._settle(data, budget_s)
            self.data = data

    def _settle(self, data: dict, budget_s: Optional[float]) -> None:
        """A change refused (the lease is not at the version last written): read it back. It is `data` itself (this
        write was applied, its reply lost): adopted. It is this run's held lease (an earlier write whose reply was
        lost): adopted, and `data` written over it. Anything else: `_Conflict`."""
        text, token = self.store.read()
        try:
            now = _decode(text, self.store.path) if text else None
        except LeaseRefused:  # not a lease now: not ours (`_found_lost` says so)
            raise _Conflict() from None
        if now == data:
            self.token = token
            return
        if not self.is_ours(now):
            raise _Conflict()
        self.token = self.store.replace(_encode(data), token, self.stale_after_s, budget_s)

    def renew(self) -> bool:
        """Write a new renewal time; False (and `lost` set) when another run took the lease over. Each try is
        bounded (an interval, at least a few seconds), so an unreachable store is said within that and retried at
        the next interval."""
        if self.lost is not None:
            return False
        try:
            self._put({**self.data, "renewed": self.clock()}, max(self.renew_every_s, READ_BUDGET_S))
        except _Conflict:
            with self._lock:
                self._found_lost(reclaim=True)
            if self.lost is not None:
                return False
        self._reached()
        self._known_at = time.monotonic()
        return True

    @property
    def model_dir(self) -> str:
        return self.store.model_dir

    def raise_if_lost(self) -> None:
        """Raise `LeaseLost` when the renewal thread found the lease taken over: after every step, without I/O
        while renewals keep up. A renewal more than two intervals overdue means this process was frozen (or its
        store is slow or unreachable): the lease is reread before the next step (`ensure_held`, which waits for an
        unreachable store), so a process that thaws stops after the step it was in, whichever of its threads runs
        first."""
        if self.lost is not None:
            raise LeaseLost(self.model_dir, self.lost)
        if self._thread is not None and time.monotonic() - self._known_at > 2 * self.renew_every_s:
            self.ensure_held()

    def ensure_held(self) -> None:
        """Reread the lease (on gs://: its generation) and raise `LeaseLost` when another run holds it now: before
        every checkpoint save and evaluation, so a run that thawed after being frozen past the stale time writes
        nothing into its successor's model_dir. A store that cannot be reached is waited for and retried (said
        once, with since when) until the lease would go stale, then `StoreUnreachable`: a run that cannot tell
        whether it still holds model_dir writes nothing there. No lock is held while reading, so a renewal slowed
        by an outage never holds training up here."""
        if self.lost is None:
            checked_at = time.monotonic()
            if self._current_version() != self.token:
                # A renewal may be between its write and its new token: under the lock it has finished.
                with self._lock:
                    if self._current_version() != self.token:
                        self._found_lost(reclaim=True)
            if self.lost is None:
                self._known_at = max(self._known_at, checked_at)
        if self.lost is not None:
            raise LeaseLost(self.model_dir, self.lost)

    def _current_version(self) -> object:
        """The lease's version now (`store.version`), waiting while the store cannot be reached, up to the stale
        time since the lease was last known ours."""
        while True:
            try:
                version = self.store.version(CHECK_BUDGET_S)
            except Exception as exc:
                since = self._unreached(exc)
                if time.monotonic() - self._known_at > self.stale_after_s:
                    raise StoreUnreachable(self.model_dir, since[0], time.monotonic() - since[1], exc) from None
                time.sleep(min(1.0, self.renew_every_s))  # the next try: the store's own retries have waited already
                continue
            self._reached()
            return version

    def _unreached(self, exc: BaseException) -> Tuple[float, float]:
        with self._said:
            if self._unreachable_since is None:
                self._unreachable_since = (time.time(), time.monotonic())
                self.on_unreachable(self._unreachable_since[0], exc)
            return self._unreachable_since

    def _reached(self) -> None:
        with self._said:
            if self._unreachable_since is not None:
                since, self._unreachable_since = self._unreachable_since, None
                self.on_reachable(since[0], time.monotonic() - since[1])

    def _found_lost(self, reclaim: bool = False) -> None:
        """The lease is not the one this run last wrote: `lost` says whose it is now. This run's own, held (a write
        applied whose reply was lost), is adopted as it is. A lease file that is gone (removed by hand, or with
        model_dir) is no other run's: with `reclaim` it is made again, ours (an exclusive create: a run that made
        it first has taken it, and this one is lost)."""
        try:
            text, token = self.store.read()
            if text is None and reclaim:
                try:
                    self.token = self.store.create(_encode(self.data))
                    return
                except _Conflict:
                    text, token = self.store.read()
                except Exception:  # model_dir cannot be written now: its own writes say so, naming it
                    return
            now = _decode(text, self.store.path) if text else None
            if self.is_ours(now):
                self.token, self.data = token, now
                return
            self.lost = now or {"state": "missing"}
        except Exception:  # changed, but unreadable now: lost all the same
            self.lost = {"state": "unreadable"}

    def start_renewing(self, on_lost: Callable[[dict], None]) -> "Lease":
        def loop():
            while not self._stop.wait(self.renew_every_s):
                try:
                    if not self.renew():
                        on_lost(self.lost)
                        return
                except Exception as exc:  # a failed renewal is retried: the lease goes stale only after many
                    self._unreached(exc)

        self._thread = threading.Thread(target=loop, name="tpulaunch-lease", daemon=True)
        self._thread.start()
        return self

    def release(self) -> None:
        """Stop renewing and mark the lease released (left alone when another run holds it now)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        _HELD_HERE.discard(self.data["run_id"])  # ended, even if the write below fails (a full disk, say)
        if _FENCES.get(_fence_key(self.model_dir)) is self:
            del _FENCES[_fence_key(self.model_dir)]
        if self.lost is not None:
            return
        try:
            self._put({**self.data, "state": "released", "renewed": self.clock()})
        except _Conflict:
            self._found_lost()


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
        lease = _acquire(store, model_dir, run_id, command, take, clock, renew, stale)
        _FENCES[_fence_key(lease.model_dir)] = lease
        return lease
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
    holder = secrets.token_hex(8)  # this lease's, in every write of it: a lease read back with it is ours
    for _ in range(5):  # each pass loses only to another run's change, which the next pass reads
        text, token = store.read()
        now = clock()
        mine = {"state": "held", "host": socket.gethostname(), "pid": os.getpid(), "run_id": run_id,
                "holder": holder, "command": command, "started": now, "renewed": now, "renew_every_s": renew,
                "stale_after_s": stale, "took_over": None}
        try:
            if text is None:
                token = store.create(_encode(mine))
            else:
                held = _decode(text, store.path)
                if held["state"] == "held" and held.get("holder") == holder:
                    # This run's own write, applied though its reply was lost (the retry failed its precondition).
                    return Lease(store, held, token, renew, stale, clock)
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
# The lease this process holds on each model_dir, for the checks the engines make before they write there (they
# are handed the job, not the lease: a worker that holds none, or a library call, checks nothing).
_FENCES: dict = {}


def release_lost_holder(model_dir: str, *, host: str, pid: int, why: str, clock: Callable[[], float] = time.time) -> bool:
    """Mark model_dir's lease released on behalf of a holder that is gone with its machine (a preempted VM), when the
    lease still names that holder (its host and pid), conditional on what was read: a lease changed since, someone
    else's now, is left alone. True when it was released; the next run then takes it at once, not after the stale time."""
    store = store_for(model_dir)
    text, token = store.read()
    if text is None:
        return False
    try:
        data = json.loads(text)
    except ValueError:
        return False
    if data.get("state") != "held" or data.get("host") != host or data.get("pid") != pid:
        return False
    released = {**data, "state": "released", "renewed": clock(), "released_by": why}
    try:
        store.replace(_encode(released), token, float(data.get("stale_after_s") or STALE_AFTER_S))
    except _Conflict:
        return False
    return True


def _fence_key(model_dir: str) -> str:
    return model_dir.rstrip("/")


def ensure_held(model_dir: str) -> None:
    """Before writing into model_dir (a checkpoint, an evaluation): raise `LeaseLost` when this process held its
    lease and another run has taken it over (a reread of the lease; see `Lease.ensure_held`)."""
    lease = _FENCES.get(_fence_key(model_dir))
    if lease is not None:
        lease.ensure_held()


def raise_if_lost(model_dir: str) -> None:
    """After a step: raise `LeaseLost` when the renewal thread found model_dir's lease taken over (no I/O)."""
    lease = _FENCES.get(_fence_key(model_dir))
    if lease is not None:
        lease.raise_if_lost()


def holder_gone(held: dict) -> bool:
    """Whether the holder ran on this host and its process is no longer running (killed, crashed), or is this
    process and its run ended: its lease need not wait out the stale time. A holder on another host, or a
    process that still exists, is not known gone."""
    if held.get("host") != socket.gethostname() or not isinstance(held.get("pid"), int):
        return False
    if held["pid"] == os.getpid():
        return held.get("run_id") not in _HELD_HERE
    return _process_gone(held)


def _process_gone(held: dict) -> bool:
    """Whether `held` names another process on this host that no longer runs."""
    if held.get("host") != socket.gethostname() or not isinstance(held.get("pid"), int) or held["pid"] == os.getpid():
        return False
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
