"""TFRecord input pipelines built from the job's `data` section.

One record is a `tf.train.Example`; each declared tensor is read from the key `spec.key` (default: the
tensor's name) according to `spec.stored_as`:

- ``float_list`` / ``int64_list``: a fixed-length list, reshaped to `spec.shape`.
- ``raw``: one bytes value holding the tensor's little-endian bytes in its own dtype (bfloat16 as
  2-byte bfloat16, float16 as 2-byte half, bool and uint8 as one byte each).
- ``png`` / ``jpeg``: one encoded image, decoded to uint8 [height, width, channels].

Every tensor comes out shaped `spec.shape` with dtype `spec.dtype`, so batches have static shapes, as XLA
on a TPU needs. TensorFlow is imported inside the functions: the CLI's fast path never loads it.
"""

from __future__ import annotations

import contextlib
import re
import time
from typing import Callable, Dict, List, Optional, Tuple

from tpulaunch.checks.paths import as_list
from tpulaunch.errors import TpuLaunchError, first_line
from tpulaunch.job.schema import DTYPE_BYTES, Job, TensorSpec

MODES = ("train", "eval")

# How many bytes TFRecordDataset reads ahead per file. With one reader per core interleaved, 8 MiB
# buffers cost ~20 % throughput locally (benchmarks/data_pipeline.py); gs:// reads have their own
# read-ahead in TensorFlow's GCS filesystem.
READ_BUFFER_BYTES = 256 * 1024


def expand_files(files, *, what: str = "data") -> List[str]:
    """Every file matched by a path, glob or list of them (local or gs://), sorted, without repeats.

    Raises:
        TpuLaunchError: a pattern that matches nothing (named in the message).
    """
    import tensorflow as tf

    found: List[str] = []
    for pattern in as_list(files):
        try:
            matches = tf.io.gfile.glob(pattern)
        except tf.errors.OpError as exc:
            raise TpuLaunchError(f"{what}: cannot list {pattern!r}: {exc.message}",
                                 hint="check the path and that this machine may read it") from None
        if not matches:
            raise TpuLaunchError(f"{what}: no files match {pattern!r}",
                                 hint="check the spelling; `tpulaunch data synth` writes example TFRecords")
        found.extend(m for m in sorted(matches) if m not in found)
    return found


def _tf_dtype(name: str):
    import tensorflow as tf

    return tf.as_dtype(name)


def _unknown_dims_error(name: str, spec: TensorSpec) -> TpuLaunchError:
    return TpuLaunchError(f"data: {name} has shape {spec.shape} with more than one unknown dim; "
                          f"its stored form {spec.stored_as} cannot be reshaped",
                          hint="declare the full shape (a TPU needs static shapes anyway)")


def _reshape_shape(name: str, spec: TensorSpec) -> List[int]:
    """The shape for tf.reshape: one unknown dim becomes -1."""
    unknown = [d for d in spec.shape if d is None]
    if len(unknown) > 1:
        raise _unknown_dims_error(name, spec)
    return [-1 if d is None else d for d in spec.shape]


def _feature_config(name: str, spec: TensorSpec):
    """The tf.io feature parsing one tensor's stored value."""
    import tensorflow as tf

    stored = spec.stored_as
    if stored in ("float_list", "int64_list"):
        kind = tf.float32 if stored == "float_list" else tf.int64
        if spec.is_static:
            return tf.io.FixedLenFeature(spec.shape, kind)
        _reshape_shape(name, spec)  # raises for several unknown dims
        return tf.io.VarLenFeature(kind)
    return tf.io.FixedLenFeature([], tf.string)


def _decode(name: str, spec: TensorSpec, value):
    """The parsed value of one tensor -> a tensor of spec.shape and spec.dtype."""
    import tensorflow as tf

    stored = spec.stored_as
    dtype = _tf_dtype(spec.dtype)
    if stored in ("float_list", "int64_list"):
        if isinstance(value, tf.SparseTensor):
            value = tf.reshape(tf.sparse.to_dense(value), _reshape_shape(name, spec))
        # float_list holds float32: bfloat16/float16 specs are read as float32 and cast; likewise int64.
        return tf.cast(value, dtype) if value.dtype != dtype else value
    if stored == "raw":
        return tf.reshape(tf.io.decode_raw(value, dtype), _reshape_shape(name, spec))
    channels = spec.shape[-1] or 0  # 0: as stored
    image = tf.io.decode_image(value, channels=channels, dtype=tf.uint8, expand_animations=False)
    return tf.ensure_shape(image, spec.shape)


def _structure(tensors: Dict[str, object]):
    """The structure rule: one entry -> that tensor; several -> dict; none -> None."""
    if not tensors:
        return None
    if len(tensors) == 1:
        return next(iter(tensors.values()))
    return dict(tensors)


def parse_example_fn(job: Job) -> Callable:
    """A function parsing one serialized tf.train.Example into (features, labels).

    Features are the single tensor when `data.features` has one entry, else a dict; labels likewise, or
    None when `data.labels` is empty. Each tensor has shape `spec.shape` and dtype `spec.dtype`.

    Raises:
        TpuLaunchError: a list-stored tensor with more than one unknown dim.
    """
    specs = {**job.data.features, **job.data.labels}
    keys = {name: spec.key or name for name, spec in specs.items()}
    config = {}
    for name, spec in specs.items():
        config[keys[name]] = _feature_config(name, spec)  # one record key may feed two tensors

    def parse(serialized):
        import tensorflow as tf

        parsed = tf.io.parse_single_example(serialized, config)
        tensors = {name: _decode(name, spec, parsed[keys[name]]) for name, spec in specs.items()}
        features = _structure({n: tensors[n] for n in job.data.features})
        labels = _structure({n: tensors[n] for n in job.data.labels})
        return features, labels

    return parse


def _batch_parse_possible(job: Job) -> bool:
    """Whole batches can be parsed at once when every tensor is static and none is an image.

    One vectorised tf.io.parse_example per batch is about twice as fast as a parse per record; images
    still decode one by one, and skip_corrupt needs records that fail alone.
    """
    specs = {**job.data.features, **job.data.labels}
    return (not job.data.skip_corrupt and not job.data.cache
            and all(s.is_static and s.stored_as not in ("png", "jpeg") for s in specs.values()))


def parse_batch_fn(job: Job) -> Callable:
    """Like `parse_example_fn`, for a vector of serialized records: every tensor gets a leading batch dim."""
    specs = {**job.data.features, **job.data.labels}
    keys = {name: spec.key or name for name, spec in specs.items()}
    config = {keys[name]: _feature_config(name, spec) for name, spec in specs.items()}

    def decode(spec: TensorSpec, value, batch: int):
        import tensorflow as tf

        dtype = _tf_dtype(spec.dtype)
        if spec.stored_as == "raw":  # the static batch keeps shapes fully defined for XLA
            return tf.reshape(tf.io.decode_raw(value, dtype), [batch, *spec.shape])
        return tf.cast(value, dtype) if value.dtype != dtype else value

    def parse(serialized):
        import tensorflow as tf

        parsed = tf.io.parse_example(serialized, config)
        batch = serialized.shape[0] if serialized.shape[0] is not None else -1
        tensors = {name: decode(spec, parsed[keys[name]], batch) for name, spec in specs.items()}
        features = _structure({n: tensors[n] for n in job.data.features})
        labels = _structure({n: tensors[n] for n in job.data.labels})
        return features, labels

    return parse


def host_shard(context) -> Tuple[int, int]:
    """(this input pipeline's index, number of input pipelines) from what params["context"] holds.

    TPUEstimator passes a TPUContext whose `current_input_fn_deployment()` is (host device, invocation
    index, invocation count, replicas fed); under PER_HOST_V2 that is one invocation per host.
    tf.distribute passes an InputContext (input_pipeline_id, num_input_pipelines). Anything else, or
    None, means a single pipeline.
    """
    if context is None:
        return 0, 1
    if hasattr(context, "current_input_fn_deployment"):
        _, index, count, _ = context.current_input_fn_deployment()
        return int(index), int(count)
    if hasattr(context, "input_pipeline_id") and hasattr(context, "num_input_pipelines"):
        return int(context.input_pipeline_id), int(context.num_input_pipelines)
    return 0, 1


def _files_for(job: Job, mode: str):
    files = job.data.train if mode == "train" else job.data.eval
    if files is None:
        raise TpuLaunchError(f"data.{mode}: no {mode} files in the job",
                             hint=f"set data.{mode} to a TFRecord file or glob")
    return expand_files(files, what=f"data.{mode}")


def _check_static(job: Job) -> None:
    for section in ("features", "labels"):
        for name, spec in getattr(job.data, section).items():
            if not spec.is_static:
                raise TpuLaunchError(f"data.{section}.{name}: shape {spec.shape} has unknown dims; a TPU needs static shapes",
                                     hint="declare every dim")


def make_input_fn(job: Job, mode: str, *, use_tpu: bool) -> Callable:
    """An `input_fn(params)` for TPUEstimator (or Estimator) reading the job's TFRecords.

    `params["batch_size"]` is the batch this pipeline produces: per host under TPUEstimator
    PER_HOST_V2, global on CPU. With `params["context"]` (a TPUContext or tf.distribute.InputContext)
    each host reads its own share: whole files when there are at least as many files as hosts, else
    every n-th record. Training shuffles files and records and repeats forever; evaluation reads in a
    fixed order, and repeats only on a TPU, where running out of data mid-loop is an error rather than
    the end of evaluation. `data.skip_corrupt` drops records that fail to read or parse: a record
    that fails its CRC or is cut short ends the read of its file (TFRecord framing cannot be trusted
    past it); records that fail to parse are counted (`SKIPPED_RECORDS`, shown by `tpulaunch train`),
    and each skip is logged as a TensorFlow warning "Ignoring error: ..." (shown with -vv). Without
    it the first bad record stops the run: wrap the training call in `naming_read_errors` so the
    message names the file. Batches always drop the remainder, so shapes are static.

    With `data.input_fn` set, the mode's function is imported and returned unchanged.

    Raises:
        TpuLaunchError: unknown mode, no files for the mode, a glob that matches nothing, unknown dims
            on a TPU, or an input_fn that cannot be imported.
    """
    if mode not in MODES:
        raise TpuLaunchError(f"unknown input mode {mode!r}; use one of {', '.join(MODES)}")
    if job.data.input_fn:
        from tpulaunch.job.imports import resolve

        path = job.data.input_fn_for(mode)
        if path is None:
            raise TpuLaunchError(f"data.input_fn names no {mode} function", hint=f"add data.input_fn.{mode}")
        return resolve(path, what=f"{mode} input_fn")
    if use_tpu:
        _check_static(job)
    files = _files_for(job, mode)
    parse = parse_example_fn(job)
    batch_parse = _batch_parse_possible(job)
    parse_batch = parse_batch_fn(job) if batch_parse else None
    count_block = _count_block(job)
    training = mode == "train"
    data = job.data

    def input_fn(params):
        import tensorflow as tf

        autotune = tf.data.AUTOTUNE
        index, count = host_shard(params.get("context"))
        dataset = tf.data.Dataset.from_tensor_slices(files)
        shard_files = count > 1 and len(files) >= count
        if shard_files:
            dataset = dataset.shard(count, index)
        if training:
            dataset = dataset.shuffle(len(files), reshuffle_each_iteration=True)
            if not data.cache:
                dataset = dataset.repeat()
        dataset = dataset.interleave(
            lambda f: tf.data.TFRecordDataset(f, compression_type=data.compression or "",
                                              buffer_size=READ_BUFFER_BYTES),
            cycle_length=autotune, num_parallel_calls=autotune, deterministic=not training)
        if count > 1 and not shard_files:
            dataset = dataset.shard(count, index)
        if not batch_parse:  # records parsed one by one: images, skip_corrupt, cache
            if data.skip_corrupt:
                dataset = _parse_skipping_bad_records(dataset, parse, count_block, tf)
            else:
                dataset = dataset.map(parse, num_parallel_calls=autotune, deterministic=not training)
            if data.cache:
                dataset = dataset.cache()
                if training:
                    dataset = dataset.repeat()
        if training and data.shuffle_buffer > 0:
            dataset = dataset.shuffle(data.shuffle_buffer)
        if not training and use_tpu:
            dataset = dataset.repeat()
        dataset = dataset.batch(params["batch_size"], drop_remainder=True)
        if batch_parse:  # serialized records were shuffled and batched: one vectorised parse per batch
            dataset = dataset.map(parse_batch, num_parallel_calls=autotune, deterministic=not training)
        return dataset.prefetch(autotune)

    return input_fn


# --------------------------------------------------------------------------------- skip_corrupt

# The graph collection holding each input pipeline's count of records skipped under data.skip_corrupt
# (one variable per input_fn call: one per host on a TPU slice). `SkippedRecordsHook` sums them.
SKIPPED_RECORDS = "tpulaunch_skipped_records"


# Records per counting step under skip_corrupt: blocks of about this many bytes (at most 64 records,
# at least one, so a block of CT volumes stays one volume). Counting record by record cost a third
# of the examples/s on 48 KiB records; by blocks, with the in-order parse it needs, about a fifth
# there and nothing on 40-byte records (benchmarks/data_pipeline.py).
SKIP_COUNT_BLOCK_BYTES = 256 * 1024


def _count_block(job: Job) -> int:
    specs = {**job.data.features, **job.data.labels}
    example_bytes = sum((spec.num_elements or 1) * DTYPE_BYTES[spec.dtype] for spec in specs.values())
    return max(1, min(64, SKIP_COUNT_BLOCK_BYTES // max(1, example_bytes)))


def _parse_skipping_bad_records(dataset, parse: Callable, block: int, tf):
    """Parse records one by one, dropping those that fail, and count what was dropped.

    Records are numbered before parsing and kept in order through the (parallel) parse, so after the
    failures are dropped, the last record number of each block of `block` kept records minus the
    records kept so far is how many were skipped so far in this pass. The increase is added to a
    local variable in `SKIPPED_RECORDS`, which so keeps counting when the dataset is repeated after
    this point (evaluation on a TPU). The count is of what the pipeline has read, read-ahead into
    shuffle and prefetch buffers included. A record that fails its CRC or is cut short counts as one
    and ends the read of its file (TFRecord framing cannot be trusted past it): the records after it
    are never read, so they are not counted.
    """
    skipped = tf.compat.v1.Variable(
        0, dtype=tf.int64, trainable=False, use_resource=True, name="records_skipped",
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES, SKIPPED_RECORDS])
    dataset = dataset.enumerate().map(lambda number, record: (number, parse(record)),
                                      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    dataset = dataset.ignore_errors(log_warning=True).batch(block)

    def count_gaps(state, numbered):
        kept, counted = state  # records kept and skips already counted, in this pass
        numbers, examples = numbered
        kept += tf.cast(tf.shape(numbers)[0], tf.int64)
        gaps = numbers[-1] + 1 - kept
        with tf.control_dependencies([skipped.assign_add(gaps - counted, read_value=False)]):
            examples = tf.nest.map_structure(lambda t: t if t is None else tf.identity(t), examples)
        return (kept, gaps), examples

    zero = tf.constant(0, tf.int64)
    return dataset.scan((zero, zero), count_gaps).unbatch()


# ------------------------------------------------------------------------------------ read errors

# How long `read_error` may spend looking for the bad file before saying it could not tell which.
FIND_BAD_FILE_SECONDS = 120.0

# TensorFlow's DataLossError text for a bad record: what went wrong and the byte offset.
CORRUPT_RECORD_AT = re.compile(r"(corrupted|truncated) record at (\d+)")


def find_bad_record(job: Job, mode: str, *, offset: Optional[int] = None,
                    budget_s: float = FIND_BAD_FILE_SECONDS) -> Optional[Tuple[str, int, str]]:
    """(file, record index, what is wrong) for the first record of the split that cannot be read or parsed.

    `offset` (from TensorFlow's "corrupted record at N") narrows the search to files longer than N.
    None when no bad record is found within `budget_s` seconds.
    """
    import tensorflow as tf

    parse = parse_example_fn(job)
    options = tf.io.TFRecordOptions(compression_type=job.data.compression or "")
    started = time.monotonic()
    for path in expand_files(job.data.train if mode == "train" else job.data.eval, what=f"data.{mode}"):
        if time.monotonic() - started > budget_s:
            return None
        try:
            if offset is not None and not job.data.compression and tf.io.gfile.stat(path).length <= offset:
                continue
            index = -1
            for index, record in enumerate(tf.compat.v1.io.tf_record_iterator(path, options)):
                if not _is_example(record):
                    return path, index, "not a tf.train.Example"
                try:
                    parse(tf.constant(record))
                except (tf.errors.InvalidArgumentError, ValueError) as exc:
                    return path, index, _first_line(exc)
        except tf.errors.OpError as exc:
            return path, index + 1, _first_line(exc)
    return None


def _is_example(record: bytes) -> bool:
    from google.protobuf.message import DecodeError
    from tensorflow.core.example import example_pb2

    try:
        example_pb2.Example().ParseFromString(record)
    except DecodeError:
        return False
    return True


def _first_line(exc) -> str:
    """first_line without TensorFlow's trailing op names ([[node ...]], [Op:...])."""
    return re.sub(r"\s*\[\[.*|\s*\[Op:.*", "", first_line(exc))


def read_error(job: Job, mode: str, exc) -> Optional[TpuLaunchError]:
    """A TpuLaunchError naming the file and record behind an input pipeline error, or None when no data file is at fault."""
    message = getattr(exc, "message", None) or str(exc)
    match = CORRUPT_RECORD_AT.search(message)
    found = find_bad_record(job, mode, offset=int(match.group(2)) if match else None)
    if found is None:
        return None
    path, index, what = found
    return TpuLaunchError(
        f"data.{mode}: {path}: record {index} cannot be read: {what}",
        hint="tpulaunch validate --all-records lists every bad record; set data.skip_corrupt: true to skip them")


@contextlib.contextmanager
def naming_read_errors(job: Job, mode: str):
    """Turn an input pipeline's DataLossError (or a record that does not parse) into a TpuLaunchError naming the file.

    Errors that no data file explains (a model bug, say) pass through unchanged. A record that is not
    an Example at all surfaces from TensorFlow as a UnicodeDecodeError (its error message quotes the
    record's bytes, which Python cannot decode), so that is caught too.
    """
    import tensorflow as tf

    try:
        yield
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError, UnicodeDecodeError) as exc:
        if job.data.input_fn:
            raise
        error = read_error(job, mode, exc)
        if error is None:
            raise
        raise error from exc
