"""How long each training step waits for its input batch, measured inside the step's own graph (CPU/GPU).

`timed_input_fn` wraps an input_fn whose result is a `tf.data.Dataset`: it makes the dataset's
iterator itself (as the Estimator would: an initializable one, which the progress hook initialises
when a session is created, as the Estimator's own dataset hook does) and brackets `get_next()` with
two `tf.timestamp()` ops, so the step reads

    t0 = timestamp()  ->  batch = get_next()  (after t0)  ->  t1 = timestamp()  (after the batch)

and `t1 - t0` is the time this step spent blocked on the input pipeline: near zero while prefetched
batches wait in the buffer, the whole shortfall when the pipeline cannot keep up. The difference is a
scalar in the `INPUT_WAIT` collection, which the progress hook fetches with each session run. Three
tiny ops per step, no Python in the step (a `py_function` would cost a round trip through Python).

On a TPU the input pipeline runs in TPUEstimator's infeed threads, outside the step: nothing here
applies, and the run's input share stays unknown (`tpulaunch data bench` compares the pipeline with
the recorded step rate instead). An input_fn that returns tensors rather than a dataset is not timed.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

INPUT_WAIT = "tpulaunch_input_wait_seconds"
INPUT_INITIALIZER = "tpulaunch_input_initializer"


def timed_input_fn(input_fn: Callable) -> Callable:
    """`input_fn`, returning its dataset's next batch with the wait for it measured (see the module)."""

    from tensorflow.python.util import function_utils  # TPUEstimator's own reading of an input_fn's arguments

    takes = function_utils.fn_args(input_fn)

    def timed(params, mode=None, config=None):
        # TPUEstimator passes `mode` and `config` to a function that names them: hand on what input_fn names.
        given = {name: value for name, value in (("mode", mode), ("config", config)) if name in takes}
        result = input_fn(params=params, **given)  # by name, as TPUEstimator calls it (a partial may bind others)
        if not isinstance(result, tf.data.Dataset):
            return result
        iterator = tf.compat.v1.data.make_initializable_iterator(result)
        tf.compat.v1.add_to_collection(INPUT_INITIALIZER, iterator.initializer)
        began = tf.timestamp(name="input_wait_began")
        with tf.control_dependencies([began]):
            batch = iterator.get_next()
        with tf.control_dependencies([t for t in tf.nest.flatten(batch) if t is not None]):
            wait = tf.subtract(tf.timestamp(name="input_wait_ended"), began, name="input_wait")
        tf.compat.v1.add_to_collection(INPUT_WAIT, wait)
        return batch

    return timed


def input_wait_tensor():
    """The current graph's input-wait scalar, or None when its input is not timed."""
    waits = tf.compat.v1.get_collection(INPUT_WAIT)
    return waits[-1] if waits else None


def input_initializers() -> list:
    """The ops that start the timed input's iterator: run them in each new session, before its first step."""
    return tf.compat.v1.get_collection(INPUT_INITIALIZER)
