"""Which Keras the reference models are built with: the one the job's engine trains, so one job file runs on
every engine with only `run.engine` changed.

The jax engine trains Keras 3 on JAX and sets KERAS_BACKEND=jax in its own process before anything imports Keras
(`engine/jax/about.py`'s `process_environment`); the estimator and keras engines train tf.keras (TensorFlow 2.15's
own, or tf-keras where the keras engine sets TF_USE_LEGACY_KERAS). The engines tell a model's Keras by its classes
(`engine/portable.py`'s `keras_of`), so the model must be built with that Keras.
"""

from __future__ import annotations

import os


def keras3() -> bool:
    """True where this process trains Keras 3 on JAX (the jax engine)."""
    return os.environ.get("KERAS_BACKEND") == "jax"


def keras():
    """The Keras package to build with: Keras 3 under KERAS_BACKEND=jax, else tf.keras."""
    if keras3():
        import keras as keras_3

        return keras_3
    import tensorflow as tf

    return tf.keras

