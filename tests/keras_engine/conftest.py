"""The keras engine's tests run under current TensorFlow with tf-keras (the `.venv-keras` of the README's
test command: `pytest tests/keras_engine`); under TensorFlow 2.15 they are not collected."""

from tpulaunch.engine.choice import missing_for

collect_ignore_glob = ["test_*.py"] if missing_for("keras") else []
