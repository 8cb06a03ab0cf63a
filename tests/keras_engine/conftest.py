"""The keras engine's tests run under current TensorFlow with tf-keras (the `.venv-keras` of the README's
test command: `pytest tests/keras_engine`); under TensorFlow 2.15 they are not collected."""

import os

from tpulaunch.engine.registry import missing_for
from tpulaunch.tf_env import set_engine_environment

if missing_for("keras"):
    collect_ignore_glob = ["test_*.py"]
else:
    set_engine_environment()  # as `tpulaunch` does before importing TensorFlow: tf.keras is then tf-keras (Keras 2)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
