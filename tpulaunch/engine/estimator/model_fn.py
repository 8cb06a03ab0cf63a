"""One portable TPUEstimator `model_fn` built from a Keras builder.

The same function trains on a TPU slice (`use_tpu=True`) and on a CPU or GPU (`use_tpu=False`). It
follows the one pattern that is known to work for Keras inside TPUEstimator (see KERAS_TPU.md):

* the Keras model is built exactly once per `model_fn` call, inside `tf.init_scope()`, and called
  with `training=(mode == TRAIN)`;
* a v1 optimizer, wrapped in `CrossShardOptimizer` only on TPU, minimizes over
  `model.trainable_variables`, with the batch-norm update ops as control dependencies;
* eval metrics are `tf.compat.v1.metrics.*` inside `eval_metrics=(metric_fn, tensors)`;
* summaries go through `host_call` with `tf.compat.v2.summary`;
* outputs are cast to float32 before the loss (mixed precision computes in bf16/fp16).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence

import tensorflow as tf

from tpulaunch.engine.estimator.flags import apply_flags
from tpulaunch.engine.estimator.weights import builder_weights_scaffold_fn, download_error, download_failure
from tpulaunch.job.builder_args import builder_kwargs
from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.imports import resolve
from tpulaunch.job.schema import METRICS, OPTIMIZERS, Job

ModelFn = Callable[..., Any]

# Summaries are recorded every this many steps by default (writing one per step costs time on CPU).
DEFAULT_SUMMARY_STEPS = 100

_V1_OPTIMIZERS = {
    "sgd": tf.compat.v1.train.GradientDescentOptimizer,
    "momentum": tf.compat.v1.train.MomentumOptimizer,
    "adam": tf.compat.v1.train.AdamOptimizer,
    "adagrad": tf.compat.v1.train.AdagradOptimizer,
    "rmsprop": tf.compat.v1.train.RMSPropOptimizer,
}
assert set(_V1_OPTIMIZERS) == set(OPTIMIZERS)

# MomentumOptimizer has no default momentum; 0.9 is what nearly every reference model uses.
_OPTIMIZER_DEFAULTS = {"momentum": {"momentum": 0.9}}

_CROSSENTROPY = {
    "sparse_categorical_crossentropy": (tf.keras.losses.SparseCategoricalCrossentropy, "sparse"),
    "categorical_crossentropy": (tf.keras.losses.CategoricalCrossentropy, "onehot"),
    "binary_crossentropy": (tf.keras.losses.BinaryCrossentropy, "binary"),
}
_REGRESSION = {
    "mean_squared_error": tf.keras.losses.MeanSquaredError,
    "mean_absolute_error": tf.keras.losses.MeanAbsoluteError,
    "huber": tf.keras.losses.Huber,
}


# ------------------------------------------------------------------------------------------ precision

_policy_in_effect: Optional[str] = None


def policy_name(precision: str, *, use_tpu: bool, has_gpu: Optional[bool] = None) -> str:
    """The Keras mixed-precision policy for the job's `model.precision` on this device.

    `bfloat16` means mixed_bfloat16 on a TPU and on a CPU, and mixed_float16 on a GPU (where fp16
    is the fast half-precision type).
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


def apply_precision(precision: str, *, use_tpu: bool) -> str:
    """Set the process-wide Keras policy for this job (only when it changes) and return its name."""
    global _policy_in_effect
    name = policy_name(precision, use_tpu=use_tpu)
    if name != _policy_in_effect:
        tf.keras.mixed_precision.set_global_policy(name)
        _policy_in_effect = name
    return name


# ------------------------------------------------------------------------------------------ optimizer

def make_optimizer_factory(job: Job, *, search_path: Sequence[str] = ()) -> Callable[[], Any]:
    """A function returning a fresh v1 optimizer for the job (one per graph).

    The optimizer is built once here so that a wrong name or argument fails before training starts.

    Raises:
        TpuLaunchError: unknown name, bad arguments, or an import path that does not return a
            `tf.compat.v1.train.Optimizer` (Keras optimizers silently do not train in this graph).
    """
    spec = job.model.optimizer
    if ":" in spec.name:
        make = resolve(spec.name, search_path=search_path, what="optimizer")
        kwargs = dict(spec.args)
    elif spec.name in _V1_OPTIMIZERS:
        make = _V1_OPTIMIZERS[spec.name]
        kwargs = {**_OPTIMIZER_DEFAULTS.get(spec.name, {}), **spec.args}
    else:
        raise TpuLaunchError(f"unknown optimizer {spec.name!r}",
                             hint=f"one of {', '.join(OPTIMIZERS)}, or an import path 'pkg.mod:make' returning a "
                                  "tf.compat.v1.train.Optimizer")

    def factory():
        try:
            optimizer = make(learning_rate=spec.learning_rate, **kwargs)
        except TypeError as exc:
            raise TpuLaunchError(f"optimizer {spec.name!r} rejected its arguments: {exc}",
                                 hint="check model.optimizer.args against the optimizer's constructor") from None
        if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
            raise TpuLaunchError(
                f"optimizer {spec.name!r} returned {type(optimizer).__name__}, not a tf.compat.v1.train.Optimizer",
                hint="TPUEstimator needs a v1 optimizer (tf.compat.v1.train.AdamOptimizer, ...); a Keras optimizer "
                     "does not update the weights in this graph")
        return optimizer

    factory()
    return factory


# ----------------------------------------------------------------------------------------------- loss

def _outputs_are_probabilities(model) -> bool:
    """Whether the model ends in softmax/sigmoid (so crossentropy must not apply it again)."""
    last = model.layers[-1] if getattr(model, "layers", None) else None
    if last is None:
        return False
    if isinstance(last, tf.keras.layers.Softmax):
        return True
    activation = getattr(last, "activation", None)
    name = getattr(activation, "__name__", "")
    return name in ("softmax", "sigmoid")


@dataclass(frozen=True)
class Head:
    """How outputs relate to labels: the loss, and what class predictions mean for the metrics."""

    loss_name: str
    kind: Optional[str]  # "sparse" | "onehot" | "binary" for classification, None for regression
    from_logits: bool


def _single_loss(head: Head, labels, outputs, custom: Optional[Callable]):
    if custom is not None:
        value = custom(labels, outputs)
    elif head.loss_name in _CROSSENTROPY:
        cls = _CROSSENTROPY[head.loss_name][0]
        value = cls(from_logits=head.from_logits, reduction=tf.keras.losses.Reduction.SUM_OVER_BATCH_SIZE)(labels, outputs)
    else:
        value = _REGRESSION[head.loss_name](reduction=tf.keras.losses.Reduction.SUM_OVER_BATCH_SIZE)(labels, outputs)
    # Reduce whatever came back to one float32 scalar (a custom loss may return per-example values).
    return tf.reduce_mean(tf.cast(value, tf.float32))


def compute_loss(head: Head, labels, outputs, custom: Optional[Callable] = None):
    """The scalar float32 loss.

    A custom loss (an import path) is called once with the whole labels and outputs, dicts included:
    it defines how its heads pair up (RetinaNet's {cls_targets, box_targets} against
    {cls_logits, box_regression}). A named loss needs dict outputs keyed like dict labels, and the
    per-key losses are summed.
    """
    if custom is not None:
        return _single_loss(head, labels, outputs, custom)
    if isinstance(labels, dict) != isinstance(outputs, dict):
        raise TpuLaunchError(
            f"the model returns {_describe(outputs)} but the job declares {_describe(labels)} as labels",
            hint="return a dict of outputs keyed like data.labels, or give model.loss as an import path fn(labels, outputs)")
    if isinstance(labels, dict):
        if sorted(labels) != sorted(outputs):
            raise TpuLaunchError(f"the model's outputs {sorted(outputs)} do not match the labels {sorted(labels)}",
                                 hint="key the model's outputs by the names in data.labels")
        return tf.add_n([_single_loss(head, labels[k], outputs[k], custom) for k in sorted(labels)])
    return _single_loss(head, labels, outputs, custom)


def _describe(value) -> str:
    if value is None:
        return "no tensor"
    if isinstance(value, dict):
        return f"a dict {sorted(value)}"
    return "one tensor"


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


def _one_metric(name: str, head: Head, labels, outputs, custom: Optional[Callable]):
    m = tf.compat.v1.metrics
    if custom is not None:
        return custom(labels, outputs)
    if name in ("mean_squared_error", "mean_absolute_error"):
        fn = m.mean_squared_error if name == "mean_squared_error" else m.mean_absolute_error
        return fn(*_values_like_labels(labels, outputs))
    if head.kind is None:
        raise TpuLaunchError(f"metric {name!r} needs a classification loss; model.loss is {head.loss_name!r}",
                             hint="use mean_squared_error or mean_absolute_error, or a crossentropy loss")
    truth, predicted, probabilities, num_classes = _classes(head, labels, outputs)
    if name == "accuracy":
        return m.accuracy(truth, predicted)
    if name == "mean_iou":
        return m.mean_iou(truth, predicted, num_classes)
    binary = probabilities.shape.rank == truth.shape.rank
    if name == "auc":
        if binary:
            return m.auc(truth, probabilities)
        return m.auc(tf.one_hot(truth, num_classes), probabilities)  # micro-averaged over classes
    if name in ("precision", "recall"):
        fn = m.precision if name == "precision" else m.recall
        if binary:
            return fn(truth, predicted)
        return fn(tf.one_hot(truth, num_classes), tf.one_hot(predicted, num_classes))  # micro-averaged
    raise TpuLaunchError(f"unknown metric {name!r}", hint=f"one of {', '.join(METRICS)}, or an import path")


def make_metric_fn(head: Head, metric_names: Sequence[str], custom_metrics: Dict[str, Callable]):
    """`metric_fn(**tensors)` for `eval_metrics`; tensors are flat: 'label' / 'label/<k>', 'output' / 'output/<k>'."""

    def metric_fn(**tensors):
        labels = _unflatten(tensors, "label")
        outputs = _unflatten(tensors, "output")
        results = {}
        for name in metric_names:
            custom = custom_metrics.get(name)
            key = custom.__name__ if custom is not None else name
            if isinstance(labels, dict):
                for k in sorted(labels):
                    results[f"{k}/{key}"] = _one_metric(name, head, labels[k], outputs[k], custom)
            else:
                results[key] = _one_metric(name, head, labels, outputs, custom)
        return results

    return metric_fn


def _flatten(prefix: str, value) -> dict:
    if isinstance(value, dict):
        return {f"{prefix}/{k}": _tpu_friendly(v) for k, v in value.items()}
    return {prefix: _tpu_friendly(value)}


def _tpu_friendly(tensor):
    # The TPU outfeed handles int32 natively; int64 labels are narrowed.
    return tf.cast(tensor, tf.int32) if tensor.dtype == tf.int64 else tensor


def _unflatten(tensors: dict, prefix: str):
    if prefix in tensors:
        return tensors[prefix]
    return {k[len(prefix) + 1:]: v for k, v in tensors.items() if k.startswith(prefix + "/")}


# ------------------------------------------------------------------------------------------- model_fn

def _head(job: Job, model) -> Head:
    loss = job.model.loss
    if loss in _CROSSENTROPY:
        return Head(loss, _CROSSENTROPY[loss][1], not _outputs_are_probabilities(model))
    if loss in _REGRESSION:
        return Head(loss, None, False)
    # An import-path loss: metrics infer classes from the shapes.
    return Head(loss, "shapes", not _outputs_are_probabilities(model))


def make_model_fn(job: Job, *, use_tpu: bool, search_path: Sequence[str] = ()) -> ModelFn:
    """The TPUEstimator model_fn for `job`: `model_fn(features, labels, mode, params, config=None)`.

    Args:
        job: the validated job.
        use_tpu: build for a TPU (CrossShardOptimizer) or for CPU/GPU.
        search_path: directories tried before PYTHONPATH for the job's import paths (the job
            file's directory, so model code next to the YAML file imports as is).

    Returns:
        The model_fn. With `model.model_fn` set it is the user's own, unchanged (TPUEstimator hands it
        `model.params`, see params.py). Either way the job's `flags:` are set first.

    Raises:
        TpuLaunchError: an import path that cannot be resolved, an unknown optimizer or loss, a flag
            that the job's modules do not define or that does not take its value.
    """
    spec = job.model
    apply_flags(job, search_path=search_path)
    if spec.model_fn:
        return resolve(spec.model_fn, search_path=search_path, what="model_fn")
    builder = resolve(spec.builder, search_path=search_path, what="model builder")
    custom_loss = resolve(spec.loss, search_path=search_path, what="loss") if ":" in spec.loss else None
    custom_metrics = {name: resolve(name, search_path=search_path, what="metric") for name in spec.metrics if ":" in name}
    make_optimizer = make_optimizer_factory(job, search_path=search_path)
    policy = apply_precision(spec.precision, use_tpu=use_tpu)
    kwargs = builder_kwargs(builder, spec.params, job.data.features)
    learning_rate = spec.optimizer.learning_rate
    summary_steps = job.run.log_every_steps or DEFAULT_SUMMARY_STEPS

    def build_model():
        try:
            model = builder(**kwargs)
        except TypeError as exc:
            raise TpuLaunchError(f"model builder {spec.builder!r} rejected its arguments: {exc}",
                                 hint="check model.params against the builder's signature") from None
        except Exception as exc:  # pylint: disable=broad-except  # only a failed download is explained here
            failure = download_failure(exc)
            if failure is None:
                raise
            message, hint = download_error(spec.builder, failure)
            raise TpuLaunchError(message, hint=hint) from exc
        if not isinstance(model, tf.keras.Model):
            raise TpuLaunchError(f"model builder {spec.builder!r} returned {type(model).__name__}, not a tf.keras.Model")
        return model

    def model_fn(features, labels, mode, params, config=None):
        del params  # batch size and context come from TPUEstimator; the model needs neither
        training = mode == tf.estimator.ModeKeys.TRAIN
        # Outside any TPU loop or control-flow context: the Keras Input placeholders must not land
        # inside the compiled loop, and one build per call keeps train/eval/resume variables identical.
        with tf.init_scope():
            model = build_model()
        outputs = model(features, training=training)
        outputs = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), outputs)

        if mode == tf.estimator.ModeKeys.PREDICT:
            predictions = outputs if isinstance(outputs, dict) else {"outputs": outputs}
            return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, predictions=predictions)

        head = _head(job, model)
        loss = compute_loss(head, labels, outputs, custom_loss)
        extra = model.get_losses_for(None) + model.get_losses_for(features)  # regularizers
        if extra:
            loss = loss + tf.add_n([tf.cast(t, tf.float32) for t in extra])

        if mode == tf.estimator.ModeKeys.EVAL:
            eval_metrics = None
            if spec.metrics:
                tensors = {**_flatten("label", labels), **_flatten("output", outputs)}
                eval_metrics = (make_metric_fn(head, spec.metrics, custom_metrics), tensors)
            return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, eval_metrics=eval_metrics)

        optimizer = make_optimizer()
        if policy == "mixed_float16":
            optimizer = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(optimizer, "dynamic")
        if use_tpu:
            optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        # Batch-norm moving statistics are update ops; without these dependencies they never move.
        updates = model.get_updates_for(None) + model.get_updates_for(features)
        with tf.control_dependencies(updates):
            train_op = optimizer.minimize(loss, global_step=global_step, var_list=model.trainable_variables)
        model_dir = config.model_dir if config is not None and config.model_dir else job.run.model_dir
        host_call = (_summary_fn(model_dir, summary_steps),
                     [tf.reshape(global_step, [1]), tf.reshape(loss, [1]),
                      tf.reshape(tf.constant(learning_rate, tf.float32), [1])])
        # What the builder returned (weights it loaded included) is what a fresh run starts from.
        scaffold_fn = builder_weights_scaffold_fn(build_model, model, seed=job.run.seed, warm_start=job.run.warm_start)
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op, host_call=host_call,
                                                           scaffold_fn=scaffold_fn)

    return model_fn


def _summary_fn(model_dir: str, every_steps: int):
    """host_call body: loss and learning rate as TensorBoard scalars, every `every_steps` steps."""

    def host_call_fn(global_step, loss, learning_rate):
        step = global_step[0]
        writer = tf.compat.v2.summary.create_file_writer(model_dir, max_queue=every_steps)
        with writer.as_default(), tf.compat.v2.summary.record_if(tf.equal(step % every_steps, 0)):
            tf.compat.v2.summary.scalar("train/loss", loss[0], step=step)
            tf.compat.v2.summary.scalar("train/learning_rate", learning_rate[0], step=step)
            return tf.compat.v1.summary.all_v2_summary_ops()

    return host_call_fn
