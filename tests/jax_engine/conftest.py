"""The jax engine's tests need its environment: Keras 3 on JAX, TensorFlow for tf.data (the `jax` session of
noxfile.py). Anywhere else they stop before collecting, saying so: never a silent skip."""

import os

import pytest

from tpulaunch.seam.registry import runnable
from tpulaunch.tf_env import set_engine_environment

if not runnable("jax"):
    raise pytest.UsageError("tests/jax_engine needs the jax engine's environment (JAX, Keras 3 and "
                            "TensorFlow 2.16 or later): run them with `nox -s jax`")
set_engine_environment()  # as `tpulaunch` does before importing TensorFlow: tf.keras is then tf-keras (Keras 2)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
