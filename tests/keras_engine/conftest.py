"""The keras engine's tests run under current TensorFlow with tf-keras (the `.venv-keras` of the README's
test command: `pytest tests/keras_engine`); under TensorFlow 2.15 they are not collected."""

import os

from tpulaunch.engine.choice import missing_for

# As `tpulaunch` sets it before importing TensorFlow: tf.keras is then tf-keras (Keras 2).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

collect_ignore_glob = ["test_*.py"] if missing_for("keras") else []
