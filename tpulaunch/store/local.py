"""The store on this machine's filesystem (or a mounted one): files written whole and atomically, with the same
generation preconditions as Cloud Storage's.

A local file's generation is a digest of its bytes (never 0; 0 means no such file): a reader compares what it
read with what is there now, as Cloud Storage's generation number lets it. Writing the same bytes again keeps the
generation, which is right for what the precondition guards: the content a change was decided on.

Atomicity:
- a write is a complete temporary file renamed over the name (a reader sees the old file or the new one, never
  a part); a write that fails (a full disk, a quota) removes its temporary file;
- "must not exist" (`if_generation_match=0`) links the complete temporary file to the name: link() fails when
  the name exists, like O_CREAT|O_EXCL, but no reader sees the file empty;
- every other write, rename and delete reads, checks and changes the file under a guard file (`NAME.lock`, an
  exclusive create naming its holder), held for milliseconds. A guard whose holder ran on this host and is gone,
  or older than the call's timeout (its holder was killed elsewhere, or frozen: a live call is over by then), is
  removed; a holder frozen inside its change finds its guard gone when it thaws and changes nothing
  (`PreconditionFailed`).
"""

from __future__ import annotations

import contextlib
import glob as globbing
import hashlib
import os
import secrets
import socket
import time
from typing import Callable, Iterator, List, Optional

from tpulaunch.store.errors import NotFound, PreconditionFailed, Unreachable


def digest(data: bytes) -> int:
    """A local file's generation: 63 bits of its bytes' BLAKE2b, never 0."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") >> 1 or 1


def read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def generation(path: str) -> int:
    data = read(path)
    return 0 if data is None else digest(data)


def write(path: str, data: bytes, if_generation_match: Optional[int], private: bool, timeout_s: float) -> int:
    if if_generation_match != 0:
        # A write over a file that must be at a generation: its folder exists, or the file does not either.
        if if_generation_match is None:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        try:
            temporary = _written(path, data, private)  # before the guard: a slow disk holds no one else up
        except FileNotFoundError:  # its folder is gone, so is the file that had to be at a generation
            raise PreconditionFailed(path, if_generation_match) from None
        try:
            with _guarded(path, if_generation_match, timeout_s) as still_mine:
                if not still_mine():
                    raise PreconditionFailed(path, if_generation_match or 0)
                os.replace(temporary, path)
        except BaseException:
            _remove(temporary)
            raise
        return digest(data)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    temporary = _written(path, data, private)
    try:
        os.link(temporary, path)
    except FileExistsError:
        raise PreconditionFailed(path, 0) from None
    finally:
        os.unlink(temporary)
    return digest(data)


def rename(source: str, target: str, if_generation_match: Optional[int], timeout_s: float) -> None:
    if not os.path.exists(source):
        raise NotFound(source)
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    with _guarded(target, if_generation_match, timeout_s) as still_mine:
        if not still_mine():
            raise PreconditionFailed(target, if_generation_match or 0)
        try:
            os.replace(source, target)
        except FileNotFoundError:
            raise NotFound(source) from None


def delete(path: str, if_generation_match: Optional[int], timeout_s: float) -> None:
    if not os.path.exists(path):
        raise NotFound(path)
    with _guarded(path, if_generation_match, timeout_s) as still_mine:
        if not still_mine():
            raise PreconditionFailed(path, if_generation_match or 0)
        try:
            os.unlink(path)
        except FileNotFoundError:
            raise NotFound(path) from None


def list_files(pattern: str) -> List[str]:
    if pattern.endswith("/"):
        return sorted(os.path.join(folder, name) for folder, _, names in os.walk(pattern) for name in names
                      if not _is_ours(name))
    return sorted(path for path in globbing.glob(pattern) if os.path.isfile(path) and not _is_ours(path))


def _is_ours(path: str) -> bool:
    """The store's own files, which no listing shows: temporary files, and a guard (during a change, or left by a
    holder that died, until the next change removes it)."""
    name = os.path.basename(path)
    return (name.endswith(".tmp") and ".store." in name) or name.endswith(".lock")


def _written(path: str, data: bytes, private: bool) -> str:
    """A temporary file beside `path` holding `data`, flushed to disk; removed when writing it fails."""
    temporary = f"{path}.store.{os.getpid()}.{secrets.token_hex(3)}.tmp"
    # Private: this user alone (a run's stage holds what the job holds); else as open() makes it (the umask decides).
    fd = os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600 if private else 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        _remove(temporary)
        raise
    return temporary


@contextlib.contextmanager
def _guarded(path: str, if_generation_match: Optional[int], timeout_s: float) -> Iterator[Callable[[], bool]]:
    """Hold `path`'s guard for one read-check-change, the file checked at `if_generation_match` (None: any); yields
    a check that the guard is still this call's. Raises `PreconditionFailed` when the file is at another
    generation, `Unreachable` when the guard stays held by a live holder past the timeout."""
    guard = path + ".lock"
    mark = f"{socket.gethostname()} {os.getpid()} {secrets.token_hex(4)}".encode()
    deadline = time.monotonic() + 2 * timeout_s
    while True:
        try:
            fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileNotFoundError:  # its folder is gone, and the file with it
            raise PreconditionFailed(path, if_generation_match) if if_generation_match else NotFound(path) \
                from None
        except FileExistsError:
            holder = _guard_holder(guard)
            with contextlib.suppress(FileNotFoundError):
                if process_gone(holder) or time.time() - os.stat(guard).st_mtime > timeout_s:
                    os.unlink(guard)
                    continue
            if time.monotonic() > deadline:
                who = f"host {holder['host']}, pid {holder['pid']}" if holder.get("host") else "another process"
                raise Unreachable(f"{guard} is held by {who}, inside a change of {path} (frozen there?)", path,
                                  "a change of it is under way elsewhere",
                                  hint="it is removed once its holder is gone; remove it by hand only when nothing "
                                       "else uses this folder") from None
            time.sleep(0.01)
            continue
        try:
            os.write(fd, mark)
        except BaseException:
            os.close(fd)
            _remove(guard)
            raise
        os.close(fd)
        break

    def still_mine() -> bool:
        try:
            with open(guard, "rb") as handle:
                return handle.read() == mark
        except FileNotFoundError:
            return False

    try:
        if if_generation_match is not None and generation(path) != if_generation_match:
            raise PreconditionFailed(path, if_generation_match)
        yield still_mine
    finally:
        if still_mine():
            _remove(guard)


def _guard_holder(guard: str) -> dict:
    """{"host", "pid"} of the guard's holder as it wrote them ({} when unreadable or not written yet)."""
    try:
        with open(guard, "rb") as handle:
            host, pid, _ = handle.read().decode().split(" ")
        return {"host": host, "pid": int(pid)}
    except (OSError, ValueError):
        return {}


def pid_namespace() -> str:
    """This process's PID namespace ("pid:[4026531836]"; "" where /proc does not say): processes that share a host
    name (containers on one node, GKE's hostNetwork pods) but not this see other pids than its own."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def process_gone(holder: dict) -> bool:
    """Whether `holder` ({"host", "pid"} and, where it said it, "pid_ns": a guard's, a lease's) names another
    process on this host, in this PID namespace, that no longer runs. A pid of another namespace is not looked up:
    it would name another process here, or none."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int) or \
            holder["pid"] == os.getpid():
        return False
    if holder.get("pid_ns") and holder["pid_ns"] != pid_namespace():
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists (another user's process, say)
        return False
    return _zombie(holder["pid"])


def _zombie(pid: int) -> bool:
    """Whether `pid` has ended and only waits for its parent to reap it: every thread of it in state Z in /proc
    (signal 0 still reaches it, but it holds nothing). A leader thread that exited while others of the process run
    shows Z too, and the process still runs: not a zombie. False where /proc does not say."""
    try:
        stats = [f"/proc/{pid}/task/{task}/stat" for task in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        stats = [f"/proc/{pid}/stat"]
    states = [_state(stat) for stat in stats]
    return bool(states) and all(state == b"Z" for state in states)


def _state(stat_path: str) -> bytes:
    """The state letter of a /proc stat file (it follows the name in parentheses); b"" where it cannot be read."""
    try:
        with open(stat_path, "rb") as handle:
            stat = handle.read()
    except OSError:
        return b""
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
