"""`tpulaunch explain`: the standalone TPUEstimator program a job file stands for.

`explain_script(loaded)` returns the text of one Python file that uses only TensorFlow 2.15 (and the
job's own model code): the input_fn parsing the declared TFRecord feature spec, the model_fn around
the job's Keras builder (loss, v1 optimizer with CrossShardOptimizer on a TPU, eval_metrics,
host_call summaries), the TPUClusterResolver, RunConfig/TPUConfig with the same values
`tpulaunch.engine.estimator.runner.run_config` gives, the TPUEstimator, and the train/evaluate loop of `tpulaunch
train`. Every job-derived value carries a comment naming the job-file key (and line) it came from.

Pure Python: TensorFlow is not imported here.
"""

from __future__ import annotations

import os
import pprint
from typing import Any, Optional, Sequence

from tpulaunch.job.builder_args import builder_kwargs
from tpulaunch.job.load import LoadedJob

DEFAULT_LOG_EVERY_STEPS = 100  # tpulaunch.engine.estimator.runner.DEFAULT_LOG_EVERY_STEPS
DEFAULT_SUMMARY_STEPS = 100  # tpulaunch.engine.estimator.model_fn.DEFAULT_SUMMARY_STEPS


class _Keys:
    """Where a job value came from: 'tpu.cores_per_replica (job.yaml:22)', or '(default)'."""

    def __init__(self, loaded: LoadedJob):
        self.loaded = loaded
        self.base = os.path.basename(loaded.file)

    def __call__(self, *path: Any) -> str:
        marks = self.loaded.marks
        key = ".".join(str(p) for p in path)
        if tuple(path) in marks.values or tuple(path) in marks.keys:
            _, mark = marks.locate(tuple(path))
            return f"{key} ({self.base}:{mark.line})"
        return f"{key} (default)"


# The reference models shipped with tpulaunch: a script that uses one gets a copy of its source, so
# it runs without tpulaunch installed.
REFERENCE_PACKAGE = "tpulaunch.models."


def _import_line(spec: str, alias: str) -> str:
    module, _, attr = spec.partition(":")
    if module.startswith(REFERENCE_PACKAGE):
        return f"{alias} = {_reference_name(module)}.{attr}"
    if "." in attr:  # module:Class.method
        head, rest = attr.split(".", 1)
        return f"from {module} import {head} as _{alias}_owner\n{alias} = _{alias}_owner.{rest}"
    return f"from {module} import {attr} as {alias}"


def _reference_name(module: str) -> str:
    return "_" + module[len(REFERENCE_PACKAGE):].replace(".", "_")


def _reference_blocks(specs: Sequence[str]) -> list:
    """For each reference model module the job names, its source as a module object in the script."""
    import importlib.util

    lines: list = []
    seen: set = set()
    for spec in specs:
        module = spec.partition(":")[0]
        if not module.startswith(REFERENCE_PACKAGE) or module in seen:
            continue
        seen.add(module)
        found = importlib.util.find_spec(module)
        with open(found.origin, encoding="utf-8") as handle:
            source = handle.read()
        name = _reference_name(module)
        private = "reference_models." + module[len(REFERENCE_PACKAGE):]  # never shadows an installed tpulaunch
        # Verbatim in a raw string, so it reads as the module; repr() where that could not round-trip.
        verbatim = "\'\'\'" not in source and not source.endswith("\\")
        text = f"r\'\'\'{source}\'\'\'" if verbatim else repr(source)
        lines += [
            f"# {module} (tpulaunch's reference model), copied so this script runs without tpulaunch.",
            f"{name} = sys.modules[{private!r}] = types.ModuleType({private!r})",
            f"exec(compile({text}, {module!r}, 'exec'), {name}.__dict__)",
            "",
        ]
    return lines


def _files(value) -> Optional[list]:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def _builder_kwargs(job, search_path: Sequence[str]) -> dict:
    """The builder's keyword arguments, as `tpulaunch train` passes them (params, plus input shapes).

    Resolving the builder needs its module; when it cannot be imported here, only the params are
    written (and `input_shape(s)` added when the job has none).
    """
    try:
        from tpulaunch.job.imports import resolve

        builder = resolve(job.model.builder, search_path=search_path, what="model builder")
        return builder_kwargs(builder, job.model.params, job.data.features)
    except Exception:  # pylint: disable=broad-except  # best effort: fall back to the plain params
        return dict(job.model.params)


def _tensor_specs(group: dict) -> dict:
    return {name: {"key": spec.key or name, "stored_as": spec.stored_as, "shape": list(spec.shape),
                   "dtype": spec.dtype} for name, spec in group.items()}


def _literal(value: Any, indent: int = 0) -> str:
    text = pprint.pformat(value, width=100 - indent, sort_dicts=False)
    return text.replace("\n", "\n" + " " * indent)


def explain_script(loaded: LoadedJob, *, search_path: Sequence[str] = ()) -> str:
    """The standalone script for the (valid) job in `loaded`.

    Raises:
        ValueError: the job did not validate (`loaded.job` is None).
    """
    from tpulaunch.engine.estimator.runner import partition_dims

    job = loaded.job
    if job is None:
        raise ValueError("the job file has schema problems; run `tpulaunch validate` first")
    at = _Keys(loaded)
    on_tpu = job.tpu is not None
    spec = job.model
    job_dir = os.path.dirname(os.path.abspath(loaded.file))
    log_every = job.run.log_every_steps or (job.tpu.iterations_per_loop if on_tpu else DEFAULT_LOG_EVERY_STEPS)
    cores = job.tpu.cores_per_replica if on_tpu else 1
    dims = partition_dims(job) if on_tpu else None
    eval_batch = job.eval.batch_size if job.eval else None
    train_batch = job.train.batch_size if job.train else (eval_batch or 1)

    lines = [
        "#!/usr/bin/env python3",
        f'"""The TPUEstimator program of job {job.name!r} ({os.path.basename(loaded.file)}), written by `tpulaunch explain`.',
        "",
        "It needs only TensorFlow 2.15 (tensorflow-estimator 2.15) and the job's own model code, and does what",
        "`tpulaunch train` does for this job: " + (
            "resolve the Cloud TPU, build RunConfig/TPUConfig/TPUEstimator, train and evaluate."
            if on_tpu else "train on this machine's CPU/GPU with TPUEstimator(use_tpu=False), and evaluate."),
        "Values from the job file carry a comment naming their key and line.",
        "",
        f"Run: python {{this file}}    (from anywhere; the job's directory is put on sys.path)",
        '"""',
        "",
        "import os",
        "import sys",
        "import types",
        "",
        "import tensorflow as tf",
        "",
        "# The job file's directory comes first on the import path, as under `tpulaunch train`.",
        f"JOB_DIR = {job_dir!r}",
        "sys.path.insert(0, JOB_DIR)",
        "",
        "# ------------------------------------------------------------------------------------ job values",
        "",
        f"USE_TPU = {on_tpu!r}  # {'tpu: section present' if on_tpu else 'no tpu: section: runs locally'}",
        f"MODEL_DIR = {job.run.model_dir!r}  # {at('run', 'model_dir')}",
        f"TRAIN_FILES = {_files(job.data.train)!r}  # {at('data', 'train')}",
        f"EVAL_FILES = {_files(job.data.eval)!r}  # {at('data', 'eval')}",
        f"COMPRESSION = {job.data.compression or ''!r}  # {at('data', 'compression')}",
        f"SHUFFLE_BUFFER = {job.data.shuffle_buffer!r}  # {at('data', 'shuffle_buffer')}",
        f"CACHE = {job.data.cache!r}  # {at('data', 'cache')}",
        f"SKIP_CORRUPT = {job.data.skip_corrupt!r}  # {at('data', 'skip_corrupt')}",
        f"# Per tensor: record key, stored form, per-example shape, dtype.  {at('data', 'features')}",
        f"FEATURES = {_literal(_tensor_specs(job.data.features), 11)}",
        f"# {at('data', 'labels')}",
        f"LABELS = {_literal(_tensor_specs(job.data.labels), 9)}",
        "",
        f"TRAIN_BATCH_SIZE = {train_batch!r}  # {at('train', 'batch_size')}: global, over all replicas",
        f"TRAIN_STEPS = {job.train.steps if job.train else 0!r}  # {at('train', 'steps')}: train until this global step",
        f"EVAL_BATCH_SIZE = {eval_batch!r}  # {at('eval', 'batch_size')}",
        f"EVAL_STEPS = {job.eval.steps if job.eval else None!r}  # {at('eval', 'steps')}",
        f"EVAL_EVERY_STEPS = {job.eval.every_steps if job.eval else None!r}  # {at('eval', 'every_steps')}",
        "",
        f"LEARNING_RATE = {spec.optimizer.learning_rate!r}  # {at('model', 'optimizer', 'learning_rate')}",
        f"OPTIMIZER_ARGS = {_literal(_optimizer_args(spec), 17)}  # {at('model', 'optimizer', 'args')}",
        f"LOSS = {spec.loss!r}  # {at('model', 'loss')}",
        f"METRICS = {list(spec.metrics)!r}  # {at('model', 'metrics')}",
        f"PRECISION = {spec.precision!r}  # {at('model', 'precision')}",
        "",
        f"SAVE_CHECKPOINTS_STEPS = {job.run.save_checkpoints_steps!r}  # {at('run', 'save_checkpoints_steps')}",
        f"KEEP_CHECKPOINT_MAX = {job.run.keep_checkpoint_max!r}  # {at('run', 'keep_checkpoint_max')}",
        f"SEED = {job.run.seed!r}  # {at('run', 'seed')}",
        f"LOG_EVERY_STEPS = {log_every!r}  # {at('run', 'log_every_steps')}, else iterations_per_loop on a TPU",
        f"SUMMARY_STEPS = {job.run.log_every_steps or DEFAULT_SUMMARY_STEPS!r}  # {at('run', 'log_every_steps')}",
        "",
    ]
    if on_tpu:
        tpu = job.tpu
        lines += [
            (f"TPU_NAME = {tpu.name!r}  # {at('tpu', 'name')}" if tpu.name else
             "TPU_NAME = os.environ.get('TPU_NAME')  # tpu.name (default: $TPU_NAME)"),
            f"TPU_ZONE = {tpu.zone!r}  # {at('tpu', 'zone')}",
            f"TPU_PROJECT = {tpu.project!r}  # {at('tpu', 'project')}",
            f"TPU_TYPE = {tpu.type!r}  # {at('tpu', 'type')} (for reference; the slice is what TPU_NAME names)",
            f"ITERATIONS_PER_LOOP = {tpu.iterations_per_loop!r}  # {at('tpu', 'iterations_per_loop')}",
            f"NUM_CORES_PER_REPLICA = {cores if cores > 1 else None!r}  # {at('tpu', 'cores_per_replica')}"
            + ("" if cores > 1 else ": 1 core per replica = no model parallelism"),
            "# [features dims, labels dims], mirroring the structure input_fn yields (dict per several tensors;",
            f"# None = replicated to every core of a replica). {at('partition')}",
            f"INPUT_PARTITION_DIMS = {_literal(dims, 23)}",
            "",
        ]
    else:
        lines += ["ITERATIONS_PER_LOOP = 1  # no TPU: one step per session run", ""]
    lines += _model_imports(job, at, search_path)
    lines.append(_BODY)
    return "\n".join(lines) + "\n"


def _optimizer_args(spec) -> dict:
    args = dict(spec.optimizer.args)
    if spec.optimizer.name == "momentum":
        args = {"momentum": 0.9, **args}  # tpulaunch.engine.estimator.model_fn: MomentumOptimizer has no default momentum
    return args


_OPTIMIZER_CLASSES = {
    "sgd": "tf.compat.v1.train.GradientDescentOptimizer",
    "momentum": "tf.compat.v1.train.MomentumOptimizer",
    "adam": "tf.compat.v1.train.AdamOptimizer",
    "adagrad": "tf.compat.v1.train.AdagradOptimizer",
    "rmsprop": "tf.compat.v1.train.RMSPropOptimizer",
}


def _model_imports(job, at, search_path: Sequence[str]) -> list:
    spec = job.model
    lines = ["# ------------------------------------------------------------------------ the job's own code", ""]
    specs = [s for s in (spec.builder, spec.model_fn, spec.loss, spec.optimizer.name, *spec.metrics, job.data.input_fn)
             if s and ":" in s]
    lines += _reference_blocks(specs)
    if spec.model_fn:
        lines += [f"# {at('model', 'model_fn')}: the job's own TPUEstimator model_fn, used unchanged.",
                  _import_line(spec.model_fn, "user_model_fn"), "build_model = None", "BUILDER_KWARGS = {}"]
    else:
        lines += [f"# {at('model', 'builder')}: returns an inference-only tf.keras.Model.",
                  _import_line(spec.builder, "build_model"),
                  f"# {at('model', 'params')}, plus input_shape(s) from data.features when the builder takes them",
                  f"BUILDER_KWARGS = {_literal(_builder_kwargs(job, search_path), 17)}",
                  "user_model_fn = None"]
    if ":" in spec.optimizer.name:
        lines += [f"# {at('model', 'optimizer', 'name')}", _import_line(spec.optimizer.name, "make_optimizer_class")]
    else:
        lines += [f"make_optimizer_class = {_OPTIMIZER_CLASSES[spec.optimizer.name]}  # {at('model', 'optimizer', 'name')}"]
    if ":" in spec.loss:
        lines += [f"# {at('model', 'loss')}", _import_line(spec.loss, "custom_loss")]
    else:
        lines += ["custom_loss = None"]
    customs = [(i, m) for i, m in enumerate(spec.metrics) if ":" in m]
    for i, metric in customs:
        lines.append(_import_line(metric, f"custom_metric_{i}") + f"  # {at('model', 'metrics', i)}")
    lines.append("CUSTOM_METRICS = {" + ", ".join(f"{m!r}: custom_metric_{i}" for i, m in customs) + "}")
    if job.data.input_fn:
        lines += [f"# {at('data', 'input_fn')}: the job's own input_fn, used instead of the TFRecord pipeline below.",
                  _import_line(job.data.input_fn, "user_input_fn")]
    else:
        lines.append("user_input_fn = None")
    lines.append("")
    return lines


_BODY = r'''
# ------------------------------------------------------------------------------------------ input_fn

def _structure(tensors):
    """One entry: that tensor; several: a dict by name; none: None."""
    if not tensors:
        return None
    if len(tensors) == 1:
        return next(iter(tensors.values()))
    return dict(tensors)


def _parse_config():
    config = {}
    for spec in {**FEATURES, **LABELS}.values():
        if spec["stored_as"] in ("float_list", "int64_list"):
            kind = tf.float32 if spec["stored_as"] == "float_list" else tf.int64
            config[spec["key"]] = tf.io.FixedLenFeature(spec["shape"], kind)
        else:  # raw bytes, png, jpeg
            config[spec["key"]] = tf.io.FixedLenFeature([], tf.string)
    return config


def _decode(spec, value):
    dtype = tf.as_dtype(spec["dtype"])
    if spec["stored_as"] in ("float_list", "int64_list"):
        # float_list holds float32: bfloat16/float16 are read as float32 and cast; int64_list likewise.
        return tf.cast(value, dtype) if value.dtype != dtype else value
    if spec["stored_as"] == "raw":
        return tf.reshape(tf.io.decode_raw(value, dtype), spec["shape"])
    image = tf.io.decode_image(value, channels=spec["shape"][-1] or 0, dtype=tf.uint8, expand_animations=False)
    return tf.ensure_shape(image, spec["shape"])


def parse_example(serialized):
    """One tf.train.Example -> (features, labels) with the declared shapes and dtypes."""
    parsed = tf.io.parse_single_example(serialized, _parse_config())
    features = _structure({name: _decode(s, parsed[s["key"]]) for name, s in FEATURES.items()})
    labels = _structure({name: _decode(s, parsed[s["key"]]) for name, s in LABELS.items()})
    return features, labels


def _host_shard(context):
    """(this input pipeline's index, number of pipelines): one pipeline per host under PER_HOST_V2."""
    if context is None:
        return 0, 1
    _, index, count, _ = context.current_input_fn_deployment()
    return int(index), int(count)


def make_input_fn(patterns, training):
    files = sorted({f for pattern in patterns for f in tf.io.gfile.glob(pattern)})
    if not files:
        raise SystemExit(f"no files match {patterns}")

    def input_fn(params):
        # params["batch_size"]: the per-host batch on a TPU (PER_HOST_V2), the global batch on CPU.
        autotune = tf.data.AUTOTUNE
        index, count = _host_shard(params.get("context"))
        dataset = tf.data.Dataset.from_tensor_slices(files)
        shard_files = count > 1 and len(files) >= count
        if shard_files:
            dataset = dataset.shard(count, index)
        if training:
            dataset = dataset.shuffle(len(files), reshuffle_each_iteration=True)
            if not CACHE:
                dataset = dataset.repeat()
        dataset = dataset.interleave(
            lambda f: tf.data.TFRecordDataset(f, compression_type=COMPRESSION, buffer_size=8 * 1024 * 1024),
            cycle_length=min(len(files), 16), num_parallel_calls=autotune, deterministic=not training)
        if count > 1 and not shard_files:
            dataset = dataset.shard(count, index)
        dataset = dataset.map(parse_example, num_parallel_calls=autotune, deterministic=not training)
        if SKIP_CORRUPT:
            dataset = dataset.apply(tf.data.experimental.ignore_errors(log_warning=True))
        if CACHE:
            dataset = dataset.cache()
            if training:
                dataset = dataset.repeat()
        if training and SHUFFLE_BUFFER > 0:
            dataset = dataset.shuffle(SHUFFLE_BUFFER)
        if not training and USE_TPU:
            dataset = dataset.repeat()  # running out of data mid-loop is an error on a TPU
        # drop_remainder: XLA needs static batch shapes.
        return dataset.batch(params["batch_size"], drop_remainder=True).prefetch(autotune)

    return input_fn


# ------------------------------------------------------------------------------------------ model_fn

_CROSSENTROPY = {"sparse_categorical_crossentropy": (tf.keras.losses.SparseCategoricalCrossentropy, "sparse"),
                 "categorical_crossentropy": (tf.keras.losses.CategoricalCrossentropy, "onehot"),
                 "binary_crossentropy": (tf.keras.losses.BinaryCrossentropy, "binary")}
_REGRESSION = {"mean_squared_error": tf.keras.losses.MeanSquaredError,
               "mean_absolute_error": tf.keras.losses.MeanAbsoluteError,
               "huber": tf.keras.losses.Huber}


def _outputs_are_probabilities(model):
    last = model.layers[-1] if getattr(model, "layers", None) else None
    if last is None:
        return False
    if isinstance(last, tf.keras.layers.Softmax):
        return True
    return getattr(getattr(last, "activation", None), "__name__", "") in ("softmax", "sigmoid")


def _head(model):
    """(kind, from_logits): kind is sparse/onehot/binary for classification, None for regression."""
    if LOSS in _CROSSENTROPY:
        return _CROSSENTROPY[LOSS][1], not _outputs_are_probabilities(model)
    if LOSS in _REGRESSION:
        return None, False
    return "shapes", not _outputs_are_probabilities(model)


def _single_loss(from_logits, labels, outputs):
    if custom_loss is not None:
        value = custom_loss(labels, outputs)
    elif LOSS in _CROSSENTROPY:
        value = _CROSSENTROPY[LOSS][0](from_logits=from_logits,
                                      reduction=tf.keras.losses.Reduction.SUM_OVER_BATCH_SIZE)(labels, outputs)
    else:
        value = _REGRESSION[LOSS](reduction=tf.keras.losses.Reduction.SUM_OVER_BATCH_SIZE)(labels, outputs)
    return tf.reduce_mean(tf.cast(value, tf.float32))


def compute_loss(from_logits, labels, outputs):
    """A custom loss sees the whole labels/outputs; a named loss is summed over dict heads."""
    if custom_loss is None and isinstance(labels, dict):
        return tf.add_n([_single_loss(from_logits, labels[k], outputs[k]) for k in sorted(labels)])
    return _single_loss(from_logits, labels, outputs)


def _classes(kind, from_logits, labels, outputs):
    extra_axis = outputs.shape.rank == labels.shape.rank + 1
    if kind == "binary" or (extra_axis and outputs.shape[-1] == 1):
        if extra_axis:
            outputs = tf.squeeze(outputs, -1)
        probabilities = tf.sigmoid(outputs) if from_logits else outputs
        truth = labels > 0.5 if labels.dtype.is_floating else labels
        return tf.cast(truth, tf.int32), tf.cast(probabilities > 0.5, tf.int32), probabilities, 2
    probabilities = tf.nn.softmax(outputs) if from_logits else outputs
    num_classes = int(outputs.shape[-1])
    if not extra_axis:
        labels = tf.squeeze(labels, -1) if kind == "sparse" else tf.argmax(labels, axis=-1, output_type=tf.int32)
    return tf.cast(labels, tf.int32), tf.argmax(outputs, axis=-1, output_type=tf.int32), probabilities, num_classes


def _one_metric(name, kind, from_logits, labels, outputs):
    m = tf.compat.v1.metrics
    if name in CUSTOM_METRICS:
        return CUSTOM_METRICS[name](labels, outputs)
    if name in ("mean_squared_error", "mean_absolute_error"):
        if outputs.shape.rank == labels.shape.rank + 1 and outputs.shape[-1] == 1:
            outputs = tf.squeeze(outputs, -1)
        fn = m.mean_squared_error if name == "mean_squared_error" else m.mean_absolute_error
        return fn(tf.cast(labels, tf.float32), outputs)
    truth, predicted, probabilities, num_classes = _classes(kind, from_logits, labels, outputs)
    binary = probabilities.shape.rank == truth.shape.rank
    if name == "accuracy":
        return m.accuracy(truth, predicted)
    if name == "mean_iou":
        return m.mean_iou(truth, predicted, num_classes)
    if name == "auc":
        return m.auc(truth, probabilities) if binary else m.auc(tf.one_hot(truth, num_classes), probabilities)
    fn = m.precision if name == "precision" else m.recall
    return fn(truth, predicted) if binary else fn(tf.one_hot(truth, num_classes), tf.one_hot(predicted, num_classes))


def _flatten(prefix, value):
    # The TPU outfeed handles int32 natively; int64 labels are narrowed.
    narrow = lambda t: tf.cast(t, tf.int32) if t.dtype == tf.int64 else t  # noqa: E731
    if isinstance(value, dict):
        return {f"{prefix}/{k}": narrow(v) for k, v in value.items()}
    return {prefix: narrow(value)}


def _unflatten(tensors, prefix):
    if prefix in tensors:
        return tensors[prefix]
    return {k[len(prefix) + 1:]: v for k, v in tensors.items() if k.startswith(prefix + "/")}


def make_metric_fn(kind, from_logits):
    def metric_fn(**tensors):
        labels, outputs = _unflatten(tensors, "label"), _unflatten(tensors, "output")
        results = {}
        for name in METRICS:
            key = CUSTOM_METRICS[name].__name__ if name in CUSTOM_METRICS else name
            if isinstance(labels, dict):
                for k in sorted(labels):
                    results[f"{k}/{key}"] = _one_metric(name, kind, from_logits, labels[k], outputs[k])
            else:
                results[key] = _one_metric(name, kind, from_logits, labels, outputs)
        return results

    return metric_fn


def make_host_call_fn(model_dir):
    """Runs on the host (outside the TPU loop): loss and learning rate as TensorBoard scalars."""

    def host_call_fn(global_step, loss, learning_rate):
        step = global_step[0]
        writer = tf.compat.v2.summary.create_file_writer(model_dir, max_queue=SUMMARY_STEPS)
        with writer.as_default(), tf.compat.v2.summary.record_if(tf.equal(step % SUMMARY_STEPS, 0)):
            tf.compat.v2.summary.scalar("train/loss", loss[0], step=step)
            tf.compat.v2.summary.scalar("train/learning_rate", learning_rate[0], step=step)
            return tf.compat.v1.summary.all_v2_summary_ops()

    return host_call_fn


def model_fn(features, labels, mode, params, config=None):
    del params  # batch size and context come from TPUEstimator; the model needs neither
    training = mode == tf.estimator.ModeKeys.TRAIN
    # Build the Keras model once per call, outside the TPU loop: its Input placeholders must not
    # land inside the compiled loop.
    with tf.init_scope():
        model = build_model(**BUILDER_KWARGS)
    outputs = model(features, training=training)
    outputs = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), outputs)
    if mode == tf.estimator.ModeKeys.PREDICT:
        predictions = outputs if isinstance(outputs, dict) else {"outputs": outputs}
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, predictions=predictions)

    kind, from_logits = _head(model)
    loss = compute_loss(from_logits, labels, outputs)
    extra = model.get_losses_for(None) + model.get_losses_for(features)  # regularizers
    if extra:
        loss = loss + tf.add_n([tf.cast(t, tf.float32) for t in extra])

    if mode == tf.estimator.ModeKeys.EVAL:
        eval_metrics = None
        if METRICS:
            eval_metrics = (make_metric_fn(kind, from_logits), {**_flatten("label", labels), **_flatten("output", outputs)})
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, eval_metrics=eval_metrics)

    optimizer = make_optimizer_class(learning_rate=LEARNING_RATE, **OPTIMIZER_ARGS)
    if tf.keras.mixed_precision.global_policy().name == "mixed_float16":
        optimizer = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(optimizer, "dynamic")
    if USE_TPU:
        # Sums the gradients over replicas; without it each replica trains on its own.
        optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    # Batch-norm moving statistics are update ops; without these dependencies they never move.
    updates = model.get_updates_for(None) + model.get_updates_for(features)
    with tf.control_dependencies(updates):
        train_op = optimizer.minimize(loss, global_step=global_step, var_list=model.trainable_variables)
    model_dir = config.model_dir if config is not None and config.model_dir else MODEL_DIR
    host_call = (make_host_call_fn(model_dir),
                 [tf.reshape(global_step, [1]), tf.reshape(loss, [1]),
                  tf.reshape(tf.constant(LEARNING_RATE, tf.float32), [1])])
    return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op, host_call=host_call)


# ------------------------------------------------------------------------------------------- running

def precision_policy():
    if PRECISION == "float32":
        return "float32"
    if PRECISION == "mixed_float16":
        return "mixed_float16"
    # bfloat16: native on a TPU and usable on a CPU; a GPU's fast half type is float16.
    if not USE_TPU and tf.config.list_physical_devices("GPU"):
        return "mixed_float16"
    return "mixed_bfloat16"


def make_estimator():
    tpu = tf.compat.v1.estimator.tpu
    tpu_config_args = {"iterations_per_loop": ITERATIONS_PER_LOOP}
    resolver = None
    if USE_TPU:
        from tensorflow.python.distribute.cluster_resolver import TPUClusterResolver

        resolver = TPUClusterResolver(tpu=TPU_NAME, zone=TPU_ZONE, project=TPU_PROJECT)
        # PER_HOST_V2: input_fn runs once per host (once per replica when a replica spans hosts);
        # the only mode that supports input_partition_dims.
        tpu_config_args["per_host_input_for_training"] = tpu.InputPipelineConfig.PER_HOST_V2
        if NUM_CORES_PER_REPLICA:
            tpu_config_args["num_cores_per_replica"] = NUM_CORES_PER_REPLICA
            tpu_config_args["input_partition_dims"] = INPUT_PARTITION_DIMS
    config = tpu.RunConfig(
        cluster=resolver,
        model_dir=MODEL_DIR,
        save_checkpoints_steps=SAVE_CHECKPOINTS_STEPS,
        keep_checkpoint_max=KEEP_CHECKPOINT_MAX,
        tf_random_seed=SEED,
        log_step_count_steps=LOG_EVERY_STEPS,
        save_summary_steps=LOG_EVERY_STEPS,
        tpu_config=tpu.TPUConfig(**tpu_config_args),
    )
    return tpu.TPUEstimator(
        model_fn=user_model_fn or model_fn,
        config=config,
        use_tpu=USE_TPU,
        train_batch_size=TRAIN_BATCH_SIZE,
        eval_batch_size=EVAL_BATCH_SIZE,
        predict_batch_size=None,
        eval_on_tpu=USE_TPU,
    )


def boundaries(start, steps, every):
    """Global steps to train to, one segment each; an evaluation follows each when `every` is set."""
    if not every:
        return [steps]
    return list(range((start // every + 1) * every, steps, every)) + [steps]


def main():
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    tf.keras.mixed_precision.set_global_policy(precision_policy())
    estimator = make_estimator()
    train_input = user_input_fn or (make_input_fn(TRAIN_FILES, training=True) if TRAIN_STEPS else None)
    eval_input = user_input_fn or (make_input_fn(EVAL_FILES, training=False) if EVAL_STEPS else None)
    checkpoint = tf.train.latest_checkpoint(MODEL_DIR)
    start = int(tf.train.load_variable(checkpoint, "global_step")) if checkpoint else 0
    for boundary in boundaries(start, TRAIN_STEPS, EVAL_EVERY_STEPS if eval_input else None):
        if boundary > start and train_input:
            estimator.train(train_input, max_steps=boundary)
        if eval_input and (EVAL_EVERY_STEPS or boundary == TRAIN_STEPS):
            print(estimator.evaluate(eval_input, steps=EVAL_STEPS))


if __name__ == "__main__":
    main()'''


__all__ = ["explain_script"]
