"""The jax engine's training: `standalone.py`'s JaxTraining (Keras 3 on JAX, data-parallel over this machine's
devices, or over the device mesh of a spatial split, `mesh.py`; its steps and checkpoints; the code `tpulaunch
explain` prints) on the job's values, with its failures told at the job's keys, and the SavedModel export.

Checkpoints are TensorFlow's object-based format under model_dir, named as on the other engines (`model.ckpt-STEP`,
the `checkpoint` state file, `global_step` inside), so resume, `--checkpoint`, evaluate, the job copy's check and
the repair of a cut-off save read them the same way; TensorFlow's filesystem writes them (gs:// too), each file
written whole before the state file names it: staged, and fenced by model_dir's lease.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Optional

from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.schema import Job


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
    """The engine's training, `standalone.JaxTraining` (the code `tpulaunch explain` prints), on the job's values:
    its failures told at the job's keys, its checkpoints staged and fenced by model_dir's lease, and its export.
    Its steps, evaluation, save and attributes (model, devices, step) are the standalone training's."""

    def __init__(self, job: Job, builder, builder_kwargs: dict, *, custom_loss=None, plan=None):
        keras, jax = load_keras()  # before standalone imports TensorFlow: its import would settle Keras's backend
        # Before the model is built: its layers take the policy when they are made. bfloat16 is mixed_bfloat16 on
        # every device JAX runs (float32 weights, bfloat16 compute; no loss scaling), as on the TPU for the others.
        keras.mixed_precision.set_global_policy("mixed_bfloat16" if job.model.precision == "bfloat16" else "float32")
        from tpulaunch.engine.core.staged_save import staged_write
        from tpulaunch.engine.jax import mesh, standalone
        from tpulaunch.engine.jax.plain import training_settings
        from tpulaunch.run.lease import ensure_held

        self.job = job
        self.layout = mesh.device_layout(plan, jax.devices())  # the Plan's mesh (None: data-parallel)
        try:
            # Staged, then moved while the run holds model_dir's lease; its state and deletions fenced (as the
            # other engines save: engine/core/staged_save.py).
            self.core = standalone.JaxTraining(builder, builder_kwargs, custom_loss=custom_loss,
                                               distribution=mesh.distribution(self.layout, job),
                                               write_through=staged_write, fence=lambda: ensure_held(job.run.model_dir),
                                               **training_settings(job))
        except ImportError as exc:  # tf.keras is tf-keras (TF_USE_LEGACY_KERAS, for the keras engine), not installed
            if "Keras cannot be imported" not in str(exc):
                raise
            raise _keras2_model(job, "uses tf.keras, which is Keras 2 (the tf-keras package, not installed here)")
        except standalone.NotKeras3Model as exc:
            raise _keras2_model(job, str(exc)) from None
        except standalone.StepsForAnotherBackend as exc:
            raise TpuLaunchError(f"model builder {job.model.builder!r}: {exc}", code="jax-engine-tf-backend-steps",
                                 hint="train it on the keras engine (run.engine: keras), or write the steps as Keras "
                                      "3 does for JAX (keras.io: customizing what happens in fit() with JAX)") from None

    def __getattr__(self, name):  # what is not the engine's own is the standalone training's
        if name == "core":
            raise AttributeError(name)
        return getattr(self.core, name)

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
    def restore(self, path: Optional[str] = None) -> int:
        """The latest checkpoint in model_dir (or `path`) into the model and optimizer; the step it holds (0: none)."""
        import tensorflow as tf

        if path is not None:
            from tpulaunch.engine.core.checkpoints import checkpoint_problem

            problem = checkpoint_problem(path)
            if problem:
                raise TpuLaunchError(f"--checkpoint {path} cannot be restored: {problem}",
                                     hint=f"name one of {self.model_dir}'s model.ckpt-STEP, without its extension")
        try:
            return self.core.restore(path)
        except (AssertionError, ValueError, tf.errors.OpError) as exc:  # another engine's, or another model's
            path = path or tf.train.latest_checkpoint(self.model_dir)
            raise TpuLaunchError(f"{path} does not hold this model's variables as the jax engine saves them "
                                 f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
                                 hint="train into another run.model_dir (--model-dir), or evaluate it with the engine "
                                      "that wrote it") from None


def _keras2_model(job: Job, what: str) -> TpuLaunchError:
    return TpuLaunchError(f"model builder {job.model.builder!r} {what}; the jax engine trains Keras 3 models",
                          code="jax-engine-keras2-model",
                          hint="train it on the keras engine (run.engine: keras), or `import keras` (Keras 3) in the "
                               "builder's module instead of tf.keras")

