"""The strategy, training step, evaluation and checkpoints that `tpulaunch train` runs on the keras engine.

Keras with tf.distribute, on TensorFlow 2.16 and later: a builder's model is trained in the Keras it is
written with (`portable.keras_of`), tf-keras (Keras 2) or Keras 3, whose optimizer, metrics, losses and
precision policy are then that Keras's; nothing here needs the other Keras installed. A model as Keras
users write it trains as fit() would train it: one the builder compile()d keeps its compile for what
the job does not set (the job's loss, optimizer and metrics replace the rest, as a second compile()
would), and a model with its own train_step, test_step or compute_loss, or a compiled one the job gives
no loss, runs Keras's own step (the model's train_step and test_step) in each replica. This module
imports only TensorFlow, the Python standard library and `engine/portable.py` (the input pipeline,
precision, heads and losses the engines share), and takes plain values plus the job's own callables.
tpulaunch calls it with values converted from the job file (engine/keras/plain.py), and
`tpulaunch explain` prints portable.py and then this module verbatim inside the standalone program
(without the import of portable's names below, which the program defines above it).

The strategy comes from the job and the machine (`make_strategy`): TPUStrategy on a TPU slice, with
a device assignment when a replica spans several cores (spatial partitioning), MultiWorkerMirrored
when TF_CONFIG names several workers, Mirrored over several local GPUs, else the default strategy.
The input pipeline is the same `make_dataset_fn` every engine runs, called once per input pipeline by
`distribute_datasets_from_function` with the per-replica batch. Checkpoints are object-based
(`tf.train.CheckpointManager`), named `model.ckpt-STEP` in the model directory.
"""

import json
import os
import re
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import tensorflow as tf

from tpulaunch.engine.portable import (  # explain: the program defines these above this module
    _CROSSENTROPY, _REGRESSION, Head, SpecError, _classes, _losses_by_label, _output_kind, _predictions,
    _described, _values_like_labels, checkpoint_class, checkpoint_manager_class, compile_with_job, compiled_with,
    compute_loss, head_for, imported_kerases, is_keras3, keras_base, keras_of, metrics_by_label, no_evaluation_batches,
    outputs_by_label, own_fit_methods, pair_heads, probabilities_of)

CHECKPOINT_NAME = "model.ckpt"  # checkpoints are model_dir/model.ckpt-STEP, as TPUEstimator names them


# ------------------------------------------------------------------------------------------ strategy

def annotate_for_logical_devices(strategy, tensors, dims_by_name: Optional[Dict[str, Optional[list]]]):
    """`tensors` (one tensor or a dict) annotated for the replica's logical devices (TPU spatial partitioning);
    call inside the replica step.

    Per tensor name: None leaves it as it is (XLA's sharding propagation places it: the job's
    "replicated"); dims split it with `experimental_split_to_logical_devices` (batch axis first); dims
    whose product is 1 are TensorFlow's "logical device 0 only" (`experimental_assign_to_logical_device`),
    as a job's `[1]` means. A single tensor takes the dims of its only name.
    """
    if tensors is None or not dims_by_name:
        return tensors
    if not isinstance(tensors, dict):
        if len(dims_by_name) != 1:
            raise SpecError(f"a single tensor, but partition dims for {sorted(dims_by_name)}",
                            hint="give the dims of its one name", key=("partition",))
        return _annotated(strategy, tensors, next(iter(dims_by_name.values())))
    return {name: _annotated(strategy, tensor, dims_by_name.get(name)) for name, tensor in tensors.items()}


def _annotated(strategy, tensor, dims):
    if dims is None:
        return tensor
    if _product(dims) == 1:
        return strategy.experimental_assign_to_logical_device(tensor, 0)
    return strategy.experimental_split_to_logical_devices(tensor, list(dims))


def workers_in(tf_config: Optional[str]) -> int:
    """How many workers (chief included) the TF_CONFIG cluster names; 0 without one."""
    if not tf_config:
        return 0
    cluster = json.loads(tf_config).get("cluster", {})
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def make_strategy(*, use_tpu: bool, cluster_resolver=None, computation_shape: Optional[List[int]] = None,
                  num_replicas: Optional[int] = None, cpu_replicas: Optional[int] = None):
    """The tf.distribute strategy for this job on this machine.

    On a TPU: TPUStrategy; when a replica spans several cores (`computation_shape` covers more than one
    core) with a DeviceAssignment built from the slice's topology for `num_replicas` replicas. Else
    MultiWorkerMirroredStrategy when $TF_CONFIG names several workers, MirroredStrategy when this
    machine has several GPUs (or over `cpu_replicas` logical devices this CPU is split into, when
    given: before TensorFlow's runtime starts), and TensorFlow's default strategy (one device) otherwise.
    """
    if use_tpu:
        if cluster_resolver.master() not in ("", "local"):  # a TPU VM's own TPU needs no remote connection
            tf.config.experimental_connect_to_cluster(cluster_resolver)
        topology = tf.tpu.experimental.initialize_tpu_system(cluster_resolver)
        assignment = None
        if computation_shape and _product(computation_shape) > 1:
            assignment = tf.tpu.experimental.DeviceAssignment.build(
                topology, computation_shape=computation_shape, num_replicas=num_replicas)
        return tf.distribute.TPUStrategy(cluster_resolver, experimental_device_assignment=assignment)
    if workers_in(os.environ.get("TF_CONFIG")) > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    if cpu_replicas and cpu_replicas > 1:
        (cpu,) = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * cpu_replicas)
        return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(cpu_replicas)])
    if len(tf.config.list_logical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def _product(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


def is_chief(strategy) -> bool:
    """Whether this process writes the model directory (under MultiWorkerMirrored only the chief's saves count)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    return task_type == "chief" or (task_type == "worker" and task_id == 0
                                    and "chief" not in resolver.cluster_spec().as_dict())


def worker_scratch_dir(model_dir: str, task_type: str, task_id: int) -> str:
    """Where a non-chief worker's checkpoints go (every worker takes part in a save; the chief's is kept)."""
    return os.path.join(model_dir, f"worker-{task_type}-{task_id}-scratch")


def distributed_dataset(strategy, make_dataset: Callable, global_batch_size: int,
                        preprocess: Optional[Callable] = None, skip_steps: int = 0):
    """`make_dataset` (`portable.make_dataset_fn`'s dataset_fn) called once per input pipeline (one per worker or
    TPU host) with the per-replica batch, distributed over the replicas; each pipeline reads its own share
    (`shard_index` of `shard_count`), after what its replicas trained on in `skip_steps` steps (a resumed
    training's step): a batch per replica a step. `preprocess(features, labels)` (KerasTraining.preprocess), where
    given, maps each batch on the host, as a KerasHub task's fit() maps its preprocessor over the data."""

    def dataset_fn(context):
        replicas = context.num_replicas_in_sync // context.num_input_pipelines  # this pipeline's
        dataset = make_dataset(context.get_per_replica_batch_size(global_batch_size),
                               shard_index=context.input_pipeline_id, shard_count=context.num_input_pipelines,
                               skip_batches=skip_steps * replicas)
        if preprocess is None:
            return dataset
        return dataset.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    return strategy.distribute_datasets_from_function(dataset_fn)


# ------------------------------------------------------------------------------------------ optimizer

# The estimator engine's optimizer names, as Keras optimizers; `momentum` is SGD with momentum.
KERAS_OPTIMIZERS = {
    "sgd": ("SGD", {}),
    "momentum": ("SGD", {"momentum": 0.9}),
    "adam": ("Adam", {}),
    "adagrad": ("Adagrad", {}),
    "rmsprop": ("RMSprop", {}),
}


def keras_optimizer_factory(optimizer: str, learning_rate: float, optimizer_args: dict,
                            make: Optional[Callable] = None) -> Callable:
    """A function `factory(keras)` returning a fresh optimizer of `keras` (the model's Keras: a Keras 3 model's
    variables take only a Keras 3 optimizer): `make` (the job's own constructor) with `optimizer_args`, else the
    optimizer KERAS_OPTIMIZERS names, its defaults under `optimizer_args`."""
    args = dict(optimizer_args)
    if make is None:
        class_name, defaults = KERAS_OPTIMIZERS[optimizer]
        args = {**defaults, **args}

    def factory(keras):
        made = make or getattr(keras.optimizers, class_name)
        return made(learning_rate=learning_rate, **args)

    return factory


def set_random_seed(seed: int) -> None:
    """Python's, NumPy's and TensorFlow's seeds, and each imported Keras's own (Keras 3 keeps a seed generator)."""
    for keras in imported_kerases():
        keras.utils.set_random_seed(seed)
    tf.random.set_seed(seed)


# -------------------------------------------------------------------------------------------- metrics

def fresh_keras_metric(custom) -> Optional[Any]:
    """A new Metric object made like `custom` (a Keras Metric class, made with no arguments, or object, copied by its
    config so that its variables are made in the strategy's scope); None when `custom` is no Keras Metric."""
    kind = keras_base(custom, "metrics", "Metric")
    if kind is None:
        return None
    if isinstance(custom, type):
        try:
            return custom()
        except TypeError as exc:
            raise SpecError(f"metric {custom.__name__!r}: the Keras metric class cannot be made without arguments: "
                            f"{exc}", hint="give the import path of a metric object made with its arguments "
                                           "(f1 = keras.metrics.F1Score(average='micro') in its module)",
                            key=("model", "metrics")) from None
    return type(custom).from_config(custom.get_config())


def _metric_key(name: str, custom) -> str:
    """A metric's result name: a built-in's name, a Keras Metric's own name, a function's name."""
    if custom is None:
        return name
    if keras_base(custom, "metrics", "Metric") is None:
        return custom.__name__
    if not isinstance(custom, type):
        return custom.name
    # A class's name in snake case, as Keras names its instances (before it numbers a second one 'auc_1').
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", custom.__name__)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()


def _keras_metric(name: str, head: Head, num_classes: int, custom: Optional[Callable], keras):
    """The metric object of `keras` (the model's Keras) for one metric of one head (streaming, summed over
    replicas)."""
    if custom is not None:
        return fresh_keras_metric(custom) or keras.metrics.Mean(name=custom.__name__)
    if name == "mean_squared_error":
        return keras.metrics.MeanSquaredError()
    if name == "mean_absolute_error":
        return keras.metrics.MeanAbsoluteError()
    if head.kind is None:
        raise SpecError(f"metric {name!r} needs a classification loss; model.loss is {head.loss_name!r}",
                        hint="use mean_squared_error or mean_absolute_error, or a crossentropy loss")
    made = {"accuracy": lambda: keras.metrics.Accuracy(), "mean_iou": lambda: keras.metrics.MeanIoU(num_classes),
            "auc": lambda: keras.metrics.AUC(), "precision": lambda: keras.metrics.Precision(),
            "recall": lambda: keras.metrics.Recall()}
    if name not in made:
        raise SpecError(f"unknown metric {name!r}", hint="use a metric name model.metrics accepts, or an import path")
    return made[name]()


def _update_metric(metric, name: str, head: Head, labels, outputs, custom: Optional[Callable]):
    """Feed one batch to `metric`, with the same class and value readings as the estimator engine's metrics; a Keras
    Metric of the job's gets the labels and the model's outputs, as compile()'s metrics get them."""
    if custom is not None and keras_base(custom, "metrics", "Metric") is not None:
        return metric.update_state(labels, outputs)
    if custom is not None:
        value = custom(labels, outputs)
        if isinstance(value, (tuple, list)):
            raise SpecError(f"metric {custom.__name__!r} returned {len(value)} values (a TensorFlow 1 metric's "
                            "(value, update_op)?); the keras engine averages one tensor per batch",
                            hint="return the metric's value for the batch, fn(labels, outputs) -> tensor",
                            key=("model", "metrics"))
        return metric.update_state(value)
    if name in ("mean_squared_error", "mean_absolute_error"):
        return metric.update_state(*_values_like_labels(labels, outputs))
    truth, predicted, probabilities, num_classes = _classes(head, labels, outputs)
    if name in ("accuracy", "mean_iou"):
        return metric.update_state(truth, predicted)
    binary = probabilities.shape.rank == truth.shape.rank
    if name == "auc":
        return metric.update_state(truth, probabilities) if binary else metric.update_state(
            tf.one_hot(truth, num_classes), probabilities)  # micro-averaged over classes
    if binary:  # precision, recall
        return metric.update_state(truth, predicted)
    return metric.update_state(tf.one_hot(truth, num_classes), tf.one_hot(predicted, num_classes))  # micro-averaged


# ---------------------------------------------------------------------------------------------- model

def _shape_tree(specs: Dict[str, dict], batch: Optional[int]):
    """The features' shapes with a batch dim, in the structure the input pipeline yields (portable._structure)."""
    shapes = {name: [batch, *spec["shape"]] for name, spec in specs.items()}
    return next(iter(shapes.values())) if len(shapes) == 1 else shapes


def _tensor_specs(specs: Dict[str, dict], batch: Optional[int]):
    tree = {name: tf.TensorSpec([batch, *spec["shape"]], tf.as_dtype(spec["dtype"]), name=name)
            for name, spec in specs.items()}
    return next(iter(tree.values())) if len(tree) == 1 else tree


def _zeros(specs):
    return tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), specs)


def fresh_keras_loss(custom):
    """The job's own loss as compile() takes it: a Keras Loss class made with no arguments; an object or a function
    as it is."""
    if isinstance(custom, type) and keras_base(custom, "losses", "Loss") is not None:
        try:
            return custom()
        except TypeError as exc:
            raise SpecError(f"loss {custom.__name__!r}: the Keras loss class cannot be made without arguments: {exc}",
                            hint="give the import path of a loss object made with its arguments "
                                 "(my_loss = MyLoss(...) in its module)", key=("model", "loss")) from None
    return custom


def _scales_loss(optimizer) -> bool:
    """Whether `optimizer` is already a LossScaleOptimizer (a compiled model's, under mixed_float16)."""
    return any("LossScaleOptimizer" in cls.__name__ for cls in type(optimizer).__mro__)


def _fit_preprocessing(model) -> Optional[Callable]:
    """What a KerasHub task's fit() and evaluate() map over each batch before its steps see it (its preprocess_samples:
    the task's preprocessor, e.g. an image converter that resizes and rescales), or None: its train_step and the
    model's call take preprocessed batches."""
    if getattr(model, "preprocessor", None) is None:
        return None
    return getattr(model, "preprocess_samples", None)


def _progress_loss(logs):
    """The loss a progress line shows from what a model's train_step returned: its 'loss', else its first value."""
    if isinstance(logs, dict):
        value = logs["loss"] if "loss" in logs else (logs[sorted(logs)[0]] if logs else tf.constant(0.0))
    else:
        value = logs
    return tf.reduce_mean(tf.cast(value, tf.float32))


def _flat_logs(logs: dict) -> dict:
    """A test_step's logs with nested dicts (Keras 3's compile_metrics) merged into the top level, as Keras's
    get_metrics_result() gives them."""
    out = {}
    for key, value in logs.items():
        out.update(_flat_logs(value) if isinstance(value, dict) else {key: value})
    return out


def _plain_results(results: dict) -> dict:
    """Metric results as floats; a metric with several values (F1Score per class) as 'name[i]' each."""
    out = {}
    for key, value in results.items():
        values = [float(v) for v in tf.reshape(tf.convert_to_tensor(value), [-1]).numpy()]
        if len(values) == 1:
            out[key] = values[0]
        else:
            out.update({f"{key}[{i}]": v for i, v in enumerate(values)})
    return out


class StepsForJax(TypeError):
    """The model overrides train_step or test_step as Keras 3 calls them on JAX (`step(self, state, data)`, a
    function of the state); on TensorFlow Keras calls `step(self, data)`."""


def own_steps_for_jax(model, own_methods: List[str]) -> List[str]:
    """The model's own train_step / test_step written for Keras 3 on JAX: they take the state before the batch."""
    import inspect

    found = []
    for name in ("train_step", "test_step"):
        if name not in own_methods:
            continue
        parameters = [p for p in inspect.signature(getattr(type(model), name)).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(parameters) >= 3:  # (self, state, data)
            found.append(name)
    return found


class KerasTraining:
    """The job's model, optimizer and global step under a strategy, their checkpoints, and the compiled
    training and evaluation steps.

    The model is built by the job's builder inside `strategy.scope()`, so the weights it gives the
    model (loaded ones included) are what training starts from. Each replica's loss is the mean over
    its batch divided by the replicas in sync, so that the gradients the optimizer sums over the
    replicas are those of the global batch's mean.

    Args:
        builder, builder_kwargs: the job's Keras builder and its arguments (a tf-keras or a Keras 3 model).
        strategy: from `make_strategy`.
        policy: the Keras precision policy (portable.policy_name), set in the model's Keras.
        loss, metrics, labels, custom_loss, custom_losses, custom_metrics: as for the estimator
            engine's model_fn: loss names or import paths, per label or for all; metric names or
            import paths, a list (each applied to the heads it fits) or per label.
        features: the feature specs (as for make_dataset_fn): the shapes a lazily built model is built for.
        make_optimizer: `make_optimizer(keras)` returns an optimizer of the model's Keras (keras_optimizer_factory).
        model_dir, keep_checkpoint_max, save_checkpoints_steps: where and how often to checkpoint.
        write_through: each checkpoint is written by `write_through(write, prefix)`, `write(any_prefix)` writing
            it (tpulaunch: under a staging prefix, moved to `prefix` while the run holds model_dir's lease).
        fence: called before each write of the checkpoint state and each deletion of old checkpoints; raises when
            this run may no longer write there (tpulaunch: model_dir's lease was taken over).
        feature_dims, label_dims: per tensor name, the dims to split it into over the logical devices
            of a replica (TPU spatial partitioning); None or a missing name: not split.
        outputs: what each label's output holds, "logits" or "probabilities", where the job declares it.
        given: which of "loss", "optimizer" and "metrics" the job sets (default: all). A model the builder
            compile()d keeps its own compile's others; the job's replace its own, as a second compile() would.

    Which step trains (`own_step`): the engine's own (the job's loss and metrics, as for any model), unless the
    model brings its own train_step, test_step or compute_loss, or it was compiled and the job sets no loss: then
    Keras's step, the model's train_step and test_step, runs in each replica as fit() runs it, with the model's
    compile (and what the job replaces of it). `compile_note` says, in one line, what came from where.
    """

    def __init__(self, builder: Callable, builder_kwargs: dict, *, strategy, policy: str, loss, metrics,
                 labels: Dict[str, dict], features: Dict[str, dict], make_optimizer: Callable, model_dir: str,
                 keep_checkpoint_max: int, save_checkpoints_steps: int, custom_loss: Optional[Callable] = None,
                 custom_losses: Optional[Dict[str, Callable]] = None,
                 custom_metrics: Optional[Dict[str, Callable]] = None,
                 feature_dims: Optional[Dict[str, Optional[list]]] = None,
                 label_dims: Optional[Dict[str, Optional[list]]] = None,
                 outputs: Optional[Dict[str, str]] = None, given: Optional[List[str]] = None,
                 write_through: Optional[Callable[[Callable[[str], Any], str], str]] = None,
                 fence: Optional[Callable[[], None]] = None):
        self.strategy = strategy
        self.policy = policy
        self.loss = loss
        self.metrics = metrics
        self.label_names = list(labels or {})
        self.labels = dict(labels or {})
        self.features = dict(features)
        self.custom_loss = custom_loss if not isinstance(loss, dict) else None
        self.custom_losses = dict(custom_losses or {})
        self.custom_metrics = dict(custom_metrics or {})
        self.loss_names = _losses_by_label(loss, self.label_names)
        self.declared_outputs = dict(outputs or {})
        self.feature_dims = dict(feature_dims or {})
        self.label_dims = dict(label_dims or {})
        self.given = set(("loss", "optimizer", "metrics") if given is None else given)
        self.compile_note: Optional[str] = None
        with strategy.scope():
            self.model = builder(**builder_kwargs)
            self.keras = keras_of(self.model)
            self.keras3 = is_keras3(self.keras)
            if self.keras.mixed_precision.global_policy().name != policy:  # a Keras the builder imported only now
                self.keras.mixed_precision.set_global_policy(policy)
                self.model = builder(**builder_kwargs)  # its layers made again, under the policy
            if not self.model.built:  # subclassed, or Sequential without an Input: weights come with a build
                if self.keras3:  # Keras 3's build() makes no weights for a model without its own: a call does
                    self.model(_zeros(_tensor_specs(self.features, 1)), training=False)
                else:
                    self.model.build(_shape_tree(self.features, None))
            self.output_names = list(getattr(self.model, "output_names", None) or ())
            self.preprocess = _fit_preprocessing(self.model)
            self.compiled = compiled_with(self.model)
            self.own_methods = own_fit_methods(self.model)
            jax_steps = own_steps_for_jax(self.model, self.own_methods)
            if jax_steps:
                raise StepsForJax(f"{type(self.model).__name__}'s own {' and '.join(jax_steps)} take(s) the state "
                                  "before the batch, as Keras 3 calls them on JAX; on TensorFlow Keras calls "
                                  f"{jax_steps[0]}(self, data)")
            # A compiled model keeps what the job does not set: its loss, and its metrics (Keras's own steps
            # compute them), unless the job sets both loss and metrics (the engine's step, as a second compile()).
            self.own_step = bool(self.own_methods) or (self.compiled is not None and (
                "loss" not in self.given or ("metrics" not in self.given and _has_own_metrics(self.compiled))))
            if self.own_step:
                self.optimizer = self._compile_for_own_step(make_optimizer)
                if hasattr(self.model, "_symbolic_build"):  # Keras 3 builds its compile's metrics and loss here, as
                    # fit() does before its first step: made inside a replica's step, their variables cannot be lifted
                    labels = _tensor_specs(self.labels, 1) if self.labels else None
                    self.model._symbolic_build(data_batch=self.preprocessed_specs(_tensor_specs(self.features, 1),
                                                                                  labels))
            else:
                self.optimizer = self._job_step_optimizer(make_optimizer)
            if hasattr(self.optimizer, "build") and not getattr(self.optimizer, "built", False):
                self.optimizer.build(self.model.trainable_variables)  # slots exist before a restore fills them
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self.checkpoint = checkpoint_class(write_through)(model=self.model, optimizer=self.optimizer,
                                                           global_step=self.global_step)
        self.model_dir = model_dir
        self.manager = checkpoint_manager_class(fence)(
            self.checkpoint, self._checkpoint_dir(model_dir), max_to_keep=keep_checkpoint_max,
            checkpoint_name=CHECKPOINT_NAME)
        self.save_checkpoints_steps = save_checkpoints_steps
        self._train_step = None
        self._eval_step = None
        self._eval_metrics = None

    # ------------------------------------------------------------------------------ compile

    def _job_step_optimizer(self, make_optimizer: Callable):
        """The engine's step's optimizer: the job's, or a compiled model's own when the job sets none (wrapped
        for mixed_float16's loss scaling once); says what replaced what of a compiled model's compile."""
        kept = self.compiled is not None and "optimizer" not in self.given
        optimizer = self.model.optimizer if kept else make_optimizer(self.keras)
        if self.policy == "mixed_float16" and not _scales_loss(optimizer):
            scaling = self.keras.optimizers if self.keras3 else self.keras.mixed_precision
            optimizer = scaling.LossScaleOptimizer(optimizer)
        if self.compiled is not None:
            own = self.compiled
            parts = [f"model.loss {_described(self.loss)} replaces its loss {_described(own.get('loss'))}",
                     f"model.metrics {_described(self.metrics)} replace its metrics {_described(own.get('metrics'))}"
                     if "metrics" in self.given else f"its metrics {_described(own.get('metrics'))} are not "
                                                     "computed (the job sets no model.metrics)",
                     f"its optimizer {_described(optimizer)} is kept (the job sets no model.optimizer)" if kept else
                     f"model.optimizer {_described(optimizer)} replaces its {_described(own.get('optimizer'))}"]
            self.compile_note = f"{type(self.model).__name__} was compiled: " + "; ".join(parts)
        return optimizer

    def _compile_for_own_step(self, make_optimizer: Callable):
        """compile() the model for its own step with what the job sets (or, never compiled, with the job's values
        and defaults), keeping its compile's others (`portable.compile_with_job`); returns its optimizer."""
        said = compile_with_job(self.model, self.compiled, self.given, {
            "optimizer": lambda: make_optimizer(self.keras), "loss": self._loss_for_compile,
            "metrics": self._metrics_for_compile})
        why = "no model.loss" if "loss" not in self.given else "no model.metrics: its own are kept"
        whose = (f"its own {', '.join(self.own_methods)}" if self.own_methods else
                 f"Keras's train_step and test_step (the job sets {why})")
        self.compile_note = "; ".join([f"{type(self.model).__name__} trains with {whose}, each replica's step as "
                                       "fit() runs it", *said])
        return self.model.optimizer

    def _loss_for_compile(self):
        """The job's loss as compile() takes it: a Keras loss object per label (crossentropy on logits or
        probabilities as the engine's own step tells them), or the job's own function or Keras Loss."""
        if self.custom_loss is not None:
            return fresh_keras_loss(self.custom_loss)
        specs, _ = self.preprocessed_specs(_tensor_specs(self.features, 1), None)
        outputs = tf.function(lambda f: self.model(f, training=False)).get_concrete_function(specs).structured_outputs
        kinds = probabilities_of(self.model, outputs)
        names = self.label_names
        by_label = outputs_by_label(outputs, names, self.output_names)
        found = outputs_by_label(kinds, names, self.output_names)
        losses = {}
        for label in names:
            name = self.loss_names[label]
            if ":" in name:
                losses[label] = fresh_keras_loss(self.custom_losses[name])
            elif name in _CROSSENTROPY:
                probabilities = _output_kind(label, name, found[label], self.declared_outputs.get(label),
                                             by_label[label])
                losses[label] = getattr(self.keras.losses, _CROSSENTROPY[name][0])(from_logits=not probabilities)
            else:
                losses[label] = getattr(self.keras.losses, _REGRESSION[name])()
        if len(names) == 1:
            return losses[names[0]]
        return losses if isinstance(outputs, dict) else [losses[label] for label in names]

    def _metrics_for_compile(self):
        """The job's metrics as compile() takes them (a list, or per label): Keras's own for the names, the job's
        Metric objects (made afresh) and functions."""
        def made(name):
            if ":" in name:
                custom = self.custom_metrics[name]
                return fresh_keras_metric(custom) or custom
            keras_names = {"accuracy": "accuracy", "mean_squared_error": "mean_squared_error",
                           "mean_absolute_error": "mean_absolute_error", "auc": self.keras.metrics.AUC,
                           "precision": self.keras.metrics.Precision, "recall": self.keras.metrics.Recall}
            if name not in keras_names:
                raise SpecError(f"metric {name!r} has no Keras counterpart that compile() could make without "
                                "arguments", hint="give a Keras metric object by import path "
                                                  "(iou = keras.metrics.MeanIoU(num_classes=...) in your module)",
                                key=("model", "metrics"))
            value = keras_names[name]
            return value if isinstance(value, str) else value()

        if isinstance(self.metrics, dict):
            return {label: [made(n) for n in names] for label, names in self.metrics.items()}
        return [made(n) for n in self.metrics]

    def preprocessed_specs(self, features, labels) -> tuple:
        """(features, labels) specs of a batch as the model's steps take it: after `preprocess`, where there is one."""
        if self.preprocess is None:
            return features, labels
        traced = tf.function(self.preprocess).get_concrete_function(features, labels).structured_outputs
        traced = traced if isinstance(traced, tuple) else (traced,)
        specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), traced)
        return specs[0], (specs[1] if len(specs) > 1 else None)

    def _checkpoint_dir(self, model_dir: str) -> str:
        # Every worker of a MultiWorkerMirrored run takes part in a save; only the chief's lands in model_dir.
        if is_chief(self.strategy):
            return model_dir
        resolver = self.strategy.cluster_resolver
        return worker_scratch_dir(model_dir, resolver.task_type, resolver.task_id)

    # ------------------------------------------------------------------------------ checkpoints

    @property
    def step(self) -> int:
        return int(self.global_step.numpy())

    def restore(self, path: Optional[str] = None) -> int:
        """Restore `path` (default: model_dir's latest checkpoint, when there is one); returns the global step.

        Every worker restores the chief's checkpoint (its own saves go to a scratch folder)."""
        path = path or tf.train.latest_checkpoint(self.model_dir)
        if path:
            self.checkpoint.restore(path).assert_existing_objects_matched()
        return self.step

    def save(self) -> str:
        """Checkpoint at the current step, as model_dir/model.ckpt-STEP."""
        return self.manager.save(checkpoint_number=self.step)

    # ------------------------------------------------------------------------------ steps

    @tf.autograph.experimental.do_not_convert  # straight-line code: its frames stay this module's
    def _forward(self, features, labels, training: bool):
        """(the batch's loss, the heads' pairs) for one replica's batch: the data loss's mean over the batch plus the
        model's own losses (regularizers, add_loss), the loss TPUEstimator's model_fn optimizes and reports too."""
        features = annotate_for_logical_devices(self.strategy, features, self.feature_dims)
        labels = annotate_for_logical_devices(self.strategy, labels, self.label_dims)
        outputs = self.model(features, training=training)
        probabilities = probabilities_of(self.model, outputs)  # read before the cast hides the softmax
        outputs = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), outputs)
        pairs = pair_heads(labels, outputs, probabilities, self.loss_names, self.output_names,
                           self.declared_outputs) if (
            self.custom_loss is None or any(self.metrics)) else {}
        total = compute_loss(self.loss, labels, outputs, pairs, custom_loss=self.custom_loss,
                             custom_losses=self.custom_losses, keras=self.keras)
        if self.model.losses:
            total += tf.add_n([tf.cast(t, tf.float32) for t in self.model.losses])
        return total, pairs

    @tf.autograph.experimental.do_not_convert  # straight-line code: its frames stay this module's
    def _replica_own_train_step(self, features, labels):
        """The model's train_step on one replica's batch, as fit() runs it (its loss scaled to the global batch,
        its optimizer summing the replicas' gradients, its metrics updated); returns the loss to show."""
        features = annotate_for_logical_devices(self.strategy, features, self.feature_dims)
        labels = annotate_for_logical_devices(self.strategy, labels, self.label_dims)
        logs = self.model.train_step((features, labels))
        self.global_step.assign_add(1)
        return _progress_loss(logs)

    @tf.autograph.experimental.do_not_convert  # straight-line code: its frames stay this module's
    def _replica_own_eval_step(self, features, labels):
        """The model's test_step on one replica's batch; returns what it returned, as float32."""
        features = annotate_for_logical_devices(self.strategy, features, self.feature_dims)
        labels = annotate_for_logical_devices(self.strategy, labels, self.label_dims)
        logs = self.model.test_step((features, labels))
        return tf.nest.map_structure(lambda value: tf.cast(value, tf.float32), logs)

    @property
    def replica_train_step(self) -> Callable:
        """One replica's training step, (features, labels) -> its loss: the model's own or the engine's."""
        return self._replica_own_train_step if self.own_step else self._replica_train_step

    @property
    def replica_eval_step(self) -> Callable:
        return self._replica_own_eval_step if self.own_step else self._replica_eval_step

    def make_eval_metrics(self, batch_specs) -> None:
        """The evaluation's metrics, made in the strategy's scope (the model's own step has its compile's)."""
        if self._eval_metrics is None and not self.own_step:
            with self.strategy.scope():
                self._eval_metrics = self._metric_objects(batch_specs)

    def reset_model_metrics(self) -> None:
        """The model's own metrics start again (its step's loss is shown per call, as fit() shows it per epoch)."""
        if self.own_step:
            self.model.reset_metrics()

    @tf.autograph.experimental.do_not_convert  # straight-line code: its frames stay this module's
    def _replica_train_step(self, features, labels):
        replicas = self.strategy.num_replicas_in_sync
        with tf.GradientTape() as tape:
            total, _ = self._forward(features, labels, training=True)
            scaled = total / replicas  # each replica's gradients are summed: the mean over replicas
            if self.policy == "mixed_float16":
                scale = self.optimizer.scale_loss if self.keras3 else self.optimizer.get_scaled_loss
                scaled = scale(scaled)
        variables = self.model.trainable_variables
        gradients = tape.gradient(scaled, variables)
        if self.policy == "mixed_float16" and not self.keras3:  # Keras 3's apply_gradients unscales them itself
            gradients = self.optimizer.get_unscaled_gradients(gradients)
        self.optimizer.apply_gradients(zip(gradients, variables))  # sums the gradients over the replicas
        self.global_step.assign_add(1)
        if self.policy == "mixed_float16":  # its loss scale skips steps with non-finite gradients by design
            return total
        # A NaN or Inf gradient turns the weights NaN; a loss that clips its probabilities stays finite all the
        # same. The step's loss says so: NaN, which the loop stops on before saving these weights.
        checks = [tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g))
                  for g in gradients if g is not None]
        if not checks:
            return total
        return tf.where(tf.reduce_all(tf.stack(checks)), total, tf.constant(float("nan"), total.dtype))

    def train_step_fn(self, *, time_input: bool = False) -> Callable:
        """`run(iterator, steps)`: `steps` training steps in one compiled call; returns (the last step's loss, the
        mean over replicas; the seconds the steps waited for their batches, when `time_input`, else -1; the
        global step after them).

        On a TPU the loop runs on the device (as TPUEstimator's iterations_per_loop). The wait is the time
        between two timestamps around `next(iterator)`: near zero while prefetched batches are ready.
        """
        if self._train_step is None:
            strategy = self.strategy

            @tf.function
            def run(iterator, steps):
                loss = tf.constant(0.0)
                waited = tf.constant(0.0, tf.float64) if time_input else tf.constant(-1.0, tf.float64)
                for _ in tf.range(steps):
                    if time_input:
                        before = tf.timestamp()
                        batch = next(iterator)
                        with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
                            waited += tf.timestamp() - before
                    else:
                        batch = next(iterator)
                    per_replica = strategy.run(self.replica_train_step, args=batch)
                    loss = strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)
                return loss, waited, self.global_step.read_value()  # the step comes back with the call

            self._train_step = run
        return self._train_step

    def _metric_objects(self, batch_specs) -> dict:
        """The evaluation's Keras metrics by result name: the loss, then each label's metrics, named by metric, and
        '<label>/<metric>' with several heads (MeanIoU needs the number of classes: read from the output shapes
        of a traced forward pass)."""
        objects = {"loss": self.keras.metrics.Mean(name="loss")}
        if not self.metrics or not self.label_names:
            return objects
        concrete = tf.function(lambda f: self.model(f, training=False)).get_concrete_function(batch_specs)
        by_label = outputs_by_label(concrete.structured_outputs, self.label_names, self.output_names)
        heads = {n: head_for(self.loss_names[n], True) for n in self.label_names}  # from_logits: per batch
        for label, names in metrics_by_label(self.metrics, heads).items():
            shape = by_label[label].shape
            num_classes = max(2, int(shape[-1])) if shape.rank and shape[-1] is not None else 2
            for name in names:
                custom = self.custom_metrics.get(name)
                key = _metric_key(name, custom)
                objects[f"{label}/{key}" if len(heads) > 1 else key] = _EvalMetric(
                    label, name, _keras_metric(name, heads[label], num_classes, custom, self.keras), custom)
        return objects

    @tf.autograph.experimental.do_not_convert  # straight-line code: its frames stay this module's
    def _replica_eval_step(self, features, labels):
        total, pairs = self._forward(features, labels, training=False)
        self._eval_metrics["loss"].update_state(total)
        for key, entry in self._eval_metrics.items():
            if key != "loss":
                pair = pairs[entry.label]
                _update_metric(entry.metric, entry.name, pair.head, pair.labels, pair.outputs, entry.custom)

    def prepare_evaluation(self, dataset, per_replica_batch: int) -> None:
        """Make the evaluation's metrics and trace its step for `dataset`'s batches (what fails to build, fails here)."""
        strategy = self.strategy
        self.make_eval_metrics(self.preprocessed_specs(_tensor_specs(self.features, per_replica_batch), None)[0])
        if self._eval_step is None:
            @tf.function
            def run(batch):
                logs = strategy.run(self.replica_eval_step, args=batch)
                if not self.own_step:
                    return logs
                return tf.nest.map_structure(  # what the model's test_step returned, the mean over the replicas
                    lambda value: strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None), logs)

            self._eval_step = run
        self._eval_step.get_concrete_function(dataset.element_spec)

    def evaluate(self, dataset, steps: int, *, should_stop: Optional[Callable[[], bool]] = None,
                 per_replica_batch: int = 1) -> dict:
        """Evaluate the current weights on at most `steps` batches of the distributed `dataset` (fewer when it
        ends first; none is an error); returns {"loss": ..., metric: ..., "global_step": ...}. `should_stop` is asked
        between batches."""
        self.prepare_evaluation(dataset, per_replica_batch)
        self.reset_model_metrics()
        for entry in (self._eval_metrics or {}).values():
            _metric_of(entry).reset_state()
        done, logs = 0, None
        for batch in dataset:
            if done >= steps:
                break
            if should_stop is not None and should_stop():
                raise EvaluationInterrupted()
            logs = self._eval_step(batch)
            done += 1
        if not done:
            raise no_evaluation_batches()
        if self.own_step:
            # As Keras's evaluate(): the model's metrics when the test_step returned them, else its last batch's logs.
            results = self.model.get_metrics_result()
            returned = _flat_logs(logs) if isinstance(logs, dict) else {}
            results = _plain_results(results if not returned or set(returned) == set(results) else returned)
        else:
            results = _plain_results({key: _metric_of(entry).result() for key, entry in self._eval_metrics.items()})
        results["global_step"] = self.step
        return results

    def prepare_training(self, iterator, *, time_input: bool = False) -> None:
        """Trace the training step for `iterator`'s batches (what fails to build, fails here, before any step)."""
        self.train_step_fn(time_input=time_input).get_concrete_function(iterator, tf.constant(1))


def _has_own_metrics(compiled: dict) -> bool:
    """Whether a model's compile named metrics of its own (`compiled_with`'s settings)."""
    return bool(compiled.get("metrics") or compiled.get("weighted_metrics"))


class _EvalMetric(NamedTuple):
    label: str
    name: str
    metric: Any
    custom: Optional[Callable]


def _metric_of(entry):
    return entry.metric if isinstance(entry, _EvalMetric) else entry


class EvaluationInterrupted(Exception):
    """A signal arrived between evaluation batches: the evaluation is abandoned, not reported."""


# --------------------------------------------------------------------------------------------- train

def train_loop(training: KerasTraining, iterator, *, until: int, steps_per_call: int,
               on_steps: Optional[Callable[[int, float, Optional[float]], None]] = None,
               should_stop: Optional[Callable[[], bool]] = None,
               on_checkpoint: Optional[Callable[[int, str], None]] = None, time_input: bool = False,
               before_save: Optional[Callable[[int], None]] = None) -> int:
    """Train until global step `until` (checkpointing every save_checkpoints_steps and at the end); returns the step.

    Each call runs `steps_per_call` steps (fewer at the end); `on_steps(step, loss, input_wait)` follows
    each call (`input_wait`: seconds the call waited for its batches with `time_input`, else None);
    `should_stop()` is asked after each call: when it says so, a checkpoint is saved and the loop ends.
    `before_save(step)` is called before each checkpoint: what it raises ends the loop without that save.
    """
    run = training.train_step_fn(time_input=time_input)
    every = training.save_checkpoints_steps
    step = training.step
    while step < until:
        steps = min(steps_per_call, until - step, every - step % every)  # a call ends on each checkpoint step
        training.reset_model_metrics()
        loss, waited, step = run(iterator, tf.constant(steps))
        step = int(step)  # read with the call: a separate read of the variable costs a round trip per call
        if on_steps is not None:
            on_steps(step, float(loss.numpy()), float(waited.numpy()) if time_input else None)
        stopping = should_stop is not None and should_stop()
        if stopping or step >= until or step % every == 0:
            if before_save is not None:
                before_save(step)
            path = training.save()
            if on_checkpoint is not None:
                on_checkpoint(step, path)
        if stopping:
            break
    return step


def export_saved_model(training: KerasTraining, out_dir: str, label_names: List[str]) -> str:
    """A SavedModel of the model under `out_dir/<timestamp>`, serving the features by name with a free batch dim."""
    specs = _tensor_specs({n: {**s, "dtype": "float32" if s["dtype"] == "bfloat16" else s["dtype"]}
                           for n, s in training.features.items()}, None)
    model = training.model

    @tf.function(input_signature=[specs] if not isinstance(specs, dict) else [specs])
    def serve(features):
        if training.preprocess is not None:  # a KerasHub task's preprocessor, as its predict() applies it
            features = training.preprocess(features)
        outputs = model(features, training=False)
        outputs = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), outputs)
        return _predictions(outputs, label_names, training.output_names)

    path = os.path.join(out_dir, str(int(time.time())))
    tf.saved_model.save(model, path, signatures={"serving_default": serve})
    return path


__all__ = ["make_strategy", "KerasTraining", "StepsForJax", "train_loop", "distributed_dataset", "keras_optimizer_factory",
           "set_random_seed",
           "export_saved_model", "EvaluationInterrupted", "workers_in", "is_chief", "CHECKPOINT_NAME"]
