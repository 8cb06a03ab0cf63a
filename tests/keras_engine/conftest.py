"""The keras engine's tests run under current TensorFlow with tf-keras (the `.venv-keras` of the README's
test command: `pytest tests/keras_engine`); under TensorFlow 2.15 (the estimator engine's `.venv`, which runs the
whole tests/ folder) they are not collected. Anywhere else they are: a package the keras engine needs that is
missing there fails them instead of hiding them."""

import os

from tpulaunch.engine.installed import installed_tensorflow
from tpulaunch.engine.registry import runs_on
from tpulaunch.tf_env import set_engine_environment

_tensorflow = installed_tensorflow()
if _tensorflow is not None and not runs_on("keras", _tensorflow):
    collect_ignore_glob = ["test_*.py"]
else:
    set_engine_environment()  # as `tpulaunch` does before importing TensorFlow: tf.keras is then tf-keras (Keras 2)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
