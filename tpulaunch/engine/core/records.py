"""The run record file in model_dir: whole lines or nothing (model_dir may be gs://).

A record is one JSON line, written in one piece:

- local: one `write()` to the file opened for appending: the line lands after whatever another process appended,
  and costs one write however long the file is (the store writes files whole, so this stays on the filesystem's own
  append). A write that fails part way (a full disk) is undone by cutting the file back to its size before it, so
  the file keeps only whole lines.
- gs://: Cloud Storage has no append; the object is rewritten whole through the store (`tpulaunch/store/`, the
  same client and timeout as the lease), its old text and the new line in one upload, which either lands or not.
  The upload is conditional on the generation read, so two runs appending at once both land (the one refused reads
  again), and a retried upload whose reply was lost finds its line there and is done.

A crash between the two (the process killed mid-write, the machine lost) can still leave a torn last line.
Before each append, the file's text after its last newline is set apart: appended, as one line, to
model_dir/tpulaunch-runs.jsonl.torn, and cut from the record file, so the new record starts on a line of its
own and every whole record before it is kept. Readers skip a line that is not a record, with a message.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable, List, Optional

from tpulaunch import store
from tpulaunch.run.record import RECORD_FILE, TORN_SUFFIX, split_torn

_TAIL_CHUNK = 64 * 1024


def _is_local(path: str) -> bool:
    return "://" not in path


def append_record(model_dir: str, line: str) -> str:
    """Append one record line to model_dir/tpulaunch-runs.jsonl (made with model_dir when missing), setting
    apart a torn last line first; returns the file's path."""
    if not line.endswith("\n") or "\n" in line[:-1]:
        raise ValueError("a run record is one line ending with a newline")
    path = os.path.join(model_dir, RECORD_FILE)
    if _is_local(model_dir):
        os.makedirs(model_dir, exist_ok=True)  # a run that failed before making it
        _append_local(path, line.encode("utf-8"))
    else:
        _append_remote(path, line)
    return path


def _append_local(path: str, data: bytes) -> None:
    existed = os.path.exists(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)  # the umask decides the mode
    try:
        size = _set_apart_local_tail(fd, path)
        try:
            written = os.write(fd, data)
            if written != len(data):  # a short write: the disk filled up mid-record
                raise OSError(28, os.strerror(28), path)
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)  # nothing of this record stays: the file ends with a whole line
                if not existed and size == 0:
                    os.unlink(path)  # nor an empty file this append made
            raise
    finally:
        os.close(fd)


def _set_apart_local_tail(fd: int, path: str) -> int:
    """Move the text after the file's last newline (a torn record) to the .torn file; returns the new size."""
    size = os.fstat(fd).st_size
    end = size
    tail = b""
    while end > 0:
        start = max(0, end - _TAIL_CHUNK)
        chunk = os.pread(fd, end - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            tail = chunk[newline + 1:] + tail
            end = start + newline + 1
            break
        tail = chunk + tail
        end = start
    if not tail:
        return size
    torn = os.open(path + TORN_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        os.write(torn, tail + b"\n")
        os.fsync(torn)
    finally:
        os.close(torn)
    os.ftruncate(fd, end)
    return end


def _append_remote(path: str, line: str) -> None:
    def cut_torn(text: str) -> str:
        whole, torn = split_torn(text)
        if torn:
            _rewrite(path + TORN_SUFFIX, lambda kept: kept + torn + "\n")
        return whole + line

    _rewrite(path, cut_torn)


def _rewrite(path: str, change: Callable[[str], str]) -> None:
    """Write `change(the object's text)` over the object, conditional on the generation that text was read at;
    read again and redo when another writer changed it first."""
    while True:
        found = store.read(path)
        new = change(_text(found))
        try:
            store.write(path, new.encode("utf-8"), if_generation_match=found.generation if found else 0)
            return
        except store.PreconditionFailed:
            if _text(store.read(path)).startswith(new):  # this write landed, its reply lost (and maybe more after)
                return


def _text(found: Optional[store.Found]) -> str:
    return "" if found is None else found.data.decode("utf-8", errors="replace")


def record_lines(model_dir: str) -> List[str]:
    """The lines of model_dir/tpulaunch-runs.jsonl; none when there is no such file."""
    return _text(store.read(os.path.join(model_dir, RECORD_FILE))).splitlines()
