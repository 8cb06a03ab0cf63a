"""The run record file in model_dir, through TensorFlow's filesystem (model_dir may be gs://)."""

from __future__ import annotations

import os
from typing import List

import tensorflow as tf

from tpulaunch.run.record import RECORD_FILE


def append_record(model_dir: str, line: str) -> str:
    """Append one line to model_dir/tpulaunch-runs.jsonl (made with model_dir when missing); returns its path.

    On gs:// TensorFlow's filesystem appends by rewriting the object: fine for a file of one line per run.
    """
    path = os.path.join(model_dir, RECORD_FILE)
    if not tf.io.gfile.isdir(model_dir):  # a run that failed before making it
        tf.io.gfile.makedirs(model_dir)
    with tf.io.gfile.GFile(path, "a") as handle:
        handle.write(line)
    return path


def record_lines(model_dir: str) -> List[str]:
    """The lines of model_dir/tpulaunch-runs.jsonl; none when there is no such file."""
    path = os.path.join(model_dir, RECORD_FILE)
    if not tf.io.gfile.exists(path):
        return []
    with tf.io.gfile.GFile(path) as handle:
        return handle.read().splitlines()
