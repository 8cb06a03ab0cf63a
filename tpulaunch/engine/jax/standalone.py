"""The model, steps, evaluation and checkpoints that `tpulaunch train` runs on the jax engine.

Keras 3 on its JAX backend: the builder's model compiled with the job's optimizer, loss and metrics for XLA
(`jit_compile`), data-parallel over this machine's devices (`keras.distribution.DataParallel`: each batch split
along its first dimension, the variables replicated), one `train_on_batch` per step. Checkpoints are TensorFlow's
object-based format (`model_dir/model.ckpt-STEP`, the `checkpoint` state file, `global_step` inside), written from
TensorFlow variables that mirror the model's and the optimizer's, so every engine's tools read them.

This module imports only TensorFlow (the checkpoints; tf.data reads the records), NumPy, the Python standard
library and `engine/portable.py`; Keras and JAX are imported when a training is made, after KERAS_BACKEND=jax is
set (Keras reads it once, at its first import). It takes plain values and the job's own callables: tpulaunch
calls it with values converted from the job file (engine/jax/plain.py), and `tpulaunch explain` prints
portable.py and then this module verbatim inside the standalone program (without the import of portable's
names below, which the program defines above it).
"""

import itertools
import warnings
from typing import Callable, List, Optional

import numpy as np
import tensorflow as tf

from tpulaunch.engine.portable import (  # explain: the program defines these above this module
    checkpoint_class, checkpoint_manager_class, compile_with_job, compiled_with, head_for, metrics_by_label,
    no_evaluation_batches, outputs_by_label)

CHECKPOINT_NAME = "model.ckpt"  # checkpoints are model_dir/model.ckpt-STEP, as on the other engines
# Crossentropies take logits unless the model's last layer ends in softmax or sigmoid.
CROSSENTROPY = ("sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy")


class NotKeras3Model(TypeError):
    """The builder returned something other than a Keras 3 model (a tf.keras one: its variables are TensorFlow's)."""


class StepsForAnotherBackend(TypeError):
    """The model overrides train_step or test_step as Keras 3 calls them on TensorFlow (`step(self, data)`); on JAX
    Keras calls them with the state first (`step(self, state, data)`), functions of it."""


def own_steps_for_another_backend(model) -> list:
    """The model's own train_step / test_step that take `data` alone (written for the TensorFlow backend)."""
    import inspect

    found = []
    for name in ("train_step", "test_step"):
        method = getattr(type(model), name)
        if method.__module__.split(".")[0] == "keras":  # Keras's own
            continue
        parameters = [p for p in inspect.signature(method).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(parameters) < 3:  # (self, data)
            found.append(name)
    return found


def hand_batches_as_fit_does(model) -> None:
    """The model's own train_step gets each batch as fit() hands it, (x, y): train_on_batch would hand it
    (x, y, None), which a step written as Keras's guide writes it (`x, y = data`) cannot unpack."""
    own_step = model.train_step

    def train_step(state, data):
        if isinstance(data, tuple) and len(data) == 3 and data[2] is None:
            data = data[:2]
        return own_step(state, data)

    model.train_step = train_step


def example_batch(features: dict, label) -> tuple:
    """Zeros of one example: the features ({name: (shape, dtype)}; a lone array for one feature, as the input
    pipeline hands them) and the label ((shape, dtype)), or the labels ({name: (shape, dtype)}: a dict by name, as
    the input pipeline hands several)."""
    def zeros(shape, dtype):
        return np.zeros((1, *shape), "float32" if dtype == "bfloat16" else dtype)

    made = {name: zeros(*spec) for name, spec in features.items()}
    labels = {name: zeros(*spec) for name, spec in label.items()} if isinstance(label, dict) else zeros(*label)
    return (next(iter(made.values())) if len(made) == 1 else made), labels


def keras_on_jax():
    """Keras 3 and JAX, Keras on its JAX backend (KERAS_BACKEND=jax must be set before Keras first loads)."""
    import jax
    import keras

    if keras.backend.backend() != "jax":
        raise RuntimeError(f"Keras runs on its {keras.backend.backend()} backend in this process, not JAX: set "
                           "KERAS_BACKEND=jax before anything imports Keras")
    return keras, jax


def make_optimizer(keras, optimizer: str, learning_rate: float, optimizer_args: dict):
    """The Keras optimizer class `optimizer` names (SGD, Adam, ...) with its arguments."""
    return getattr(keras.optimizers, optimizer)(learning_rate=learning_rate, **optimizer_args)


def outputs_logits(model) -> bool:
    """Whether the model outputs logits: unless its last layer ends in softmax or sigmoid."""
    activation = getattr(model.layers[-1], "activation", None)
    return getattr(activation, "__name__", "linear") not in ("softmax", "sigmoid")


def make_loss(keras, loss: str, model, from_logits: Optional[bool] = None):
    """The Keras loss `loss` names; a crossentropy told whether the model outputs logits (`from_logits`; None:
    read from the model's last layer)."""
    if loss not in CROSSENTROPY:
        return keras.losses.get(loss)
    class_name = "".join(part.capitalize() for part in loss.split("_"))
    from_logits = outputs_logits(model) if from_logits is None else from_logits
    return keras.losses.get({"class_name": class_name, "config": {"from_logits": from_logits}})


def output_logits(output, model) -> bool:
    """Whether one of a functional model's outputs (a symbolic tensor) is logits: unless the layer that makes it
    ends in softmax or sigmoid (a model without symbolic outputs: its last layer, `outputs_logits`)."""
    history = getattr(output, "_keras_history", None)
    layer = getattr(history, "operation", None)
    if layer is None:
        return outputs_logits(model)
    return getattr(getattr(layer, "activation", None), "__name__", "linear") not in ("softmax", "sigmoid")


class Heads:
    """A model of several labels (`label_names`, as the job declares them) as Keras's compile() scores it: each
    label paired with the output it scores as the other engines pair them (`portable.outputs_by_label`: dict outputs
    keyed like the labels; a list by its output layers' names, else in declared order); the labels handed to Keras
    in the outputs' structure (a dict as the input pipeline gives it; a list in the outputs' order), each label's
    loss and metrics in that structure too, so Keras's per-output losses (summed) and metrics
    (`<output>_<metric>`) are compile()'s own. `whole`: the job's one loss function of all the labels and outputs
    (RetinaNet's), which gets the labels as the input pipeline gives them, by name."""

    def __init__(self, keras, model, label_names: List[str], example_features, whole: bool):
        self.keras, self.model, self.names, self.whole = keras, model, list(label_names), whole
        outputs = getattr(model, "output", None) if getattr(model, "inputs", None) else None
        if outputs is None:  # a model without symbolic outputs: their structure from a call on zeros
            outputs = model(example_features)
        self.outputs = outputs
        self.order = None  # list outputs: the label of each output, in the outputs' order
        if whole:
            return
        if isinstance(outputs, dict):
            outputs_by_label(outputs, self.names)  # keyed like the labels, or a SpecError at data.labels
            self.logits = {name: output_logits(outputs[name], model) for name in self.names}
            return
        flat = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        paired = outputs_by_label(list(range(len(flat))), self.names, list(getattr(model, "output_names", ()) or ()))
        self.order = [label for index in range(len(flat)) for label, at in paired.items() if at == index]
        self.logits = {label: output_logits(flat[paired[label]], model) for label in self.names}

    def structured(self, by_label: dict):
        """Values by label in the structure of the model's outputs."""
        return dict(by_label) if self.order is None else [by_label[label] for label in self.order]

    def labels(self, labels):
        """A batch's labels (a dict by name) as Keras pairs them with the outputs."""
        return labels if self.whole else self.structured(labels)

    def losses(self, loss):
        """Each label's loss (`loss`: one name for all, or {label: name}) in the outputs' structure."""
        named = loss if isinstance(loss, dict) else {label: loss for label in self.names}
        return self.structured({label: make_loss(self.keras, named[label], self.model, self.logits[label])
                                for label in self.names})

    def metrics(self, metrics, loss):
        """Each label's metrics (a list: each metric for every head it fits; {label: [names]}) in the outputs'
        structure."""
        named = loss if isinstance(loss, dict) else {label: loss for label in self.names}
        heads = {label: head_for(named[label] or "", self.logits[label]) for label in self.names}
        return self.structured(metrics_by_label(metrics, heads))

    def whole_loss(self, custom_loss: Callable):
        """The model's compute_loss with the job's one loss of all labels and outputs: its mean (as compile()
        reduces a loss function's values), plus the model's own losses (regularizers, add_loss), as Keras's."""
        keras, model = self.keras, self.model

        def compute_loss(x=None, y=None, y_pred=None, sample_weight=None, training=True):
            total = keras.ops.mean(keras.ops.cast(custom_loss(y, y_pred), "float32"))
            for extra in model.losses:
                total = total + keras.ops.sum(keras.ops.cast(extra, "float32"))
            return total

        return compute_loss


class JaxTraining:
    """The job's model compiled on JAX over this machine's devices, its global step and its checkpoints.

    `distribution`: the Keras distribution to train under (None: DataParallel over the devices when there are
    several; tpulaunch passes a device mesh's for a spatial split). `write_through` and `fence` (None: plain
    TensorFlow) make every checkpoint write go through a staging step and
    the state file's writes and deletions of old checkpoints wait on a check (`portable.checkpoint_class`,
    `portable.checkpoint_manager_class`): tpulaunch passes its lease's. `given`: which of "loss", "optimizer" and
    "metrics" the job sets (default: all); a model the builder compile()d keeps its own compile's others.
    """

    def __init__(self, build_model: Callable, builder_kwargs: dict, *, optimizer: str, learning_rate: float,
                 optimizer_args: dict, loss, metrics, seed: Optional[int], model_dir: str,
                 keep_checkpoint_max: int, example_shapes: Optional[tuple] = None, custom_loss: Optional[Callable] = None,
                 distribution=None, write_through: Optional[Callable] = None,
                 fence: Optional[Callable[[], None]] = None, given: Optional[List[str]] = None,
                 label_names: Optional[List[str]] = None):
        keras, jax = keras_on_jax()
        self.keras = keras
        self.devices = jax.devices()
        if distribution is None and len(self.devices) > 1:
            distribution = keras.distribution.DataParallel(devices=self.devices)
        if distribution is not None:  # before the model is built: its variables are laid out by it
            keras.distribution.set_distribution(distribution)
        if seed is not None:
            keras.utils.set_random_seed(seed)
        self.model = build_model(**builder_kwargs)
        if not isinstance(self.model, keras.Model):
            raise NotKeras3Model(f"returned {type(self.model).__name__} of "
                                 f"{type(self.model).__module__.split('.')[0]}, a tf.keras (Keras 2) model")
        steps = own_steps_for_another_backend(self.model)
        if steps:
            raise StepsForAnotherBackend(f"{type(self.model).__name__}'s own {' and '.join(steps)} take(s) the "
                                         "batch alone, as Keras calls them on TensorFlow; on JAX they are "
                                         f"{steps[0]}(self, state, data), returning the new state")
        # A model its builder compile()d (a KerasHub task compiles itself) keeps its own compile for what the job
        # does not set (`given`); the job's replace the rest, as a second compile() would. `compile_note` says so.
        own = compiled_with(self.model)
        given = ("loss", "optimizer", "metrics") if given is None else given
        # Several labels: each scored by its own output, the labels handed in the outputs' structure (`Heads`);
        # the job's one loss function of them all (not a model's own compile) gets them as the pipeline gives them.
        self.heads = None
        if label_names is not None and len(label_names) > 1:
            features = example_batch(*example_shapes)[0] if example_shapes is not None else None
            self.heads = Heads(keras, self.model, label_names, features,
                               whole=custom_loss is not None and (not own or "loss" in given))

        def job_loss():
            if self.heads is None:
                return custom_loss or make_loss(keras, loss, self.model)
            return None if self.heads.whole else self.heads.losses(loss)

        def job_metrics():
            if self.heads is None:
                return list(metrics)
            if self.heads.whole:  # none: Keras would pair the labels with the outputs (tpulaunch refuses metrics)
                return None
            return self.heads.metrics(metrics, loss)

        said = compile_with_job(self.model, own, given, {
            "optimizer": lambda: make_optimizer(keras, optimizer, learning_rate, optimizer_args),
            "loss": job_loss, "metrics": job_metrics}, jit_compile=True)
        if self.heads is not None and self.heads.whole:  # Keras's compile() would score each output alone
            self.model.compute_loss = self.heads.whole_loss(custom_loss)
            whole = f"model.loss {getattr(custom_loss, '__name__', type(custom_loss).__name__)} of all the outputs"
            said = [whole if part.startswith("model.loss") else part for part in said]
        self.compile_note = f"{type(self.model).__name__} was compiled: " + "; ".join(said) if own else None
        if type(self.model).train_step is not keras.Model.train_step:
            hand_batches_as_fit_does(self.model)
        if example_shapes is not None:  # built as fit() builds it at its first batch: a model whose variables come
            features, labels = example_batch(*example_shapes)  # at its first call has them
            self.model._symbolic_build(data_batch=(features, self.keras_labels(labels)))
        if not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        self.step = 0
        self.model_dir, self.keep_checkpoint_max = model_dir, keep_checkpoint_max
        self.write_through, self.fence = write_through, fence
        self._checkpoint = None

    # ------------------------------------------------------------------------------ the steps
    def keras_labels(self, labels):
        """A batch's labels as the model's compile() takes them (several: in its outputs' structure, `Heads`)."""
        return labels if self.heads is None else self.heads.labels(labels)

    def train_step(self, features, labels) -> float:
        """One step on a global batch (split over the devices); its loss."""
        logs = self.model.train_on_batch(features, self.keras_labels(labels), return_dict=True)
        self.step += 1
        return float(logs["loss"])

    def evaluate(self, batches, steps: int, should_stop: Optional[Callable[[], bool]] = None) -> Optional[dict]:
        """The loss and metrics over `steps` batches of `batches`, as Keras's evaluate() aggregates them (each metric
        accumulated over every batch, weighted by its examples), or fewer batches when they end first (none is an
        error); None when `should_stop` turned true first."""
        stopped = []

        def until_stopped():
            for _, batch in zip(range(steps), batches):  # fewer when the eval set ends first
                if should_stop is not None and should_stop():
                    stopped.append(True)
                    return
                yield batch

        remaining = until_stopped()
        first = next(remaining, None)
        if first is None:  # no batch at all: an error, never metrics of nothing (a stop first: None)
            if stopped:
                return None
            raise no_evaluation_batches()

        def every_batch():  # a generator, as evaluate() takes one
            for features, labels in itertools.chain([first], remaining):
                yield features, self.keras_labels(labels)

        evaluate, given = self.model.evaluate, every_batch()
        preprocess = getattr(self.model, "preprocess_samples", None)
        if callable(preprocess) and type(self.model).evaluate is not self.keras.Model.evaluate:
            # A KerasHub task's evaluate() takes arrays or a dataset, not a generator of batches: it maps its
            # preprocess_samples over the batches (its preprocessor, where it has one) and runs keras.Model's
            # evaluate() on them, as done here batch by batch (its train_on_batch preprocesses each batch itself).
            evaluate = lambda batches, **kwargs: self.keras.Model.evaluate(self.model, batches, **kwargs)  # noqa: E731
            given = (self.keras.tree.map_structure(on_host, preprocess(*batch)) for batch in given)
        with warnings.catch_warnings():  # an eval set shorter than `steps`, or a stop, ends the batches early
            warnings.filterwarnings("ignore", message="Your input ran out of data")
            logs = evaluate(given, steps=steps, verbose=0, return_dict=True)
        return None if stopped else {name: float(value) for name, value in logs.items()}

    # ------------------------------------------------------------------------------ checkpoints
    def _variables(self) -> list:
        """What a checkpoint holds, in this order: the model's weights, then the optimizer's (not the metrics')."""
        return list(self.model.weights) + list(self.model.optimizer.variables)

    def _tf_checkpoint(self):
        """TensorFlow variables mirroring the model's and the optimizer's, and the global step, made once."""
        if self._checkpoint is None:
            self._mirrors = [tf.Variable(on_host(v.value), name=f"v{i}", trainable=False)
                             for i, v in enumerate(self._variables())]
            self._global_step = tf.Variable(0, dtype=tf.int64, name="global_step", trainable=False)
            self._checkpoint = checkpoint_class(self.write_through)(global_step=self._global_step,
                                                                     variables=self._mirrors)
            self._manager = checkpoint_manager_class(self.fence)(
                self._checkpoint, self.model_dir, checkpoint_name=CHECKPOINT_NAME,
                max_to_keep=self.keep_checkpoint_max)
        return self._checkpoint

    def save(self) -> str:
        """A checkpoint at the current step; its path (model_dir/model.ckpt-STEP)."""
        self._tf_checkpoint()
        for mirror, variable in zip(self._mirrors, self._variables()):
            mirror.assign(on_host(variable.value))
        self._global_step.assign(self.step)
        return self._manager.save(checkpoint_number=self.step)

    def restore(self, path: Optional[str] = None) -> int:
        """`path` (default: model_dir's latest checkpoint) into the model and the optimizer; the step it holds
        (0: no checkpoint). Raises what TensorFlow raises for a checkpoint of other variables."""
        path = path or tf.train.latest_checkpoint(self.model_dir)
        if path is None:
            return 0
        self._tf_checkpoint().read(path).assert_existing_objects_matched()
        for mirror, variable in zip(self._mirrors, self._variables()):
            variable.assign(mirror.numpy())
        self.step = int(self._global_step.numpy())
        return self.step


def on_host(value) -> np.ndarray:
    """A variable's value as NumPy. Over several hosts a variable spans devices this process cannot read, but it
    is replicated: this process's first device holds all of it."""
    if getattr(value, "is_fully_addressable", True):
        return np.asarray(value)
    return np.asarray(value.addressable_data(0))


def numpy_batches(dataset_fn: Callable, batch_size: int, skip_batches: int = 0):
    """The batches of a `portable.make_dataset_fn` dataset_fn (global batch size) as NumPy, as JAX takes them, after
    the first `skip_batches` (a resumed training's step: the batches it already trained on)."""
    return dataset_fn(batch_size, skip_batches=skip_batches).as_numpy_iterator()


__all__ = ["JaxTraining", "NotKeras3Model", "StepsForAnotherBackend", "example_batch", "keras_on_jax", "make_optimizer", "make_loss", "outputs_logits",
           "numpy_batches", "on_host", "CHECKPOINT_NAME"]
