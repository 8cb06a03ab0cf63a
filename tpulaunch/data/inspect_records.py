"""Look inside TFRecord files of tf.train.Example and propose the job's `data` tensor specs.

Reads only the first few records (through TensorFlow's filesystem, so gs:// works as well as local
paths): enough to see each key's kind, how many values it holds, and whether bytes are PNG or JPEG.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

from tpulaunch.errors import TpuLaunchError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8\xff"
GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class KeyInfo:
    """What the records read hold under one feature key.

    `min_length`/`max_length` count values per record (floats, ints, or bytes strings); for bytes,
    `min_bytes`/`max_bytes` are the sizes of the first value. `image_shape` is the decoded [H, W, C] of
    the first PNG/JPEG seen.
    """

    key: str
    kind: str  # float_list | int64_list | bytes_list
    min_length: int
    max_length: int
    records: int = 0  # records that have this key
    min_bytes: Optional[int] = None
    max_bytes: Optional[int] = None
    image_format: Optional[str] = None  # png | jpeg
    image_shape: Optional[List[int]] = None

    @property
    def fixed_length(self) -> bool:
        return self.min_length == self.max_length

    def see_length(self, length: int) -> None:
        self.min_length, self.max_length = min(self.min_length, length), max(self.max_length, length)
        self.records += 1


@dataclass
class Inspection:
    """The result of `inspect`: files matched, records read and what each key holds."""

    pattern: str
    files: List[str]
    records_read: int
    keys: Dict[str, KeyInfo] = field(default_factory=dict)
    compression: Optional[str] = None

    def to_dict(self) -> dict:
        return {"pattern": self.pattern, "files": self.files, "records_read": self.records_read,
                "compression": self.compression, "keys": {k: asdict(v) for k, v in self.keys.items()},
                "features_yaml": self.features_yaml()}

    def features_yaml(self) -> str:
        """A `features:` block (indented for `data:`) declaring every key, ready to paste into a job.

        Move the targets into a `labels:` block. List lengths become flat shapes ([N] or [] for one
        value) to reshape by hand; raw bytes become uint8 [bytes] with a comment saying what to set.
        """
        lines = ["  features:"]
        for key in sorted(self.keys):
            lines.append("    " + _spec_line(self.keys[key]))
        return "\n".join(lines) + "\n"


def _tensor_name(key: str) -> str:
    name = re.sub(r"\W", "_", key).strip("_") or "feature"
    return name if not name[0].isdigit() else f"f_{name}"


def _flow(mapping: dict) -> str:
    return "{" + ", ".join(f"{k}: {_yaml_value(v)}" for k, v in mapping.items()) + "}"


def _yaml_value(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return value if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value) else json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    return str(value)


def _spec_line(info: KeyInfo) -> str:
    name = _tensor_name(info.key)
    spec: dict = {}
    comment = ""
    length = info.max_length if info.fixed_length else None
    if info.kind in ("float_list", "int64_list"):
        spec["shape"] = [] if length == 1 else [length]
        spec["dtype"] = "float32" if info.kind == "float_list" else "int64"
        if length is None:
            comment = f"  # {info.min_length}..{info.max_length} values per record: a TPU needs a fixed length"
        elif length > 1:
            comment = f"  # {length} values: reshape, e.g. [H, W, C]"
    elif info.max_length > 1:
        return (f"# {name}: {_flow({'shape': [info.max_length], 'dtype': 'uint8', 'encoding': 'raw'})}"
                f"  # {info.max_length} byte strings per record: not a tensor; leave out or use data.input_fn")
    elif info.image_format:
        spec["shape"] = info.image_shape
        spec["dtype"] = "uint8"
        spec["encoding"] = info.image_format
        if info.min_bytes is not None and info.records > 1:
            comment = "  # shape of the first image; all must match"
    else:
        fixed = info.min_bytes == info.max_bytes
        spec["shape"] = [info.max_bytes if fixed else None]
        spec["dtype"] = "uint8"
        spec["encoding"] = "raw"
        comment = (f"  # set shape and dtype: {info.max_bytes} bytes" if fixed else
                   f"  # set shape and dtype: {info.min_bytes}..{info.max_bytes} bytes (varies)")
    if name != info.key:
        spec["key"] = info.key
    return f"{name}: {_flow(spec)}{comment}"


def _image_info(data: bytes):
    if data.startswith(PNG_MAGIC):
        return "png"
    if data.startswith(JPEG_MAGIC):
        return "jpeg"
    return None


def _image_shape(data: bytes) -> List[int]:
    import tensorflow as tf

    return [int(d) for d in tf.io.decode_image(data, expand_animations=False).shape]


def _looks_gzipped(path: str) -> bool:
    import tensorflow as tf

    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            return f.read(2) == GZIP_MAGIC
    except tf.errors.OpError:
        return False


def _add_record(keys: Dict[str, KeyInfo], example) -> None:
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind") or "bytes_list"
        values = getattr(feature, kind).value
        info = keys.get(key)
        if info is None:
            info = keys[key] = KeyInfo(key, kind, len(values), len(values))
        elif info.kind != kind:
            raise TpuLaunchError(f"key {key!r} is a {info.kind} in one record and a {kind} in another",
                                 hint="the records do not share one layout; check how they were written")
        info.see_length(len(values))
        if kind == "bytes_list" and values:
            size = len(values[0])
            info.min_bytes = size if info.min_bytes is None else min(info.min_bytes, size)
            info.max_bytes = size if info.max_bytes is None else max(info.max_bytes, size)
            fmt = _image_info(values[0])
            if fmt and info.image_format is None and info.records == 1:
                info.image_format = fmt
                info.image_shape = _image_shape(values[0])
            elif info.image_format and fmt != info.image_format:
                info.image_format, info.image_shape = None, None  # mixed content: treat as raw bytes


def inspect(pattern, *, records: int = 5, compression: Optional[str] = None) -> Inspection:
    """Read up to `records` tf.train.Examples from the files `pattern` matches (a path, glob or list).

    Raises:
        TpuLaunchError: no file matches, a file cannot be read (named, with a hint when it looks
            gzip-compressed), or a record is not a tf.train.Example.
    """
    import tensorflow as tf
    from google.protobuf.message import DecodeError

    from tpulaunch.engine.pipeline import expand_files

    if records < 1:
        raise TpuLaunchError(f"records must be at least 1, got {records}")
    files = expand_files(pattern, what="inspect")
    keys: Dict[str, KeyInfo] = {}
    read = 0
    for path in files:
        if read >= records:
            break
        try:
            for serialized in tf.data.TFRecordDataset(path, compression_type=compression or "").take(records - read):
                try:
                    example = tf.train.Example.FromString(serialized.numpy())
                except DecodeError:
                    raise TpuLaunchError(f"{path}: record {read + 1} is not a tf.train.Example",
                                         hint="this reads TFRecords of tf.train.Example only") from None
                _add_record(keys, example)
                read += 1
        except tf.errors.OpError as exc:
            hint = ("the file starts like gzip: pass compression GZIP" if not compression and _looks_gzipped(path)
                    else "check that it is a TFRecord file (and its compression) and that this machine may read it")
            raise TpuLaunchError(f"cannot read {path}: {exc.message}", hint=hint) from None
    shown = pattern if isinstance(pattern, str) else ", ".join(pattern)
    return Inspection(shown, files, read, keys, compression)
