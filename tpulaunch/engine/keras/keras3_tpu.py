"""What `validate` says of a Keras 3 model for a TPU target (a `tpu:` job not checked with --local).

Read in the installed sources (Keras 3.15, TensorFlow 2.21): Keras 3's TensorFlow trainer runs its own
steps under `tf.distribute.TPUStrategy` (`backend/tensorflow/trainer.py`: `reduce_per_replica` and the
multi-host ordering take TPUStrategy paths), and its optimizer updates distributed variables through
`distribution.extended.update` in a merge call, as tf-keras's does; the keras engine's step is built the
same way (`strategy.run`, GradientTape, `apply_gradients` in the replica). So a TPU run is Keras 3's own
supported path, and is not refused. What cannot be checked here is the Keras the TPU VM has: the TPU
install (tensorflow-tpu 2.19) asks only keras>=3.5, and some Keras 3 releases failed on TPUStrategy
(keras-team/keras#20700: distributed variables of integer dtype with a MEAN aggregation, 3.7-3.8;
#20601: the synchronization of metric variables on TPU). Hence a warning naming the Keras checked here
and the way to pin it, never a silent difference between the run and this check.
"""

from __future__ import annotations

from importlib import metadata


def problems(loaded, plan, keras3: bool) -> list:
    """A warning at model.builder for a Keras 3 model on a TPU target; nothing otherwise."""
    if not keras3 or not plan.on_tpu:
        return []
    version = metadata.version("keras")
    return [loaded.problem(
        ("model", "builder"), "keras3-on-tpu",
        f"the builder returns a Keras 3 model, checked here with Keras {version}: the TPU VM trains it with its own "
        f"Keras, and some Keras 3 releases fail on TPUStrategy (keras-team/keras#20700, #20601)",
        f"install keras=={version} on the TPU VM beside tensorflow-tpu, and compare the run's first evaluation with "
        f"`tpulaunch evaluate --local` on the same checkpoint (or write the model with tf-keras)",
        severity="warning")]
