"""The data dry run of `validate`: files exist, records parse as the job declares, counts add up.

Reads through TensorFlow's own filesystem (`tf.io.gfile`), so a `gs://` path that passes here is read
the same way by the TPU host. Problems are located at the job-file key they are about (the
`data.train` glob that matched nothing, the feature spec a record disagrees with) and name the file,
the record index and, for corruption, the byte offset TensorFlow reports.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Optional

from tpulaunch.checks.paths import as_list, has_glob, not_a_file, not_a_file_text
from tpulaunch.errors import first_line
from tpulaunch.job.schema import DTYPE_BYTES, TensorSpec
from tpulaunch.job.load import LoadedJob

# Where TensorFlow's reader says a record is bad ("corrupted record at 1234"): read here and by the engines' input
# pipeline (`engine/pipeline.py`), which names the file and record behind a read error.
CORRUPT_RECORD_AT = re.compile(r"(corrupted|truncated) record at (\d+)")

# At most this many files are opened when sampling (spread over the list); --all-records opens all.
MAX_SAMPLED_FILES = 16
# How long one split may spend on remote filesystems before the dry run says so and stops reading.
TIME_BUDGET_SECONDS = 60.0

_KIND_OF_ENCODING = {"float_list": "float_list", "int64_list": "int64_list", "raw": "bytes_list",
                     "png": "bytes_list", "jpeg": "bytes_list"}


@dataclass
class DataReport:
    """What the dry run found for one split."""

    split: str
    files: int = 0
    files_read: int = 0
    records_read: int = 0
    records_counted: Optional[int] = None  # exact, with --all-records
    records_estimated: Optional[int] = None  # from file sizes and the sampled records' sizes
    bytes_total: int = 0
    bytes_per_record: Optional[int] = None
    batch_size: Optional[int] = None
    steps_per_epoch: Optional[int] = None
    corrupt_records: int = 0
    seconds: float = 0.0
    notes: list = field(default_factory=list)


class _Findings:
    """Collects record problems, one per (key, code), counting repeats instead of listing them."""

    def __init__(self, loaded: LoadedJob):
        self.loaded = loaded
        self.first: dict = {}
        self.counts: dict = {}

    def add(self, path: tuple, code: str, message: str, hint: Optional[str] = None, severity: str = "error",
            distinct: Optional[str] = None):
        """Record one finding; those with another `distinct` (e.g. another damaged file) are listed apart."""
        key = (path, code, distinct)
        self.counts[key] = self.counts.get(key, 0) + 1
        if key not in self.first:
            self.first[key] = (message, hint, severity)

    def problems(self) -> list:
        out = []
        for (path, code, distinct), (message, hint, severity) in self.first.items():
            more = self.counts[(path, code, distinct)] - 1
            if more:
                message += f" (and {more} more record{'s' if more > 1 else ''} like it)"
            out.append(self.loaded.problem(path, code, message, hint, severity=severity))
        return out


def dry_run(loaded: LoadedJob, *, records_per_file: int = 2, all_records: bool = False,
            splits: tuple = ("train", "eval")) -> tuple:
    """Check every data split of `splits` the job uses. Returns (problems, [DataReport])."""
    data = loaded.section("data")
    if data is None or data.input_fn:
        return [], []
    from tpulaunch.tf_env import import_tensorflow

    import_tensorflow()  # here, not at module level: the CLI's fast path never pays for it

    findings = _Findings(loaded)
    problems, reports = [], []
    for split in splits:
        patterns = getattr(data, split)
        if not patterns:
            continue
        report = DataReport(split)
        started = time.monotonic()
        files = _expand(loaded, split, patterns, problems)
        report.files = len(files)
        if files:
            _read_split(loaded, split, files, data, report, findings, records_per_file, all_records, started)
        report.seconds = round(time.monotonic() - started, 3)
        problems.extend(_count_problems(loaded, split, report))
        reports.append(report)
    return problems + findings.problems(), reports


def _expand(loaded: LoadedJob, split: str, patterns, problems: list) -> list:
    import tensorflow as tf

    files = []
    entries = as_list(patterns)
    for i, pattern in enumerate(entries):
        key = ("data", split, i) if isinstance(patterns, list) else ("data", split)
        try:
            if has_glob(pattern):
                matched = sorted(tf.io.gfile.glob(pattern))
            else:
                matched = [pattern] if tf.io.gfile.exists(pattern) else []
        except tf.errors.OpError as exc:
            problems.append(loaded.problem(key, "data-unreachable", f"cannot list '{pattern}': {first_line(exc)}",
                                           _access_hint(pattern)))
            continue
        # A local match that is not a regular file is refused here, at its own key, and never opened (a FIFO
        # would hold the dry run forever). Directories on gs:// are reported when sampled (stat): checking each
        # of 100k matches here would cost a request per file.
        if not matched:
            problems.append(loaded.problem(key, "no-files", f"no files match '{pattern}'", _no_match_hint(pattern)))
        for path in matched:
            found = not_a_file(path)
            if found is None:
                files.append(path)
                continue
            message, hint = not_a_file_text(path, found)
            code = "data-is-directory" if found[0] == "a directory" else "data-not-a-file"
            problems.append(loaded.problem(key, code, message, hint))
    return files


def _no_match_hint(pattern: str) -> str:
    if pattern.startswith("gs://"):
        return f"list what is there: gcloud storage ls {pattern.rsplit('/', 1)[0]}/"
    return "check the directory and the pattern; relative paths are relative to the job file"


def _access_hint(pattern: str) -> str:
    if pattern.startswith("gs://"):
        return ("check the bucket name and that your credentials (and the TPU's service account) can read it: "
                "gcloud storage ls " + pattern.split("/", 3)[0] + "//" + pattern.split("/")[2])
    return "check the path and its permissions"


def _spread(files: list, n: int) -> list:
    if len(files) <= n:
        return list(files)
    step = len(files) / n
    return [files[int(i * step)] for i in range(n)]


def _read_split(loaded, split, files, data, report, findings, records_per_file, all_records, started):
    import tensorflow as tf

    chosen = files if all_records else _spread(files, MAX_SAMPLED_FILES)
    if len(chosen) < len(files):
        report.notes.append(f"sampled {len(chosen)} of {len(files)} files")
    sizes = {}
    sampled_bytes = sampled_records = 0
    counted = 0
    options = tf.io.TFRecordOptions(compression_type=data.compression or "")
    for path in chosen:
        if not all_records and time.monotonic() - started > TIME_BUDGET_SECONDS:
            report.notes.append(f"stopped after {TIME_BUDGET_SECONDS:.0f} s; read {report.files_read} files")
            break
        try:
            stat = tf.io.gfile.stat(path)
        except tf.errors.OpError as exc:
            findings.add(("data", split), "data-unreadable", f"cannot read {path}: {first_line(exc)}", _access_hint(path),
                         distinct=path)
            continue
        if stat.is_directory:
            findings.add(("data", split), "data-is-directory", f"{path} is a directory, not a TFRecord file",
                          "match files only, e.g. DIR/*.tfrecord", distinct=path)
            continue
        sizes[path] = stat.length
        if sizes[path] == 0:
            findings.add(("data", split), "empty-file", f"{path} is empty (0 bytes)", "remove it or rewrite it",
                         severity="warning", distinct=path)
            continue
        report.files_read += 1
        limit = None if all_records else records_per_file
        index = -1
        iterator = tf.compat.v1.io.tf_record_iterator(path, options)
        consumed = 0  # bytes of complete records (16 bytes of framing each)
        while limit is None or index + 1 < limit:
            try:
                record = next(iterator)
            except StopIteration:
                if limit is None and not data.compression and consumed < sizes[path]:
                    # TensorFlow ends a file cut inside a record's 12-byte header as if it were complete.
                    _trailing_bytes(findings, split, path, index + 1, consumed, sizes[path], data.skip_corrupt)
                    report.corrupt_records += 1
                break
            except tf.errors.DataLossError as exc:
                _corrupt(findings, split, path, index + 1, exc, data.skip_corrupt, data.compression)
                report.corrupt_records += 1
                break
            except tf.errors.OpError as exc:
                findings.add(("data", split), "data-unreadable", f"cannot read {path}: {first_line(exc)}",
                             _access_hint(path), distinct=path)
                break
            index += 1
            consumed += len(record) + 16
            if index < records_per_file:  # contents are checked on a sample; --all-records counts the rest
                sampled_bytes += len(record)
                sampled_records += 1
                _check_record(findings, path, index, record, data)
        report.records_read += index + 1
        if all_records:
            counted += index + 1
    report.bytes_total = sum(sizes.values())
    if sampled_records:
        report.bytes_per_record = sampled_bytes // sampled_records
    if all_records:
        report.records_counted = counted
    elif sampled_records and not data.compression:
        # Each record is framed with 16 bytes (length, two CRCs); file sizes then give the count.
        per_record = sampled_bytes / sampled_records + 16
        total_bytes = report.bytes_total * (len(files) / max(1, len(sizes)))
        report.records_estimated = int(round(total_bytes / per_record))


def _corrupt(findings: _Findings, split: str, path: str, index: int, exc, skip: bool, compression) -> None:
    message = first_line(exc)
    match = CORRUPT_RECORD_AT.search(message)
    where = f"at byte {match.group(2)}" if match else ""
    what = "truncated" if match and match.group(1) == "truncated" else "corrupt"
    if compression is None and _looks_gzipped(path):
        hint = "the file is GZIP-compressed: set data.compression: GZIP"
    else:
        hint = "rewrite the file; or set data.skip_corrupt: true to skip bad records while training"
    severity = "warning" if skip else "error"
    if skip:
        hint = "data.skip_corrupt is on: training skips the rest of this file"
    # One problem per damaged file: each must be rewritten (or is skipped from this record on).
    findings.add(("data", split), f"record-{what}", f"{path}: record {index} is {what} {where}".rstrip(), hint,
                 severity=severity, distinct=path)


def _trailing_bytes(findings: _Findings, split: str, path: str, index: int, consumed: int, size: int,
                    skip: bool) -> None:
    message = (f"{path}: record {index} is truncated at byte {consumed} "
               f"({size - consumed} bytes after the last complete record)")
    hint = ("TensorFlow reads this file as if it ended after the last complete record, silently: "
            "rewrite the file")
    findings.add(("data", split), "record-truncated", message, hint, severity="warning" if skip else "error",
                 distinct=path)


def _looks_gzipped(path: str) -> bool:
    import tensorflow as tf

    try:
        with tf.io.gfile.GFile(path, "rb") as handle:
            return handle.read(2) == b"\x1f\x8b"
    except tf.errors.OpError:
        return False


def _check_record(findings: _Findings, path: str, index: int, record: bytes, data) -> None:
    from tensorflow.core.example import example_pb2
    from google.protobuf.message import DecodeError

    example = example_pb2.Example()
    try:
        example.ParseFromString(record)
    except DecodeError:
        findings.add(("data", "features"), "record-not-example",
                     f"{path}: record {index} is not a tf.train.Example",
                     "tpulaunch reads tf.train.Example records; use data.input_fn for other formats")
        return
    stored = example.features.feature
    for group in ("features", "labels"):
        for name, spec in getattr(data, group).items():
            problem = _check_value(spec, name, stored)
            if problem:
                code, message, hint = problem
                findings.add(("data", group, name), code, f"{path}: record {index}: {message}", hint)


def _check_value(spec: TensorSpec, name: str, stored) -> Optional[tuple]:
    key = spec.key or name
    if key not in stored:
        keys = ", ".join(sorted(stored)) or "none"
        return ("record-missing-key", f"no feature '{key}' (the record has: {keys})",
                "set key: to the record's name for it, or rename the tensor")
    feature = stored[key]
    kind = feature.WhichOneof("kind")
    want = _KIND_OF_ENCODING[spec.stored_as]
    if kind != want:
        return ("record-wrong-kind", f"'{key}' is stored as {kind}, but encoding {spec.stored_as} reads {want}",
                _encoding_hint(kind, spec))
    values = getattr(feature, kind).value
    if spec.stored_as in ("float_list", "int64_list"):
        expected = spec.num_elements
        if expected is not None and len(values) != expected:
            return ("record-wrong-length", f"'{key}' has {len(values)} values, but shape {list(spec.shape)} needs {expected}",
                    "fix the declared shape (tpulaunch data inspect shows what the records hold)")
        return None
    if len(values) != 1:
        return ("record-wrong-length", f"'{key}' holds {len(values)} byte strings, expected 1", None)
    blob = values[0]
    if spec.stored_as == "raw":
        expected = spec.num_elements
        if expected is not None and len(blob) != expected * DTYPE_BYTES[spec.dtype]:
            return ("record-wrong-length",
                    f"'{key}' has {len(blob)} bytes, but {list(spec.shape)} x {spec.dtype} is {expected * DTYPE_BYTES[spec.dtype]}",
                    _raw_hint(len(blob), spec))
        return None
    return _check_image(spec, key, blob)


def _encoding_hint(kind: str, spec: TensorSpec) -> str:
    if kind == "bytes_list":
        return "bytes: set encoding: raw (with the dtype they were written in), png or jpeg"
    if kind == "float_list":
        return "set encoding: float_list and a float dtype"
    if kind == "int64_list":
        return "set encoding: int64_list and an integer dtype"
    return "the feature is empty in this record"


def _raw_hint(nbytes: int, spec: TensorSpec) -> str:
    elements = spec.num_elements or 1
    for dtype, size in sorted(DTYPE_BYTES.items(), key=lambda kv: kv[1]):
        if nbytes == elements * size and dtype != spec.dtype:
            return f"the size fits dtype: {dtype}"
    return "check the shape and dtype the files were written with"


def _check_image(spec: TensorSpec, key: str, blob: bytes) -> Optional[tuple]:
    size = _image_size(blob)
    fmt = spec.stored_as
    if size is None or size[0] != fmt:
        found = size[0] if size else "neither PNG nor JPEG"
        return ("record-wrong-kind", f"'{key}' is declared {fmt} but the bytes are {found}",
                f"set encoding: {size[0]}" if size else "set encoding: raw for raw arrays")
    _, height, width = size
    declared_h, declared_w = spec.shape[0], spec.shape[1]
    if (declared_h is not None and declared_h != height) or (declared_w is not None and declared_w != width):
        return ("record-wrong-shape", f"'{key}' is a {height}x{width} image but the declared shape is {list(spec.shape)}",
                "resize the images when writing them, or declare null for sizes that vary (not on a TPU)")
    return None


def _image_size(blob: bytes) -> Optional[tuple]:
    """(format, height, width) from the PNG or JPEG header, without decoding pixels."""
    if blob[:8] == b"\x89PNG\r\n\x1a\n" and len(blob) >= 24:
        width = int.from_bytes(blob[16:20], "big")
        height = int.from_bytes(blob[20:24], "big")
        return "png", height, width
    if blob[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(blob):
            if blob[i] != 0xFF:
                i += 1
                continue
            marker = blob[i + 1]
            if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
                height = int.from_bytes(blob[i + 5:i + 7], "big")
                width = int.from_bytes(blob[i + 7:i + 9], "big")
                return "jpeg", height, width
            length = int.from_bytes(blob[i + 2:i + 4], "big")
            i += 2 + length
        return "jpeg", None, None
    return None


def _count_problems(loaded: LoadedJob, split: str, report: DataReport) -> list:
    section = loaded.section(split)
    records = report.records_counted if report.records_counted is not None else report.records_estimated
    if section is None or not records:
        return []
    report.batch_size = section.batch_size
    report.steps_per_epoch = records // section.batch_size
    approx = "" if report.records_counted is not None else "about "
    key = (split, "batch_size")
    if records < section.batch_size and split == "train":  # training repeats its records before batching them
        return [loaded.problem(key, "split-smaller-than-batch",
                               f"data.train has {approx}{records} records, fewer than one batch of {section.batch_size}: "
                               "every batch holds some records more than once",
                               f"use batch_size <= {records}, or add data", severity="warning")]
    if records < section.batch_size:
        return [loaded.problem(key, "split-smaller-than-batch",
                               f"data.{split} has {approx}{records} records, fewer than one batch of {section.batch_size}: "
                               f"with drop_remainder (static shapes on a TPU) not a single batch is formed",
                               f"use batch_size <= {records}, or add data")]
    if split == "eval":
        wanted = section.steps * section.batch_size
        if wanted > records:
            return [loaded.problem(("eval", "steps"), "eval-steps-exceed-data",
                                   f"eval.steps {section.steps} x batch_size {section.batch_size} = {wanted} examples, "
                                   f"but data.eval has {approx}{records}: evaluation stops after {records // section.batch_size} batches",
                                   f"set eval.steps to {records // section.batch_size}", severity="warning")]
    return []
