"""Keras 3 on JAX: the job's model compiled for the JAX backend with the job's loss, optimizer and metrics, data
parallel over this machine's devices (`keras.distribution.DataParallel`: the batch split along its first dimension,
the variables replicated; or a device mesh that also splits the inputs spatially, `mesh.py`), its steps, and its
checkpoints.

Checkpoints are TensorFlow's object-based format under model_dir, named as on the other engines (`model.ckpt-STEP`,
the `checkpoint` state file, `global_step` inside), so resume, `--checkpoint`, evaluate, the job copy's check and
the repair of a cut-off save read them the same way; TensorFlow's filesystem writes them (gs:// too), each file
written whole before the state file names it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Optional

import numpy as np

from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.schema import Job

from tpulaunch.engine.jax.rules import OPTIMIZERS  # metrics: the names compile() takes (the rules hold the others)

CROSSENTROPY = ("sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy")


def load_keras():
    """Keras 3 on the JAX backend (KERAS_BACKEND=jax before its first import in this process), and JAX."""
    if "keras" in sys.modules:
        import keras

        if keras.backend.backend() != "jax":
            raise TpuLaunchError(f"Keras was already loaded with the {keras.backend.backend()} backend in this "
                                 "process; the jax engine needs it on JAX",
                                 hint="run the jax engine's job in a process of its own (`tpulaunch train`)")
    from tpulaunch.engine.jax.about import ABOUT

    os.environ.update(ABOUT.process_environment)
    import jax
    import keras

    return keras, jax


class JaxTraining:
    """The job's compiled Keras 3 model on JAX, its global step and its checkpoints in `model_dir`."""

    def __init__(self, job: Job, builder, builder_kwargs: dict, *, custom_loss=None, split=None):
        from tpulaunch.engine.jax import mesh

        keras, jax = load_keras()
        self.job, self.keras = job, keras
        self.devices = jax.devices()  # every host's, over several hosts (hosts.py)
        self.layout = mesh.device_layout(split, self.devices)  # `split`: partition:'s (mesh.split_of(plan))
        distribution = mesh.distribution(self.layout, job)
        if distribution is not None:
            keras.distribution.set_distribution(distribution)
        if job.run.seed is not None:
            keras.utils.set_random_seed(job.run.seed)
        try:
            self.model = builder(**builder_kwargs)
        except ImportError as exc:  # tf.keras is tf-keras (TF_USE_LEGACY_KERAS, for the keras engine), not installed
            if "Keras cannot be imported" not in str(exc):
                raise
            raise _keras2_model(job, "uses tf.keras, which is Keras 2 (the tf-keras package, not installed here)")
        if not isinstance(self.model, keras.Model):  # a tf.keras (Keras 2) model: its variables are TensorFlow's
            raise _keras2_model(job, f"returned {type(self.model).__name__} of "
                                     f"{type(self.model).__module__.split('.')[0]}, a tf.keras (Keras 2) model")
        self.model.compile(optimizer=self._optimizer(), loss=custom_loss or self._loss(),
                           metrics=list(job.model.metrics or []), jit_compile=True)
        self.model.optimizer.build(self.model.trainable_variables)
        self.step = 0
        self.model_dir = job.run.model_dir
        self._checkpoint = None

    # ------------------------------------------------------------------ what the job compiles with
    def _optimizer(self):
        spec = self.job.model.optimizer
        name, defaults = OPTIMIZERS[spec.name]
        return getattr(self.keras.optimizers, name)(learning_rate=spec.learning_rate, **{**defaults, **dict(spec.args)})

    def _loss(self):
        name = self.job.model.loss
        if name not in CROSSENTROPY:
            return self.keras.losses.get(name)
        return self.keras.losses.get({"class_name": _class_name(name), "config": {"from_logits": self._logits()}})

    def _logits(self) -> bool:
        """The model outputs logits unless its last layer ends in softmax or sigmoid."""
        activation = getattr(self.model.layers[-1], "activation", None)
        return getattr(activation, "__name__", "linear") not in ("softmax", "sigmoid")

    # ------------------------------------------------------------------------------ the steps
    def train_step(self, features, labels) -> float:
        logs = self.model.train_on_batch(features, labels, return_dict=True)
        self.step += 1
        return float(logs["loss"])

    def evaluate(self, batches, steps: int, should_stop=None) -> Optional[dict]:
        """The metrics over `steps` batches of `batches` (None when `should_stop` turned true first)."""
        self.model.reset_metrics()
        logs = {}
        for _ in range(steps):
            if should_stop is not None and should_stop():
                return None
            features, labels = next(batches)
            logs = self.model.test_on_batch(features, labels, return_dict=True)
        return {name: float(value) for name, value in logs.items()}

    # ------------------------------------------------------------------------------ export
    def export(self, out_dir: str, label_names) -> str:
        """A SavedModel of the model under `out_dir/<timestamp>`, serving the features by name with a free batch
        dimension, as the other engines' exports do. Keras 3 converts the JAX model's call for TensorFlow
        (`keras.export.ExportArchive`), so the SavedModel serves without JAX."""
        import tensorflow as tf

        from tpulaunch.engine.portable import _predictions

        specs = {name: tf.TensorSpec([None, *spec.shape], "float32" if spec.dtype == "bfloat16" else spec.dtype,
                                     name=name) for name, spec in self.job.data.features.items()}
        model, output_names = self.model, list(getattr(self.model, "output_names", []) or [])

        def serve(features):
            return _predictions(model(features, training=False), list(label_names), output_names)

        archive = self.keras.export.ExportArchive()
        archive.track(model)
        # One feature: the model takes a lone tensor (as the input pipeline gives it), served under its name.
        archive.add_endpoint("serving_default", serve,
                             input_signature=[next(iter(specs.values())) if len(specs) == 1 else specs])
        path = os.path.join(out_dir, str(int(time.time())))
        archive.write_out(path, verbose=False)
        return path

    # ------------------------------------------------------------------------------ checkpoints
    def _variables(self):
        return list(self.model.weights) + list(self.model.optimizer.variables)

    def _tf_checkpoint(self):
        """TensorFlow variables mirroring the model's and the optimizer's, and the global step, made once."""
        import tensorflow as tf

        if self._checkpoint is None:
            self._mirrors = [tf.Variable(_on_host(v.value), name=f"v{i}", trainable=False)
                             for i, v in enumerate(self._variables())]
            self._global_step = tf.Variable(0, dtype=tf.int64, name="global_step", trainable=False)
            # Staged, then moved while the run holds model_dir's lease; its state and deletions fenced (as the
            # other engines save: engine/core/staged_save.py).
            from tpulaunch.engine.core.staged_save import staged_write
            from tpulaunch.engine.portable import checkpoint_class, checkpoint_manager_class
            from tpulaunch.run.lease import ensure_held

            self._checkpoint = checkpoint_class(staged_write)(global_step=self._global_step, variables=self._mirrors)
            self._manager = checkpoint_manager_class(lambda: ensure_held(self.model_dir))(
                self._checkpoint, self.model_dir, checkpoint_name="model.ckpt",
                max_to_keep=self.job.run.keep_checkpoint_max)
        return self._checkpoint

    def save(self) -> str:
        """A checkpoint at the current step; its path (model_dir/model.ckpt-STEP)."""
        self._tf_checkpoint()
        for mirror, variable in zip(self._mirrors, self._variables()):
            mirror.assign(_on_host(variable.value))
        self._global_step.assign(self.step)
        return self._manager.save(checkpoint_number=self.step)

    def restore(self, path: Optional[str] = None) -> int:
        """The latest checkpoint in model_dir (or `path`) into the model and optimizer; the step it holds (0: none)."""
        import tensorflow as tf

        if path is not None:
            from tpulaunch.engine.core.checkpoints import checkpoint_problem

            problem = checkpoint_problem(path)
            if problem:
                raise TpuLaunchError(f"--checkpoint {path} cannot be restored: {problem}",
                                     hint=f"name one of {self.model_dir}'s model.ckpt-STEP, without its extension")
        path = path or tf.train.latest_checkpoint(self.model_dir)
        if path is None:
            return 0
        try:
            self._tf_checkpoint().read(path).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as exc:  # another engine's, or another model's
            raise TpuLaunchError(f"{path} does not hold this model's variables as the jax engine saves them "
                                 f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
                                 hint="train into another run.model_dir (--model-dir), or evaluate it with the engine "
                                      "that wrote it") from None
        for mirror, variable in zip(self._mirrors, self._variables()):
            variable.assign(mirror.numpy())
        self.step = int(self._global_step.numpy())
        return self.step


def _on_host(value) -> np.ndarray:
    """A variable's value as NumPy. Over several hosts a variable spans devices this process cannot read, but it
    is replicated: this process's first device holds all of it."""
    if getattr(value, "is_fully_addressable", True):
        return np.asarray(value)
    return np.asarray(value.addressable_data(0))


def _keras2_model(job: Job, what: str) -> TpuLaunchError:
    return TpuLaunchError(f"model builder {job.model.builder!r} {what}; the jax engine trains Keras 3 models",
                          code="jax-engine-keras2-model",
                          hint="train it on the keras engine (run.engine: keras), or `import keras` (Keras 3) in the "
                               "builder's module instead of tf.keras")


def _class_name(loss: str) -> str:
    return "".join(part.capitalize() for part in loss.split("_"))

