"""The form of data and model_dir paths: no network, no TensorFlow (the filesystem only for what a local path is).

A Cloud TPU node reads input and writes checkpoints through its own hosts, which see Cloud Storage but
not this machine's disk: a local path there fails only once training starts. On a TPU VM (`tpu.name:
local`) the host is this machine, so local paths work.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Iterator, Optional, Tuple, Union

from tpulaunch.job.load import LoadedJob

# Cloud Storage bucket names: 3-63 chars (up to 222 with dots), lowercase, digits, - _ .
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):/*")


def split_gcs(path: str) -> tuple:
    """('bucket', 'object/path') of a gs:// URL (no validation)."""
    rest = path[len("gs://"):]
    bucket, _, obj = rest.partition("/")
    return bucket, obj


def has_glob(path: str) -> bool:
    return any(ch in path for ch in "*?[")


def as_list(files: Union[str, list, None]) -> list:
    if files is None:
        return []
    return [files] if isinstance(files, str) else list(files)


# What a local data path that is not a regular file is, and why it cannot be read as TFRecords.
_NOT_A_FILE = (
    (stat.S_ISDIR, "a directory", "a directory holds files, it is not one"),
    (stat.S_ISFIFO, "a FIFO (named pipe)", "reading it waits, without end, for something to write into it"),
    (stat.S_ISSOCK, "a socket", "it cannot be read as a file"),
    (stat.S_ISCHR, "a character device", "reading it waits on the device or never ends"),
    (stat.S_ISBLK, "a block device", "it is a disk, not a file on one"),
)


def not_a_file(path: str) -> Optional[Tuple[str, str]]:
    """(what it is, why it cannot be read) for a local data path that is not a regular file (a FIFO, a socket, a
    device, a directory), else None: also for a URL (Cloud Storage holds objects only) and a path that is missing
    or cannot be looked at (said where it is listed or read). Symbolic links are followed."""
    if "://" in path:
        return None
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    return next(((what, why) for test, what, why in _NOT_A_FILE if test(mode)),
                ("not a regular file", "it is not a file"))


def not_a_file_text(path: str, found: Tuple[str, str]) -> Tuple[str, str]:
    """(message, hint) for a data path that is not a regular file: validate's problem and train's refusal."""
    what, why = found
    return (f"{path} is {what}, not a TFRecord file: {why}",
            "name only TFRecord files (a glob such as DIR/*.tfrecord matches only them), or move it out of the "
            "data directory")


def path_form_error(path: str) -> Union[tuple, None]:
    """(message, hint) when `path` cannot be a local path or a gs:// URL, else None."""
    if path.startswith("gs://"):
        bucket, obj = split_gcs(path)
        if not bucket:
            return "gs:// URL without a bucket", "write gs://BUCKET/path/train-*.tfrecord"
        if not _BUCKET.match(bucket):
            return (f"'{bucket}' is not a valid Cloud Storage bucket name",
                    "bucket names are 3-63 characters: lowercase letters, digits, '-', '_' and '.'")
        return None
    match = _SCHEME.match(path)
    if match and len(match["scheme"]) > 1:  # one letter is a Windows drive
        scheme = match["scheme"].lower()
        if scheme in ("gcs", "gs"):
            return f"'{path}' is not a gs:// URL", "write gs://BUCKET/path (two slashes after gs:)"
        return (f"'{scheme}://' paths are not readable by TensorFlow on a Cloud TPU",
                "copy the data to Cloud Storage and use gs://BUCKET/path")
    return None


def _paths(loaded: LoadedJob) -> Iterator[tuple]:
    data, run = loaded.section("data"), loaded.section("run")
    for split in ("train", "eval"):
        files = getattr(data, split, None) if data is not None else None
        if isinstance(files, list):
            for i, path in enumerate(files):
                yield ("data", split, i), path, "data"
        elif isinstance(files, str):
            yield ("data", split), files, "data"
    if run is not None:
        yield ("run", "model_dir"), run.model_dir, "model_dir"


def path_form_problems(loaded: LoadedJob) -> list:
    """Malformed URLs anywhere; local paths where a Cloud TPU node would have to read or write them."""
    tpu = loaded.section("tpu")
    tpu_node = tpu is not None and (tpu.name or "") != "local"
    problems = []
    for path_key, path, kind in _paths(loaded):
        error = path_form_error(path)
        if error:
            problems.append(loaded.problem(path_key, "path-malformed", error[0], error[1]))
            continue
        if tpu_node and not path.startswith("gs://"):
            if kind == "data":
                problems.append(loaded.problem(
                    path_key, "local-path-on-tpu",
                    f"'{path}' is a local path, but a Cloud TPU node reads its input only from gs://",
                    "upload the files (gcloud storage cp -r DIR gs://BUCKET/DIR) and name them here; "
                    "for a local run use `tpulaunch train JOB --local`, or tpu.name: local on a TPU VM"))
            else:
                problems.append(loaded.problem(
                    path_key, "local-path-on-tpu",
                    f"model_dir '{path}' is local, but a Cloud TPU node writes checkpoints only to gs://",
                    "use gs://BUCKET/runs/NAME (override with --set run.model_dir=... for local runs)"))
    return problems


def python_path_problems(loaded: LoadedJob) -> list:
    """python_path entries are directories of this machine, where Python imports the job's code from."""
    problems = []
    for i, entry in enumerate(loaded.section("python_path") or []):
        if "://" in entry:
            problems.append(loaded.problem(("python_path", i), "python-path-remote",
                                           f"'{entry}' is not a local directory: Python imports only from this machine",
                                           "copy the program's source tree here and name its directory"))
        elif not os.path.isdir(entry):
            problems.append(loaded.problem(("python_path", i), "python-path-missing",
                                           f"no directory {entry}",
                                           "entries are relative to the job file's directory"))
    return problems
