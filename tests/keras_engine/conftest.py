"""The keras engine's tests run under current TensorFlow with tf-keras (the `.venv-keras` of the README's
test command: `pytest tests/keras_engine`); under TensorFlow 2.15 (the estimator engine's `.venv`, which runs the
whole tests/ folder) they are not collected. Anywhere else they are: a package the keras engine needs that is
missing there fails them instead of hiding them."""

import os

from tpulaunch.seam.registry import installed, runnable
from tpulaunch.tf_env import set_engine_environment

if installed("keras") is not None and not runnable("keras"):
    collect_ignore_glob = ["test_*.py"]
else:
    set_engine_environment()  # as `tpulaunch` does before importing TensorFlow: tf.keras is then tf-keras (Keras 2)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
