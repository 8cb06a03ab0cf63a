"""A checkpoint whose data shard is cut inside its string tensors (the object graph a Keras checkpoint carries): its
numbers are all there, so only reading it tells; TensorFlow's reader then raises IndexError ("Read less bytes than
requested"), which the fault campaign met as a crash. It is a damaged checkpoint like any other: passed over, named."""

from __future__ import annotations

import pytest
import tensorflow as tf

from tpulaunch.engine.core.checkpoints import checkpoint_problem, latest_complete_checkpoint


def test_a_data_shard_cut_inside_its_strings_is_a_problem_not_a_crash(tmp_path):
    checkpoint = tf.train.Checkpoint(weights=tf.Variable(tf.ones([4])), name=tf.Variable("x" * 1000))
    good = checkpoint.write(str(tmp_path / "model.ckpt-1"))
    cut = checkpoint.write(str(tmp_path / "model.ckpt-2"))
    (data,) = tmp_path.glob("model.ckpt-2.data-*")
    with open(data, "r+b") as handle:
        handle.truncate(data.stat().st_size - 500)  # the floats whole, the string cut
    problem = checkpoint_problem(cut)
    assert problem is not None and "IndexError" in problem, problem
    assert checkpoint_problem(good) is None
    assert latest_complete_checkpoint(str(tmp_path)) == (good, 1)
