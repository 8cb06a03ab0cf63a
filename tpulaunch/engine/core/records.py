"""The run record file in model_dir: whole lines or nothing (model_dir may be gs://).

A record is one JSON line, written in one piece:

- local: one `write()` to the file opened for appending. A write that fails part way (a full disk) is undone
  by cutting the file back to its size before it, so the file keeps only whole lines.
- gs:// (and TensorFlow's other filesystems): Cloud Storage has no append; the object is rewritten whole, its
  old text and the new line in one upload (TensorFlow's own append does the same), which either lands or not.

A crash between the two (the process killed mid-write, the machine lost) can still leave a torn last line.
Before each append, the file's text after its last newline is set apart: appended, as one line, to
model_dir/tpulaunch-runs.jsonl.torn, and cut from the record file, so the new record starts on a line of its
own and every whole record before it is kept. Readers skip a line that is not a record, with a message.
"""

from __future__ import annotations

import contextlib
import os
from typing import List, Optional

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
        _append_remote(model_dir, path, line)
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


def _append_remote(model_dir: str, path: str, line: str) -> None:
    import tensorflow as tf

    if not tf.io.gfile.isdir(model_dir):
        tf.io.gfile.makedirs(model_dir)
    text = _read_remote(path) or ""
    whole, torn = split_torn(text)
    if torn:
        torn_path = path + TORN_SUFFIX
        with tf.io.gfile.GFile(torn_path, "w") as handle:
            handle.write((_read_remote(torn_path) or "") + torn + "\n")
    with tf.io.gfile.GFile(path, "w") as handle:  # one upload: the old whole lines and the new one
        handle.write(whole + line)


def _read_remote(path: str) -> Optional[str]:
    import tensorflow as tf

    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "rb") as handle:
        return handle.read().decode("utf-8", errors="replace")


def record_lines(model_dir: str) -> List[str]:
    """The lines of model_dir/tpulaunch-runs.jsonl; none when there is no such file."""
    path = os.path.join(model_dir, RECORD_FILE)
    if _is_local(model_dir):
        try:
            with open(path, "rb") as handle:
                return handle.read().decode("utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return []
    text = _read_remote(path)
    return [] if text is None else text.splitlines()
