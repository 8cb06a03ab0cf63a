"""TFRecord input pipelines built from the job's `data` section.

The pipeline itself (parse, decode, batch, shard per host, skip_corrupt) is
`tpulaunch.engine.portable.make_dataset_fn`, which `tpulaunch explain` prints verbatim; this
module hands it the job's values and files, turns its errors into messages that name the job key,
and finds the record behind a read error. TensorFlow is imported inside the functions: the CLI's
fast path never loads it.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from typing import Callable, List, Optional, Tuple

from tpulaunch.checks.data import CORRUPT_RECORD_AT
from tpulaunch.checks.paths import as_list, not_a_file, not_a_file_text
from tpulaunch.engine.plain import features_as_dict, input_settings, spec_errors, tensor_specs
from tpulaunch.errors import TpuLaunchError, first_line
from tpulaunch.job.schema import Job
from tpulaunch.run.events import LeftOut

MODES = ("train", "eval")


def __getattr__(name: str):
    # The graph collection counting records skipped under data.skip_corrupt lives beside the pipeline
    # that fills it, in standalone.py (which imports TensorFlow): loaded on first use.
    if name == "SKIPPED_RECORDS":
        from tpulaunch.engine.portable import SKIPPED_RECORDS

        return SKIPPED_RECORDS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def expand_files(files, *, what: str = "data") -> List[str]:
    """Every file matched by a path, glob or list of them (local or gs://), sorted, without repeats.

    Raises:
        TpuLaunchError: a pattern that matches nothing or cannot be listed (named in the message).
    """
    from tpulaunch.engine.portable import FilesError, expand_files as expand

    try:
        return expand(as_list(files))
    except FilesError as exc:
        hint = ("check the path and that this machine may read it" if exc.reason else
                "check the spelling; `tpulaunch data synth` writes example TFRecords")
        raise TpuLaunchError(f"{what}: {exc}", hint=hint) from None


def parse_example_fn(job: Job) -> Callable:
    """A function parsing one serialized tf.train.Example into (features, labels), as the job declares them.

    Raises:
        TpuLaunchError: a list- or raw-stored tensor with more than one unknown dim.
    """
    from tpulaunch.engine import portable

    with spec_errors():
        return portable.parse_example_fn(tensor_specs(job.data.features), tensor_specs(job.data.labels),
                                         features_as_dict(job))


def scores_class_ids(job: Job, model=None) -> bool:
    """Whether a label of the job is scored by a sparse categorical crossentropy (its values class ids), by the
    loss that trains it (`trained_loss`)."""
    loss = trained_loss(job, model)
    return "sparse_categorical_crossentropy" in (loss.values() if isinstance(loss, dict) else as_list(loss))


def trained_loss(job: Job, model=None):
    """The loss the model trains with, by name: the job's `model.loss` where it sets one (or for a model never
    compiled, its default), else a compiled model's own, which it keeps (`portable.compile_with_job`): a name, or
    a list or dict of names as its compile() was given them ("" for a loss that is no Keras loss by name)."""
    if model is None or "loss" in job.model.set_in_job():
        return job.model.loss
    from tpulaunch.engine.portable import compiled_with

    own = compiled_with(model)
    if own is None or own.get("loss") is None:
        return job.model.loss
    return _loss_names(own["loss"])


def _loss_names(loss):
    """A compile()'s loss by name: 'mse' as given, SparseCategoricalCrossentropy() or the function
    sparse_categorical_crossentropy as "sparse_categorical_crossentropy"."""
    if isinstance(loss, dict):
        return {key: _loss_names(value) for key, value in loss.items()}
    if isinstance(loss, (list, tuple)):
        return [_loss_names(value) for value in loss]
    if isinstance(loss, str):
        return loss
    name = getattr(loss, "__name__", None) or type(loss).__name__
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower() if name[:1].isupper() else name


def label_classes(job: Job, outputs, output_names=(), model=None) -> dict:
    """label -> number of classes, for each label the sparse categorical crossentropy that trains it scores
    (`trained_loss`: the job's, or `model`'s own compile's): the last axis of the model's output paired with it
    (`outputs`: the model's, symbolic or abstract; none gives {}). The engine hands it to `make_dataset_fn`, whose
    pipeline then checks each batch's class ids."""
    from tpulaunch.engine.portable import SpecError, _losses_by_label, outputs_by_label, sparse_label_classes

    names = list(job.data.labels)
    if not outputs or not names or not scores_class_ids(job, model):
        return {}
    loss = trained_loss(job, model)
    try:
        losses = (outputs_by_label(loss, names, output_names or ()) if isinstance(loss, (list, tuple))
                  else _losses_by_label(loss, names))
        return sparse_label_classes(losses, outputs_by_label(outputs, names, output_names or ()))
    except (SpecError, KeyError):  # outputs or losses that do not pair with the labels: the step says so
        return {}


def _files_for(job: Job, mode: str):
    files = job.data.train if mode == "train" else job.data.eval
    if files is None:
        raise TpuLaunchError(f"data.{mode}: no {mode} files in the job",
                             hint=f"set data.{mode} to a TFRecord file or glob")
    found = expand_files(files, what=f"data.{mode}")
    refused = [(path, kind) for path in found for kind in [not_a_file(path)] if kind is not None]
    if refused:  # never opened: a FIFO would hold the run's first step forever
        message, hint = not_a_file_text(*refused[0])
        more = f" (and {len(refused) - 1} more like it)" if len(refused) > 1 else ""
        raise TpuLaunchError(f"data.{mode}: {message}{more}", hint=hint)
    return found


def _unread_files(job: Job, mode: str) -> List[str]:
    """The file names of a pipeline that is built and never read: the patterns as written (a job planned
    before its data exists has none; a name that says so stands in, since no file is opened)."""
    patterns = as_list(job.data.train if mode == "train" else job.data.eval)
    return [str(pattern) for pattern in patterns] or [f"(data.{mode} is not set: nothing is read)"]


def _check_static(job: Job) -> None:
    for section in ("features", "labels"):
        for name, spec in getattr(job.data, section).items():
            if not spec.is_static:
                raise TpuLaunchError(f"data.{section}.{name}: shape {spec.shape} has unknown dims; a TPU needs static shapes",
                                     hint="declare every dim")


def make_dataset_fn(job: Job, mode: str, *, use_tpu: bool, unread_files: bool = False,
                    label_classes: Optional[dict] = None) -> Callable:
    """`dataset_fn(batch_size, shard_index=0, shard_count=1, skip_batches=0)` reading the job's TFRecords for
    `mode`: the batches of one input pipeline, each engine calling it as its framework feeds it.

    See `portable.make_dataset_fn` for what the pipeline does. `data.skip_corrupt` drops records
    that fail to read or parse: records that fail to parse are counted (`SKIPPED_RECORDS`, shown by
    `tpulaunch train`), and each skip is logged as a TensorFlow warning "Ignoring error: ..." (shown
    with -vv). Without it the first bad record stops the run: wrap the training call in
    `naming_read_errors` so the message names the file.

    A job's own `data.input_fn` (TPUEstimator's input_fn(params), which only the estimator engine runs) is
    never this pipeline: its engine calls it. `unread_files`: the pipeline reads the data patterns as written
    instead of listing the files they match (a graph built for checking, never run: nothing is listed or read).
    `label_classes`: the class ids each batch is checked for (`portable.make_dataset_fn`; the engine knows them
    from its model).

    Raises:
        TpuLaunchError: unknown mode, a job with its own data.input_fn, no files for the mode, a glob that
            matches nothing, unknown dims on a TPU (or more than one anywhere).
    """
    if mode not in MODES:
        raise TpuLaunchError(f"unknown input mode {mode!r}; use one of {', '.join(MODES)}")
    if job.data.input_fn:
        raise TpuLaunchError("data.input_fn: the job reads its data with its own input_fn, which its engine calls; "
                             "tpulaunch's pipeline reads data.train and data.eval")
    if use_tpu:
        _check_static(job)
    files = _unread_files(job, mode) if unread_files else _files_for(job, mode)
    from tpulaunch.engine import portable

    with spec_errors():
        return portable.make_dataset_fn(files, training=mode == "train", use_tpu=use_tpu,
                                        label_classes=label_classes, **input_settings(job))


# ------------------------------------------------------------------------------------ evaluation's reach

def eval_left_out(job: Job, *, whole_set_here: bool) -> Optional[LeftOut]:
    """What an evaluation of `eval.steps` batches leaves out of data.eval: the records after its last whole batch,
    when the set ends before eval.steps batches (every engine's batches are whole: a TPU's shapes are static).
    `whole_set_here`: this process's pipeline reads the whole set, once (not a TPU's, which repeats it, nor one
    host's share). None when nothing is left out or it cannot be told here (a job's own input_fn, records skipped
    under data.skip_corrupt). Reads at most the records the evaluation reads, once per process."""
    if not whole_set_here or job.eval is None or job.data.input_fn or job.data.eval is None or job.data.skip_corrupt:
        return None
    batch = job.eval.batch_size
    asked = job.eval.steps * batch
    count = _records_up_to(tuple(_files_for(job, "eval")), job.data.compression or "", asked + 1)
    if count > asked or count % batch == 0 or count < batch:  # steps ended it; whole batches; or none (an error)
        return None
    return LeftOut(examples=count - count % batch, records=count % batch)


@functools.lru_cache(maxsize=8)
def _records_up_to(files: Tuple[str, ...], compression: str, limit: int) -> int:
    """The records of `files` in order, counted up to `limit`."""
    import tensorflow as tf

    dataset = tf.data.TFRecordDataset(list(files), compression_type=compression).take(limit)
    return int(dataset.reduce(tf.constant(0, tf.int64), lambda count, _: count + 1))


# ------------------------------------------------------------------------------------ read errors

# How long `read_error` may spend looking for the bad file before saying it could not tell which.
FIND_BAD_FILE_SECONDS = 120.0

# TensorFlow's DataLossError text for a bad record: what went wrong and the byte offset.


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


def label_range_error(exc, mode: str) -> Optional[TpuLaunchError]:
    """The error of a batch whose class ids a sparse categorical crossentropy cannot take
    (`portable.check_label_range`), said at the label's key; None for any other error."""
    from tpulaunch.engine.portable import LABELS_OUT_OF_RANGE

    message = getattr(exc, "message", None) or str(exc)
    found = re.search(re.escape(LABELS_OUT_OF_RANGE) + r": (data\.labels\.\S+) must hold class ids in (\[0, \d+\)) "
                      r"\(([^)]*)\)[^\]]*\] \[(\S+)\] \[(\S+)\]", message)
    if found is None:
        return None
    key, allowed, why, low, high = found.groups()
    return TpuLaunchError(f"{key}: a batch of data.{mode} holds class ids from {low} to {high}, but only ids in "
                          f"{allowed} are classes ({why})",
                          hint=f"fix the records' {key.rsplit('.', 1)[1]} values, or the model's number of classes "
                               "(its output's last axis)")


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
        error = label_range_error(exc, mode)
        if error is not None:
            raise error from None
        if job.data.input_fn:
            raise
        error = read_error(job, mode, exc)
        if error is None:
            raise
        raise error from exc
