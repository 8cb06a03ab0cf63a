"""A lost TPU, for both engines: which TensorFlow errors mean the TPU went away."""

from __future__ import annotations

import re

# An InternalError is a lost TPU only when its message speaks of the TPU or its connection.
_TPU_WORDS = re.compile(r"\btpu|socket|connection", re.IGNORECASE)


def is_lost_tpu_error(exc: BaseException) -> bool:
    """Whether a TensorFlow error is what a TPU that went away raises."""
    import tensorflow as tf

    if isinstance(exc, (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.DeadlineExceededError)):
        return True
    if isinstance(exc, tf.errors.InternalError):
        return bool(_TPU_WORDS.search(str(getattr(exc, "message", exc))))
    return False

