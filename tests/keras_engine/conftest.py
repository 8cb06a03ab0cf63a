"""The keras engine's tests need its environment: current TensorFlow with tf-keras (the `keras` session of
noxfile.py). Anywhere else they stop before collecting, saying so: never a silent skip."""

import os

import pytest

from tpulaunch.seam.registry import runnable
from tpulaunch.tf_env import set_engine_environment

if not runnable("keras"):
    raise pytest.UsageError("tests/keras_engine needs the keras engine's environment (TensorFlow 2.16 or later with "
                            "tf-keras): run them with `nox -s keras`")
set_engine_environment()  # as `tpulaunch` does before importing TensorFlow: tf.keras is then tf-keras (Keras 2)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
