"""The input pipeline, precision, heads and losses that every engine runs, on plain values.

This module imports only TensorFlow and the Python standard library, and takes plain values (dicts,
lists, strings, numbers) plus the job's own callables (its Keras builder, a custom loss or metric).
Every engine's standalone.py builds on it, and `tpulaunch explain` prints it verbatim at the top of
each engine's program, so the program runs exactly this code. Its input pipeline (`make_dataset_fn`)
takes plain arguments (the batch, which shard of the input pipelines, what to skip): each engine calls
it as its framework feeds it (TPUEstimator's `input_fn(params)` is the estimator engine's adapter).

A tensor spec is a dict: {"key": the record's feature key, "stored_as": "float_list" | "int64_list" |
"raw" | "png" | "jpeg", "shape": per-example dims (None = unknown), "dtype": "float32", ...}.
Every tensor comes out shaped `shape` with dtype `dtype`, so batches have static shapes, as XLA on a
TPU needs:

- float_list / int64_list: a list, reshaped to `shape` (float_list holds float32: bfloat16 and float16
  are read as float32 and cast; int64_list likewise);
- raw: one bytes value holding the tensor's little-endian bytes in its own dtype;
- png / jpeg: one encoded image, decoded to uint8 [height, width, channels].
"""

import copy
import inspect
import math
import os
import secrets
import sys
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf


class SpecError(ValueError):
    """Declared data or model settings that cannot work together; `hint` says what to change, `key` (when
    known) the job-file key it is about, e.g. ("model", "loss", "box")."""

    def __init__(self, message: str, hint: str = "", key: Tuple = ()):
        super().__init__(message)
        self.hint = hint
        self.key = tuple(key)


class FilesError(ValueError):
    """A file pattern that matches nothing (`reason` None) or cannot be listed (`reason`: TensorFlow's message)."""

    def __init__(self, pattern: str, reason: Optional[str] = None):
        super().__init__(f"cannot list {pattern!r}: {reason}" if reason else f"no files match {pattern!r}")
        self.pattern = pattern
        self.reason = reason


# ------------------------------------------------------------------------------------------ files

def expand_files(patterns: Sequence[str]) -> List[str]:
    """Every file matched by the paths or globs (local or gs://), sorted per pattern, without repeats."""
    found: List[str] = []
    for pattern in patterns:
        try:
            matches = tf.io.gfile.glob(pattern)
        except tf.errors.OpError as exc:
            raise FilesError(pattern, exc.message) from None
        if not matches:
            raise FilesError(pattern)
        found.extend(m for m in sorted(matches) if m not in found)
    return found


# ------------------------------------------------------------------------------------------ parsing

def _is_static(spec: dict) -> bool:
    return all(d is not None for d in spec["shape"])


def _reshape_shape(name: str, spec: dict) -> List[int]:
    """The shape for tf.reshape: one unknown dim becomes -1."""
    if sum(d is None for d in spec["shape"]) > 1:
        raise SpecError(f"data: {name} has shape {spec['shape']} with more than one unknown dim; "
                        f"its stored form {spec['stored_as']} cannot be reshaped",
                        hint="declare the full shape (a TPU needs static shapes anyway)")
    return [-1 if d is None else d for d in spec["shape"]]


def _feature_config(name: str, spec: dict):
    """The tf.io feature parsing one tensor's stored value."""
    stored = spec["stored_as"]
    if stored in ("png", "jpeg"):
        return tf.io.FixedLenFeature([], tf.string)
    _reshape_shape(name, spec)  # raises for several unknown dims
    if stored == "raw":
        return tf.io.FixedLenFeature([], tf.string)
    kind = tf.float32 if stored == "float_list" else tf.int64
    return tf.io.FixedLenFeature(spec["shape"], kind) if _is_static(spec) else tf.io.VarLenFeature(kind)


def _parse_config(specs: Dict[str, dict]) -> dict:
    return {spec["key"]: _feature_config(name, spec) for name, spec in specs.items()}  # one key may feed two tensors


def _decode(name: str, spec: dict, value):
    """The parsed value of one tensor -> a tensor of its declared shape and dtype."""
    stored = spec["stored_as"]
    dtype = tf.as_dtype(spec["dtype"])
    if stored in ("float_list", "int64_list"):
        if isinstance(value, tf.SparseTensor):
            value = tf.reshape(tf.sparse.to_dense(value), _reshape_shape(name, spec))
        return tf.cast(value, dtype) if value.dtype != dtype else value
    if stored == "raw":
        return tf.reshape(tf.io.decode_raw(value, dtype), _reshape_shape(name, spec))
    channels = spec["shape"][-1] or 0  # 0: as stored
    image = tf.io.decode_image(value, channels=channels, dtype=tf.uint8, expand_animations=False)
    return tf.ensure_shape(image, spec["shape"])


def _decode_batch(spec: dict, value, batch: int):
    dtype = tf.as_dtype(spec["dtype"])
    if spec["stored_as"] == "raw":  # the static batch keeps shapes fully defined for XLA
        return tf.reshape(tf.io.decode_raw(value, dtype), [batch, *spec["shape"]])
    return tf.cast(value, dtype) if value.dtype != dtype else value


def _structure(tensors: dict):
    """The structure rule: one entry -> that tensor; several -> dict; none -> None."""
    if not tensors:
        return None
    if len(tensors) == 1:
        return next(iter(tensors.values()))
    return dict(tensors)


def _split(tensors: dict, features: dict, labels: dict, features_as_dict: bool):
    feature_tensors = {n: tensors[n] for n in features}
    return (feature_tensors if features_as_dict else _structure(feature_tensors),
            _structure({n: tensors[n] for n in labels}))


def parse_example_fn(features: Dict[str, dict], labels: Dict[str, dict], features_as_dict: bool = False) -> Callable:
    """A function parsing one serialized tf.train.Example into (features, labels).

    Each side is the single tensor when it declares one, a dict by name for several, None for none;
    `features_as_dict`: the features are a dict by name whatever their count (as a TPUEstimator
    model_fn indexes them: `features["image"]`, the structure `tf.io.parse_example` gives).
    """
    specs = {**features, **labels}
    config = _parse_config(specs)

    def parse(serialized):
        parsed = tf.io.parse_single_example(serialized, config)
        return _split({name: _decode(name, spec, parsed[spec["key"]]) for name, spec in specs.items()},
                      features, labels, features_as_dict)

    return parse


def parse_batch_fn(features: Dict[str, dict], labels: Dict[str, dict], features_as_dict: bool = False) -> Callable:
    """Like `parse_example_fn`, for a vector of serialized records: every tensor gets a leading batch dim."""
    specs = {**features, **labels}
    config = _parse_config(specs)

    def parse(serialized):
        parsed = tf.io.parse_example(serialized, config)
        batch = serialized.shape[0] if serialized.shape[0] is not None else -1
        return _split({name: _decode_batch(spec, parsed[spec["key"]], batch) for name, spec in specs.items()},
                      features, labels, features_as_dict)

    return parse


def batch_parse_possible(specs: Dict[str, dict], *, skip_corrupt: bool, cache: bool) -> bool:
    """Whole batches can be parsed at once when every tensor is static and none is an image.

    One vectorised tf.io.parse_example per batch is about twice as fast as a parse per record; images
    still decode one by one, and skip_corrupt needs records that fail alone.
    """
    return (not skip_corrupt and not cache
            and all(_is_static(s) and s["stored_as"] not in ("png", "jpeg") for s in specs.values()))


# ------------------------------------------------------------------------------------ the dataset

# How many bytes TFRecordDataset reads ahead per file. With one reader per core interleaved, 8 MiB
# buffers cost ~20 % throughput locally (benchmarks/data_pipeline.py); gs:// reads have their own
# read-ahead in TensorFlow's GCS filesystem.
READ_BUFFER_BYTES = 256 * 1024


def make_dataset_fn(files: Sequence[str], *, training: bool, use_tpu: bool, features: Dict[str, dict],
                    labels: Dict[str, dict], compression: str, shuffle_buffer: int, cache: bool,
                    skip_corrupt: bool, features_as_dict: bool = False,
                    label_classes: Optional[Dict[str, int]] = None, seed: Optional[int] = None) -> Callable:
    """`dataset_fn(batch_size, shard_index=0, shard_count=1, skip_batches=0, reseed=0)`: a tf.data.Dataset of
    (features, labels) batches read from `files` (TFRecords of tf.train.Example).

    `batch_size` is the batch this pipeline produces (each engine says whose: a host's, a replica's, the
    global one). With `shard_count` > 1 this pipeline reads shard `shard_index` of them: whole files
    when there are at least as many files as shards, else every n-th record. Training shuffles files
    and records and repeats forever; evaluation reads in a fixed order, and repeats only on a TPU,
    where running out of data mid-loop is an error rather than the end of evaluation. `skip_corrupt`
    drops records that fail to read or parse (see `_parse_skipping_bad_records`). Batches always drop
    the remainder, so shapes are static. `features_as_dict`: see `parse_example_fn`. `label_classes` (label ->
    number of classes, for labels a sparse categorical crossentropy scores): each batch's class ids are checked
    to lie in [0, classes), on the host, before any device sees them (`check_label_range`).

    With a `seed` every run reads the same batches in the same order: the shuffles are seeded (the
    order still changes from epoch to epoch) and the parallel reads and parses hand out their results
    in order. `skip_batches` (what a resumed run already trained on: a number, or a scalar int64 tensor) drops that
    many batches first: with a seed the pipeline so continues exactly where the interrupted run stopped. `reseed`
    (a number or a tensor) seeds the shuffles at seed + reseed: a pipeline made anew partway through a run (the
    estimator's, at each segment between evaluations: `standalone.read_on`) reads another order, not the first
    batches again.
    """
    files = list(files)
    parse = parse_example_fn(features, labels, features_as_dict)
    specs = {**features, **labels}
    batch_parse = batch_parse_possible(specs, skip_corrupt=skip_corrupt, cache=cache)
    parse_batch = parse_batch_fn(features, labels, features_as_dict) if batch_parse else None
    count_block = skip_count_block(specs)

    # Without a seed the parallel stages may hand out whichever result is ready first (faster); with one, in order.
    in_order = not training or seed is not None

    def dataset_fn(batch_size: int, shard_index: int = 0, shard_count: int = 1, skip_batches: int = 0,
                   reseed: int = 0):
        autotune = tf.data.AUTOTUNE
        index, count = shard_index, shard_count
        # A pipeline made anew at step `reseed` of a run (the estimator's segments between evaluations): its
        # shuffles seeded at seed + reseed, another order than the pipeline made at step 0 (a number or a tensor)
        shuffle_seed = seed if seed is None or (isinstance(reseed, int) and not reseed) else seed + reseed
        dataset = tf.data.Dataset.from_tensor_slices(files)
        shard_files = count > 1 and len(files) >= count
        if shard_files:
            dataset = dataset.shard(count, index)
        if training:
            dataset = dataset.shuffle(len(files), seed=shuffle_seed, reshuffle_each_iteration=True)
            if not cache:
                dataset = dataset.repeat()
        dataset = dataset.interleave(
            lambda f: tf.data.TFRecordDataset(f, compression_type=compression, buffer_size=READ_BUFFER_BYTES),
            cycle_length=autotune, num_parallel_calls=autotune, deterministic=in_order)
        if count > 1 and not shard_files:
            dataset = dataset.shard(count, index)
        if not batch_parse:  # records parsed one by one: images, skip_corrupt, cache
            if skip_corrupt:
                dataset = _parse_skipping_bad_records(dataset, parse, count_block)
            else:
                dataset = dataset.map(parse, num_parallel_calls=autotune, deterministic=in_order)
            if cache:
                dataset = dataset.cache()
                if training:
                    dataset = dataset.repeat()
        if training and shuffle_buffer > 0:
            dataset = dataset.shuffle(shuffle_buffer, seed=shuffle_seed)
        if not training and use_tpu:
            dataset = dataset.repeat()
        dataset = dataset.batch(batch_size, drop_remainder=True)
        # What a resumed run already trained on (before the parse: not parsed again): a number, or a scalar int64
        # tensor read when the pipeline starts (the estimator's restored global step).
        if not isinstance(skip_batches, int) or skip_batches:
            dataset = dataset.skip(skip_batches)
        if batch_parse:  # serialized records were shuffled and batched: one vectorised parse per batch
            dataset = dataset.map(parse_batch, num_parallel_calls=autotune, deterministic=in_order)
        if label_classes:
            dataset = dataset.map(lambda x, y: (x, check_label_range(y, label_classes, list(labels))),
                                  num_parallel_calls=autotune, deterministic=in_order)
        return dataset.prefetch(autotune)

    return dataset_fn


# How a failed label check's message begins: `pipeline.naming_read_errors` finds it in TensorFlow's error.
LABELS_OUT_OF_RANGE = "class ids outside the range of the loss"


def check_label_range(labels, classes: Dict[str, int], label_names: Sequence[str]):
    """`labels` (one tensor, or a dict by name), unchanged once every class id of each label in `classes` (label ->
    the model's outputs per example, for a sparse categorical crossentropy) lies in [0, classes). TensorFlow on a
    CPU refuses another id in the loss, but a GPU, a TPU and JAX take it silently (a NaN, a clamped index)."""
    by_label = labels if isinstance(labels, dict) else {label_names[0]: labels}
    checks = []
    for name, count in classes.items():
        value = by_label[name]
        outside = tf.logical_or(value < 0, value >= tf.cast(count, value.dtype))
        checks.append(tf.debugging.Assert(  # its data static-shaped: it may run inside a TPU step
            tf.logical_not(tf.reduce_any(outside)),
            [f"{LABELS_OUT_OF_RANGE}: data.labels.{name} must hold class ids in [0, {count}) (the {count} outputs "
             "of the model, scored by sparse_categorical_crossentropy); the lowest and highest of a batch are",
             tf.reduce_min(value), tf.reduce_max(value)]))
    with tf.control_dependencies(checks):
        return tf.nest.map_structure(tf.identity, labels)


def sparse_label_classes(loss_names: Dict[str, str], outputs: Dict[str, Any]) -> Dict[str, int]:
    """label -> number of classes, for each label that `loss_names` scores with a sparse categorical crossentropy
    against an output (`outputs`, by label) whose last axis (its classes) is known."""
    classes = {}
    for name, loss in loss_names.items():
        shape = getattr(outputs.get(name), "shape", None)
        if loss != "sparse_categorical_crossentropy" or shape is None or len(shape) < 2:
            continue
        count = tf.compat.dimension_value(shape[-1])
        if count:
            classes[name] = int(count)
    return classes


# The graph collection holding each input pipeline's count of records skipped under skip_corrupt
# (one variable per dataset_fn call: one per host on a TPU slice); `tpulaunch train` sums and shows them.
SKIPPED_RECORDS = "skipped_input_records"

# Records per counting step under skip_corrupt: blocks of about this many bytes (at most 64 records,
# at least one, so a block of CT volumes stays one volume). Counting record by record cost a third
# of the examples/s on 48 KiB records; by blocks, with the in-order parse it needs, about a fifth
# there and nothing on 40-byte records (benchmarks/data_pipeline.py).
SKIP_COUNT_BLOCK_BYTES = 256 * 1024


def skip_count_block(specs: Dict[str, dict]) -> int:
    example_bytes = sum((math.prod(s["shape"]) if _is_static(s) else 1) * tf.as_dtype(s["dtype"]).size
                        for s in specs.values())
    return max(1, min(64, SKIP_COUNT_BLOCK_BYTES // max(1, example_bytes)))


def _parse_skipping_bad_records(dataset, parse: Callable, block: int):
    """Parse records one by one, dropping those that fail, and count what was dropped.

    Records are numbered before parsing and kept in order through the (parallel) parse, so after the
    failures are dropped, the last record number of each block of `block` kept records minus the
    records kept so far is how many were skipped so far in this pass. The increase is added to a
    local variable in `SKIPPED_RECORDS`, which so keeps counting when the dataset is repeated after
    this point (evaluation on a TPU). The count is of what the pipeline has read, read-ahead into
    shuffle and prefetch buffers included. A record that fails its CRC or is cut short counts as one
    and ends the read of its file (TFRecord framing cannot be trusted past it): the records after it
    are never read, so they are not counted. Each skip is logged as a TensorFlow warning "Ignoring
    error: ...".
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


# ------------------------------------------------------------------------------------------ precision

def policy_name(precision: str, *, use_tpu: bool, has_gpu: Optional[bool] = None) -> str:
    """The Keras mixed-precision policy for `precision` (float32 | bfloat16 | mixed_float16) on this device.

    bfloat16 means mixed_bfloat16 on a TPU and on a CPU, and mixed_float16 on a GPU (where fp16 is
    the fast half-precision type).
    """
    if precision == "float32":
        return "float32"
    if precision == "mixed_float16":
        return "mixed_float16"
    if not use_tpu:
        gpu = bool(tf.config.list_physical_devices("GPU")) if has_gpu is None else has_gpu
        if gpu:
            return "mixed_float16"
    return "mixed_bfloat16"


def set_precision_policy(policy: str) -> None:
    """Make `policy` the global policy of every Keras this process has imported (tf.keras's when none has been):
    a model's layers take it when they are made, in the Keras the model is written with."""
    for keras in imported_kerases() or [tf.keras]:
        keras.mixed_precision.set_global_policy(policy)


# ----------------------------------------------------------------------------------------------- Keras

# Where Keras classes come from: tf_keras (Keras 2 under TensorFlow 2.16+), keras (Keras 3 there; under
# TensorFlow 2.15, tf.keras itself).
KERAS_PACKAGES = ("tf_keras", "keras")


def keras_of(thing):
    """The Keras package `thing` (a model, layer, loss, metric or optimizer, or its class) is written with, as a
    module; None when it is no Keras object. Told by the package of the first Keras class among its bases (a
    subclass's own module is the user's); the job never says which Keras it uses."""
    cls = thing if isinstance(thing, type) else type(thing)
    for base in cls.__mro__:
        package = base.__module__.split(".")[0]
        if package in KERAS_PACKAGES and package in sys.modules:
            return sys.modules[package]
    return None


def is_keras3(keras) -> bool:
    return keras is not None and int(keras.__version__.split(".")[0]) >= 3


def imported_kerases() -> list:
    """The Keras packages this process has imported, as modules (tf_keras, keras)."""
    found = [sys.modules.get(name) for name in KERAS_PACKAGES]
    return [keras for keras in found if keras is not None and hasattr(keras, "mixed_precision")]


# The methods Keras's fit() and evaluate() call that a model may replace with its own.
FIT_METHODS = ("train_step", "test_step", "compute_loss")


def own_fit_methods(model) -> List[str]:
    """The methods of FIT_METHODS the model's class replaces with its own (Keras's Sequential and Functional keep
    Model's; Keras 3's come from its backend's trainer: neither is the model's own)."""
    keras = keras_of(model)
    own = []
    for method in FIT_METHODS:
        if keras is None or getattr(type(model), method, None) is getattr(keras.Model, method, None):
            continue
        owner = next((cls for cls in type(model).__mro__ if method in vars(cls)), None)
        if owner is not None and owner.__module__.split(".")[0] not in KERAS_PACKAGES:
            own.append(method)
    return own


def compiled_with(model) -> Optional[dict]:
    """What the model's compile() set: {"optimizer", "loss", "metrics", ...} as compile() was given them (the
    optimizer as the model holds it); None for a model never compiled (a KerasHub task model compiles itself)."""
    if is_keras3(keras_of(model)):
        compiled = bool(getattr(model, "compiled", False))
    else:
        compiled = bool(getattr(model, "_is_compiled", False)) or getattr(model, "compiled_loss", None) is not None
    compiled = compiled or getattr(model, "optimizer", None) is not None
    if not compiled:
        return None
    config = getattr(getattr(model, "_compile_config", None), "config", None)
    settings = dict(config) if isinstance(config, dict) else {"loss": getattr(model, "loss", None)}
    settings["optimizer"] = getattr(model, "optimizer", None)
    return settings


def _described(value) -> str:
    """A compile() argument in a few words: 'sparse_categorical_crossentropy', 'Adam', '[accuracy, AUC]'."""
    if value is None:
        return "none"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_described(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(v if isinstance(v, str) else _described(v) for v in value) + "]"
    if isinstance(value, type):
        return value.__name__
    if callable(value) and hasattr(value, "__name__") and not hasattr(value, "get_config"):
        return value.__name__
    inner = getattr(value, "inner_optimizer", None)
    name = type(value).__name__
    return f"{name}({type(inner).__name__})" if inner is not None else name


def compile_with_job(model, own: Optional[dict], given, make: Dict[str, Callable[[], Any]],
                     **compile_args) -> List[str]:
    """compile() `model` as a second compile() would: with the job's value (`make[key]()`) for each of "optimizer",
    "loss" and "metrics" the job sets (`given`), or for all three when the model was never compiled (`own`:
    `compiled_with(model)`), keeping its own compile's others. Returns what each now is, in words ("model.loss
    'mse' replaces its 'mae'", "its optimizer Adam"), for the line that says it."""
    own = own or {}
    replaced = {key: made() for key, made in make.items() if not own or key in given}
    if replaced:
        kept = {key: own.get(key) for key in ("optimizer", "loss", "loss_weights", "metrics", "weighted_metrics")}
        model.compile(**{key: value for key, value in {**kept, **replaced}.items() if value is not None},
                      **compile_args)
    said = []
    for key in ("loss", "optimizer", "metrics"):
        was = own.get(key)
        now = getattr(model, "optimizer", None) if key == "optimizer" else replaced.get(key)
        if key not in replaced:
            said.append(f"its {key} {_described(was)}")
        elif own:
            said.append(f"model.{key} {_described(now)} {'replace' if key == 'metrics' else 'replaces'} its "
                        f"{_described(was)}")
        else:
            said.append(f"model.{key} {_described(now)}")
    return said


def keras_base(thing, module: str, name: str) -> Optional[str]:
    """'<keras>.<module>.<name> class' or '... object' when `thing` is (an instance of) that base of an imported
    Keras (`keras` for Keras 3, `tf.keras` for Keras 2), e.g. ("losses", "Loss"); else None."""
    for keras in imported_kerases():
        base = getattr(getattr(keras, module, None), name, None)
        if base is None:
            continue
        prefix = "keras" if is_keras3(keras) else "tf.keras"
        if isinstance(thing, type) and issubclass(thing, base):
            return f"{prefix}.{module}.{name} class"
        if isinstance(thing, base):
            return f"{prefix}.{module}.{name} object"
    return None


# ----------------------------------------------------------------------------------------------- heads

# Each loss name's Keras loss class, by name: it is taken from the model's own Keras (`compute_loss`).
_CROSSENTROPY = {
    "sparse_categorical_crossentropy": ("SparseCategoricalCrossentropy", "sparse"),
    "categorical_crossentropy": ("CategoricalCrossentropy", "onehot"),
    "binary_crossentropy": ("BinaryCrossentropy", "binary"),
}
_REGRESSION = {
    "mean_squared_error": "MeanSquaredError",
    "mean_absolute_error": "MeanAbsoluteError",
    "huber": "Huber",
}

# Which metrics fit which heads: class metrics need a crossentropy loss, value metrics a regression
# loss; the job's own loss fits both (classes are then read from the shapes), the job's own metric every head.
CLASSIFICATION_METRICS = ("accuracy", "mean_iou", "auc", "precision", "recall")
REGRESSION_METRICS = ("mean_squared_error", "mean_absolute_error")


class Head(NamedTuple):
    """One label and the model output scored against it: its loss, and what class predictions mean for the metrics."""

    loss_name: str
    kind: Optional[str]  # "sparse" | "onehot" | "binary": classification; None: regression; "shapes": the job's own loss
    from_logits: bool


def head_for(loss_name: str, from_logits: bool) -> Head:
    if loss_name in _CROSSENTROPY:
        return Head(loss_name, _CROSSENTROPY[loss_name][1], from_logits)
    if loss_name in _REGRESSION:
        return Head(loss_name, None, False)
    return Head(loss_name, "shapes", from_logits)  # an import-path loss: metrics infer classes from the shapes


def metric_fits(name: str, head: Head) -> bool:
    if name in CLASSIFICATION_METRICS:
        return head.kind is not None
    if name in REGRESSION_METRICS:
        return head.kind in (None, "shapes")
    return True  # the job's own metric (an import path): every head


# Ops that keep what a tensor means (probabilities stay probabilities).
_SHAPE_OPS = ("Identity", "Cast", "Reshape", "Squeeze", "ExpandDims", "Transpose")


# Ops whose output is a logit for certain when a head ends in them: linear maps and sums (a Dense or
# convolution with its bias, a mean over space). Anything else (a clip, a product, a log) says nothing
# about whether the values are probabilities: the job says, in model.outputs.
_LOGIT_OPS = ("MatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "BiasAdd", "Add", "AddV2", "Sub", "Mean",
              "Conv2D", "Conv3D", "DepthwiseConv2dNative", "Conv2DBackpropInput", "Conv3DBackpropInputV2",
              "LogSoftmax")
_PROBABILITY_OPS = ("Softmax", "Sigmoid")


def _layer_output_kind(layer) -> Optional[bool]:
    """True: the layer gives probabilities; False: logits (a linear activation); None: it does not say."""
    keras = keras_of(layer)
    if keras is not None and isinstance(layer, keras.layers.Softmax):
        return True
    activation = getattr(getattr(layer, "activation", None), "__name__", None)
    if activation in ("softmax", "sigmoid"):
        return True
    return False if activation == "linear" else None


def _tensor_output_kind(tensor) -> Optional[bool]:
    """True: `tensor` comes out of a softmax or sigmoid (through casts and reshapes); False: out of a linear op;
    None: neither is certain."""
    if hasattr(tensor, "_keras_logits"):  # Keras marks the outputs of its softmax and sigmoid activations
        return True
    try:
        op = tensor.op
    except AttributeError:  # an eager tensor has no producing op
        return None
    while op.type in _SHAPE_OPS and op.inputs:
        op = op.inputs[0].op
    if op.type in _PROBABILITY_OPS:
        return True
    return False if op.type in _LOGIT_OPS else None


def _output_layers(model, count: int) -> list:
    """The layer producing each of the model's `count` (flattened) outputs, None where the model does not record it:
    a functional model's output layers, a Sequential's last layer; a subclassed model's are unknown."""
    keras = keras_of(model)
    if keras is not None and isinstance(model, keras.Sequential) and model.layers and count == 1:
        return [model.layers[-1]]
    functional = getattr(model, "_is_graph_network", False) or any(  # Keras 2 says so; Keras 3 by its class
        cls.__name__ == "Functional" for cls in type(model).__mro__)
    known = list(getattr(model, "outputs", None) or []) if functional else []
    if len(known) == count:
        # The layer that made each output: Keras 2's history names it `layer`, Keras 3's `operation`.
        histories = [getattr(t, "_keras_history", None) for t in known]
        return [getattr(h, "layer", None) or getattr(h, "operation", None) for h in histories]
    return [None] * count


def probabilities_of(model, outputs):
    """For each output (same structure): True when it holds probabilities, False when logits, None when neither is
    certain: from the layer that produces it, or else from the op that computes it (subclassed models, custom
    layers)."""
    flat = tf.nest.flatten(outputs)
    layers = _output_layers(model, len(flat))
    kinds = []
    for layer, tensor in zip(layers, flat):
        kind = _layer_output_kind(layer) if layer is not None else None
        kinds.append(kind if kind is not None else _tensor_output_kind(tensor))
    return tf.nest.pack_sequence_as(outputs, kinds)


def _output_kind(name: str, loss_name: str, found: Optional[bool], declared: Optional[str], tensor) -> bool:
    """Whether head `name` holds probabilities: as declared in model.outputs, else as found for certain. A
    crossentropy head the model does not say of, and the job does not declare, is refused: guessing would
    train on the wrong loss without a word."""
    if declared is not None:
        return declared == "probabilities"
    if found is None and loss_name in _CROSSENTROPY:
        op = getattr(tensor, "op", None)
        while op is not None and op.type in _SHAPE_OPS and op.inputs:
            op = op.inputs[0].op
        op = getattr(op, "type", "an op")
        raise SpecError(f"cannot tell whether the model's output for '{name}' holds logits or probabilities: it comes "
                        f"out of {op}, not a softmax/sigmoid or a linear layer",
                        hint=f"say which: model.outputs: {{{name}: probabilities}} (or logits)",
                        key=("model", "outputs"))
    return bool(found)


def outputs_by_label(outputs, label_names: Sequence[str], output_names: Sequence[str] = ()) -> dict:
    """The model's outputs keyed by the label each is scored against, in the order of `label_names`.

    By name: dict outputs keyed like the labels; a list whose output layers are named like the labels
    (a functional model's `output_names`). Else by order: a list pairs with the labels as declared,
    a single tensor with the only label.
    """
    names = list(label_names)
    if not names:
        raise SpecError("the job declares no labels to score the model's outputs against",
                        hint="declare data.labels, or give model.loss as an import path fn(labels, outputs)",
                        key=("data", "labels"))
    if isinstance(outputs, dict):
        if set(outputs) != set(names):
            raise SpecError(f"the model returns outputs {sorted(outputs)}, but data.labels declares {names}",
                            hint="key the model's outputs by the names in data.labels (or rename the labels)",
                            key=("data", "labels"))
        return {n: outputs[n] for n in names}
    flat = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    if len(flat) != len(names):
        said = "one tensor" if len(flat) == 1 else f"{len(flat)} outputs"
        raise SpecError(f"the model returns {said}, but data.labels declares {len(names)}: {names}",
                        hint="return one output per label: a dict keyed by label, or a list in the order of data.labels",
                        key=("data", "labels"))
    given = list(output_names or ())
    if len(flat) > 1 and len(given) == len(flat):
        if set(given) == set(names):
            return {n: flat[given.index(n)] for n in names}
        if set(given) & set(names):
            raise SpecError(f"the model's output layers are named {given}: some like the labels {names}, some not",
                            hint="name every output layer like its label, or none of them (outputs then pair with "
                                 "data.labels in declared order)", key=("data", "labels"))
    return dict(zip(names, flat))


def _losses_by_label(loss, names: Sequence[str]) -> Dict[str, str]:
    return {n: loss[n] for n in names} if isinstance(loss, dict) else {n: loss for n in names}


class Pair(NamedTuple):
    """One label's tensor and the model output scored against it, with how they are scored."""

    head: Head
    labels: Any
    outputs: Any


def pair_heads(labels, outputs, probabilities, loss_names: Dict[str, str], output_names: Sequence[str],
               declared: Optional[Dict[str, str]] = None) -> dict:
    """label -> Pair, in declared order (`loss_names`: each label's loss; `probabilities`: as `probabilities_of`;
    `declared`: model.outputs, label -> "logits" | "probabilities", which wins over what was found)."""
    names = list(loss_names)
    declared = dict(declared or {})
    by_label = labels if isinstance(labels, dict) else dict(zip(names, [labels]))
    paired = outputs_by_label(outputs, names, output_names)
    found = outputs_by_label(probabilities, names, output_names)
    return {n: Pair(head_for(loss_names[n], not _output_kind(n, loss_names[n], found[n], declared.get(n), paired[n])),
                    by_label[n], paired[n]) for n in names}


# ----------------------------------------------------------------------------------------------- loss

def _single_loss(head: Optional[Head], labels, outputs, custom: Optional[Callable], keras=None):
    if custom is not None:
        value = custom(labels, outputs)
    elif head.loss_name in _CROSSENTROPY:
        cls = getattr(keras.losses, _CROSSENTROPY[head.loss_name][0])
        value = cls(from_logits=head.from_logits, reduction="none")(labels, outputs)
    else:
        value = getattr(keras.losses, _REGRESSION[head.loss_name])(reduction="none")(labels, outputs)
    # Reduce whatever came back to one float32 scalar: the mean over the (replica's) batch, which is what
    # Keras's SUM_OVER_BATCH_SIZE computes; Keras refuses that reduction inside a tf.distribute replica.
    # A custom loss may return per-example values.
    return tf.reduce_mean(tf.cast(value, tf.float32))


def _label_loss(name: str, head: Head, labels, outputs, custom: Optional[Callable], key: tuple, keras):
    if custom is None:  # a class id the loss cannot take stops the step (a TPU's compiled step drops the check)
        labels = check_label_range(labels, sparse_label_classes({name: head.loss_name}, {name: outputs}), [name])
    try:
        return _single_loss(head, labels, outputs, custom, keras)
    except ValueError as exc:  # the loss's own shape checks, at graph building
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SpecError(
            f"loss {head.loss_name!r} cannot score label {name!r} ({_per_example(labels)}) against the model's "
            f"output ({_per_example(outputs)}): {detail}",
            hint="declare the label's shape and dtype as the loss needs them against this output (sparse "
                 "crossentropy: class ids, one fewer axis than the output), or give that label a loss that fits "
                 "(model.loss: {label: loss})", key=key) from exc


def _per_example(tensor) -> str:
    return f"{tensor.dtype.name} {tensor.shape.as_list()[1:]} per example"


def _per_example_loss(custom: Callable, path: str, key: tuple) -> Callable:
    """The job's own loss as a function of (labels, outputs): a function as it is; a Keras Loss class (of either
    Keras) made with no arguments, as Keras's compile() takes it, and a Loss object copied to reduce nothing, since
    _single_loss takes the batch mean itself (Keras refuses its own inside a tf.distribute replica)."""
    kind = keras_base(custom, "losses", "Loss")
    if kind is not None and kind.endswith("class"):
        try:
            custom = custom()
        except TypeError as exc:
            raise SpecError(f"loss {path!r}: the Keras loss class cannot be made without arguments: {exc}",
                            hint="give the import path of a loss object made with its arguments "
                                 "(my_loss = MyLoss(...) in its module)", key=key) from None
    if keras_base(custom, "losses", "Loss") is not None:
        custom = copy.copy(custom)
        custom.reduction = "none"  # Reduction.NONE in Keras 2 and 3
    return custom


def compute_loss(loss, labels, outputs, pairs: Dict[str, Pair], *, custom_loss: Optional[Callable] = None,
                 custom_losses: Optional[Dict[str, Callable]] = None, keras=None):
    """The scalar float32 loss.

    An import-path `loss` (a string, its function `custom_loss`) is called once with the whole labels
    and outputs, dicts included: it defines how its heads pair up (RetinaNet's {cls_targets,
    box_targets} against {cls_logits, box_regression}). Otherwise each label's loss (one for all, or
    per label when `loss` is a mapping) scores its Pair, and the losses are summed. An import-path loss
    may also be a Keras Loss class or object (`_per_example_loss`). The losses named are `keras`'s, the Keras
    the model is written with (default: tf.keras).
    """
    keras = keras or tf.keras
    if not isinstance(loss, dict) and custom_loss is not None:
        return _single_loss(None, labels, outputs, _per_example_loss(custom_loss, loss, ("model", "loss")))
    total = []
    for name, pair in pairs.items():
        loss_name = pair.head.loss_name
        custom = (custom_losses or {}).get(loss_name)
        if ":" in loss_name and custom is None:
            raise SpecError(f"loss {loss_name!r} for label {name!r} was not given as a function",
                            hint="pass it in custom_losses", key=("model", "loss", name))
        key = ("model", "loss", name) if isinstance(loss, dict) else ("model", "loss")
        if custom is not None:
            custom = _per_example_loss(custom, loss_name, key)
        total.append(_label_loss(name, pair.head, pair.labels, pair.outputs, custom, key, keras))
    return tf.add_n(total)


# -------------------------------------------------------------------------------------------- metrics

def _classes(head: Head, labels, outputs):
    """(label classes, predicted classes, probabilities, number of classes) for one head.

    Binary: one output per example (or per pixel), or a binary crossentropy loss. Sparse: integer
    labels with one output per class. One-hot: labels with the same shape as the outputs.
    """
    extra_axis = outputs.shape.rank == labels.shape.rank + 1
    if head.kind == "binary" or (extra_axis and outputs.shape[-1] == 1):
        if extra_axis:
            outputs = tf.squeeze(outputs, -1)
        probabilities = tf.sigmoid(outputs) if head.from_logits else outputs
        truth = labels > 0.5 if labels.dtype.is_floating else labels
        return tf.cast(truth, tf.int32), tf.cast(probabilities > 0.5, tf.int32), probabilities, 2
    probabilities = tf.nn.softmax(outputs) if head.from_logits else outputs
    num_classes = int(outputs.shape[-1])
    if not extra_axis:
        if head.kind == "sparse":  # labels [N, 1] against outputs [N, C]
            labels = tf.squeeze(labels, -1)
        else:
            labels = tf.argmax(labels, axis=-1, output_type=tf.int32)
    return tf.cast(labels, tf.int32), tf.argmax(outputs, axis=-1, output_type=tf.int32), probabilities, num_classes


def _values_like_labels(labels, outputs):
    if outputs.shape.rank == labels.shape.rank + 1 and outputs.shape[-1] == 1:
        outputs = tf.squeeze(outputs, -1)
    return tf.cast(labels, tf.float32), outputs


def metrics_by_label(metrics, heads: Dict[str, Head]) -> Dict[str, List[str]]:
    """The metrics each label gets: a list applies each metric to every head it fits (one that fits none
    is an error); a mapping names them per label."""
    if isinstance(metrics, dict):
        return {name: list(metrics.get(name, ())) for name in heads}
    chosen: Dict[str, List[str]] = {name: [] for name in heads}
    for i, metric in enumerate(metrics):
        fitting = [name for name, head in heads.items() if metric_fits(metric, head)]
        if not fitting:
            losses = ", ".join(f"{name}: {head.loss_name}" for name, head in heads.items())
            raise SpecError(f"metric {metric!r} fits none of the model's heads ({losses})",
                            hint="remove it, or give metrics per label (model.metrics: {label: [...]})",
                            key=("model", "metrics", i))
        for name in fitting:
            chosen[name].append(metric)
    return chosen


def _predictions(outputs, label_names: Sequence[str], output_names: Sequence[str]) -> dict:
    """PREDICT's (and export's) outputs by name: a dict as is, one tensor as 'outputs', a list by label."""
    if isinstance(outputs, dict):
        return outputs
    if not isinstance(outputs, (list, tuple)):
        return {"outputs": outputs}
    try:
        return outputs_by_label(outputs, label_names, output_names)
    except SpecError:
        return {f"output_{i}": t for i, t in enumerate(outputs)}


# ---------------------------------------------------------------------------------------- evaluation

def no_evaluation_batches() -> SpecError:
    """An evaluation that read no whole batch (batches drop the remainder): its metrics would be 0 over nothing,
    which is never reported as a result."""
    return SpecError("eval.batch_size: data.eval holds fewer records than one batch, so not a single batch was "
                     "evaluated (batches drop the remainder)",
                     hint="use an eval.batch_size no larger than data.eval's records, or add records",
                     key=("eval", "batch_size"))


# ------------------------------------------------------------------------------------------ schedule

def boundaries(start: int, steps: int, every: Optional[int]) -> List[int]:
    """Global steps to train to, one segment each; an evaluation follows each when `every` is set."""
    if not every:
        return [steps]
    return list(range((start // every + 1) * every, steps, every)) + [steps]


def train_and_evaluate(step: int, steps: int, every: Optional[int], *, train_to: Callable[[int], int],
                       evaluate: Optional[Callable[[int], None]], ended: Callable[[int], Any] = lambda step: None):
    """The order every run trains and evaluates in (`tpulaunch train`'s loop and the explained programs):
    from global step `step`, train to each boundary (`boundaries`) and evaluate there; the last boundary is
    evaluated also when an earlier run trained to it and stopped before its evaluation, so the run's result
    exists after a rerun.

    Args:
        train_to: trains to a global step, returns the step reached.
        evaluate: evaluates the latest checkpoint (given the step); None when the job does not evaluate.
        ended: asked after each training segment; what it returns (not None) ends the run there.

    Returns:
        What `ended` returned, or None when the run reached `steps`.
    """
    for boundary in boundaries(step, steps, every):
        if step < boundary:
            step = train_to(boundary)
            why = ended(step)
            if why is not None:
                return why
        if evaluate is not None and (every or boundary == steps):
            evaluate(step)
    return None


# ------------------------------------------------------------------------------------------ checkpoints

def checkpoint_class(write_through: Optional[Callable[[Callable[[str], Any], str], str]]):
    """tf.train.Checkpoint, or one whose every write (CheckpointManager's saves included) goes through
    `write_through(write, prefix)`, `write(any_prefix)` writing it (tpulaunch: under a staging prefix, moved to
    `prefix` while the run holds model_dir's lease; engine/core/staged_save.py)."""
    if write_through is None:
        return tf.train.Checkpoint

    class WrittenThrough(tf.train.Checkpoint):
        def _write(self, file_prefix, options=None):
            # TensorFlow 2.16 and later: CheckpointManager records its state in a write callback, given the path
            # written. Run after the write has gone through, they name the checkpoint where it is in the end.
            callbacks = list(getattr(options, "experimental_write_callbacks", None) or ())
            if callbacks:
                options = copy.copy(options)
                options.experimental_write_callbacks = None
            path = write_through(lambda prefix: tf.train.Checkpoint._write(self, prefix, options=options), file_prefix)
            for callback in callbacks:
                callback(*[path][:len(inspect.signature(callback).parameters)])  # 0 or 1 parameters, as TF calls them
            return path

    return WrittenThrough


def name_in(directory: str, path: str) -> Optional[str]:
    """`path`'s file name when it names a file right in `directory`, else None. `path` is as TensorFlow holds it: a
    state entry is resolved against the state file's folder (`tf.train.get_checkpoint_state`). A state file copied
    or moved with its directory may name the old place, or `../` anything: such an entry is never this directory's
    to name or delete."""
    parent, _, name = _normal(path).rpartition("/")
    return name if name and parent == _normal(directory).rstrip("/") else None


def _normal(path: str) -> str:
    scheme, sep, rest = path.rpartition("://")
    return f"{scheme}{sep}{os.path.normpath(rest)}" if sep else os.path.abspath(path)


def state_entry(directory: str, name: str) -> str:
    """What to hand TensorFlow's state writers (`generate_checkpoint_state_proto`, `update_checkpoint_state`) so the
    state file names `name` by its bare name in `directory`. For a directory that is not an absolute local path
    (gs://, a relative one) TensorFlow rewrites each entry with os.path.relpath against it, which would turn a bare
    name into `../../../name` under gs://bucket/run: it must get the name joined to the directory instead."""
    whole = os.path.isabs(directory) or os.path.isabs(name) or "://" in name  # a path of its own: left as it is
    return name if whole else os.path.join(directory, name)


def write_checkpoint_state(directory: str, latest: str, paths: list, *, fence: Callable[[], None],
                           timestamps: Optional[list] = None, last_preserved: Optional[float] = None) -> None:
    """directory's `checkpoint` state file naming `latest` and `paths` by their names in `directory` (a copied or
    moved directory's state names its own files; an entry elsewhere is left out), as TensorFlow's
    update_checkpoint_state_internal writes it, to a temporary name first: `fence()` comes after that write, right
    before the rename, so a run frozen while writing it names nothing once it thaws."""
    from google.protobuf import text_format

    kept = [(name_in(directory, path), index) for index, path in enumerate(paths)]
    kept = [(name, index) for name, index in kept if name]
    state = tf.compat.v1.train.generate_checkpoint_state_proto(
        directory, state_entry(directory, name_in(directory, latest) or latest),
        all_model_checkpoint_paths=[state_entry(directory, name) for name, _ in kept],
        all_model_checkpoint_timestamps=[timestamps[index] for _, index in kept] if timestamps else None,
        last_preserved_timestamp=last_preserved)
    path = os.path.join(directory, "checkpoint")
    temporary = f"{path}.tmp{secrets.token_hex(16)}"  # TensorFlow's temporary name for it
    try:
        with tf.io.gfile.GFile(temporary, "w") as handle:
            handle.write(text_format.MessageToString(state))
        fence()
        tf.io.gfile.rename(temporary, path, overwrite=True)
    except BaseException:
        if tf.io.gfile.exists(temporary):
            tf.io.gfile.remove(temporary)
        raise


def checkpoint_manager_class(fence: Optional[Callable[[], None]]):
    """tf.train.CheckpointManager, or one that calls `fence` before each write of its state file and each
    deletion of old checkpoints (a run that thaws after its lease was taken over names and deletes nothing)."""
    if fence is None:
        return tf.train.CheckpointManager

    class Fenced(tf.train.CheckpointManager):
        def _record_state(self):
            fence()
            filenames, timestamps = zip(*self._maybe_delete.items())
            write_checkpoint_state(self.directory, self.latest_checkpoint, list(filenames), fence=fence,
                                   timestamps=list(timestamps), last_preserved=self._last_preserved_timestamp)

        def _sweep(self):
            fence()
            for path in [path for path in self._maybe_delete if name_in(self.directory, path) is None]:
                del self._maybe_delete[path]  # named elsewhere by a copied or moved state: never deleted from here
            super()._sweep()

    return Fenced
