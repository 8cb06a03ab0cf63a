"""One writer per model_dir: the lease `train` and `evaluate` hold on model_dir while they run.

Two runs of one job started a second apart would otherwise both train, both print `done` and silently
overwrite each other's checkpoints (a relaunch of a run believed dead, a CI retry, a second VM). So a run
takes `model_dir/tpulaunch.lease` before it writes anything and before TensorFlow is imported, renews it
from a background thread while it lives and marks it released when it ends::

    {"state": "held", "host": "vm-1", "pid": 4242, "run_id": "20250101T100000Z-vm-1-4242-1a2b3c",
     "holder": "5f0c2a9e41d7b3c8", "command": "train", "started": 1735725600.0, "renewed": 1735725630.0,
     "renew_every_s": 30.0, "stale_after_s": 180.0, "took_over": null}

Every change is atomic, so two runs can never both win: the lease is read and written through the store
(`tpulaunch/store/`), each change conditional on the generation last read (local: a digest of the file, checked
under the store's guard file; gs://: Cloud Storage's generation, checked by the server). The first lease is made
only if there is none (if_generation_match=0); renew, release and take over with the generation last read.
Releasing is a conditional rewrite marking the lease released, not a delete, so every change is a precondition
the store checks.

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
was lost: adopted, generation and all. A store that cannot be reached (`store.Unreachable`: no answer within the
store's timeout) is waited for before a write, up to the stale time (`StoreUnreachable` past it).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import secrets
import socket
import threading
import time
from typing import Callable, Optional, Tuple

from tpulaunch import store
from tpulaunch.errors import ExitCode, TpuLaunchError, first_line
from tpulaunch.store import reason
from tpulaunch.store.local import pid_namespace, process_gone

LEASE_FILE = "tpulaunch.lease"
RENEW_ENV = "TPULAUNCH_LEASE_RENEW_S"
STALE_ENV = "TPULAUNCH_LEASE_STALE_S"
RENEW_EVERY_S = 30.0
STALE_AFTER_S = 180.0  # six missed renewals: a slow filesystem or a short GCS outage does not lose the lease
# Each read or write of the lease answers within the store's one timeout (`store.TIMEOUT_S`): a running train's
# renewal that gets no answer is tried again at the next interval, so an outage is said within seconds and a short
# one does not fail the run; its check before a save tries again and again, waiting for the store up to the stale
# time (`Lease.ensure_held`).


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
        self.step: Optional[int] = None  # the step whose save it stopped, when it stopped one (that step was trained)


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


# ------------------------------------------------------------------------------------------- the file

class LeaseFile:
    """The lease file in model_dir, through the store (`tpulaunch/store/`): its bytes and generation; every change
    conditional on the generation last read or written (0: only if there is none), so of two changes decided on the
    same lease one wins and the other is a `_Conflict`."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self.path = lease_path(model_dir)

    def read(self) -> Tuple[Optional[bytes], int]:
        found = store.read(self.path)
        return (None, 0) if found is None else (found.data, found.generation)

    def version(self) -> int:
        """The lease's generation now (0: none), what a change of it is compared with: one metadata request."""
        return store.generation(self.path)

    def create(self, text: bytes) -> int:
        return self.replace(text, 0)

    def replace(self, text: bytes, token: int) -> int:
        """Write `text` over the lease if it is still at generation `token`. A write the store applied whose reply
        was lost fails its precondition on the retry: a `_Conflict` the lease resolves by reading the lease back
        (`Lease._settle`)."""
        try:
            return store.write(self.path, text, if_generation_match=token)
        except store.PreconditionFailed:
            raise _Conflict() from None


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
    """The lease in model_dir as its holder wrote it, or None when there is none (for `status`). On gs:// the read
    answers within the store's timeout, else raises `store.Unreachable` naming the bucket."""
    lease_file = LeaseFile(model_dir)
    text, _ = lease_file.read()
    return None if text is None else _decode(text, lease_file.path)


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

    file: LeaseFile
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

    def _put(self, data: dict) -> None:
        with self._lock:
            try:
                self.token = self.file.replace(_encode(data), self.token)
            except _Conflict:
                self._settle(data)
            self.data = data

    def _settle(self, data: dict) -> None:
        """A change refused (the lease is not at the version last written): read it back. It is `data` itself (this
        write was applied, its reply lost): adopted. It is this run's held lease (an earlier write whose reply was
        lost): adopted, and `data` written over it. Anything else: `_Conflict`."""
        text, token = self.file.read()
        try:
            now = _decode(text, self.file.path) if text else None
        except LeaseRefused:  # not a lease now: not ours (`_found_lost` says so)
            raise _Conflict() from None
        if now == data:
            self.token = token
            return
        if not self.is_ours(now):
            raise _Conflict()
        self.token = self.file.replace(_encode(data), token)

    def renew(self) -> bool:
        """Write a new renewal time; False (and `lost` set) when another run took the lease over. Each try ends within
        the store's timeout, so an unreachable store is said within seconds and retried at the next interval."""
        if self.lost is not None:
            return False
        try:
            self._put({**self.data, "renewed": self.clock()})
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
        return self.file.model_dir

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
        """The lease's version now (`LeaseFile.version`), waiting while the store cannot be reached, up to the stale
        time since the lease was last known ours."""
        while True:
            try:
                version = self.file.version()
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
            text, token = self.file.read()
            if text is None and reclaim:
                try:
                    self.token = self.file.create(_encode(self.data))
                    return
                except _Conflict:
                    text, token = self.file.read()
                except Exception:  # model_dir cannot be written now: its own writes say so, naming it
                    return
            now = _decode(text, self.file.path) if text else None
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
            clock: Callable[[], float] = time.time, lease_file: Optional[LeaseFile] = None) -> Lease:
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
        lease = _acquire(lease_file or LeaseFile(model_dir), model_dir, run_id, command, take, clock, renew, stale)
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


def _acquire(lease_file, model_dir, run_id, command, take, clock, renew, stale) -> Lease:
    holder = secrets.token_hex(8)  # this lease's, in every write of it: a lease read back with it is ours
    for _ in range(5):  # each pass loses only to another run's change, which the next pass reads
        text, token = lease_file.read()
        now = clock()
        mine = {"state": "held", "host": socket.gethostname(), "pid": os.getpid(), "pid_ns": pid_namespace(),
                "run_id": run_id,
                "holder": holder, "command": command, "started": now, "renewed": now, "renew_every_s": renew,
                "stale_after_s": stale, "took_over": None}
        try:
            if text is None:
                token = lease_file.create(_encode(mine))
            else:
                held = _decode(text, lease_file.path)
                if held["state"] == "held" and held.get("holder") == holder:
                    # This run's own write, applied though its reply was lost (the retry failed its precondition).
                    return Lease(lease_file, held, token, renew, stale, clock)
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
                token = lease_file.replace(_encode(mine), token)
        except _Conflict:
            continue
        return Lease(lease_file, mine, token, renew, stale, clock)
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
    lease_file = LeaseFile(model_dir)
    text, token = lease_file.read()
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
        lease_file.replace(_encode(released), token)
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
    return process_gone(held)


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
    held = f"held by {holder_text(data)} ({data.get('command')}), last renewed {age} ago"
    if holder_gone(data):  # killed or crashed on this host: `train` takes it over at once, status says so
        held += "; its process is no longer running on this host: the next run takes it over at once"
    return held
