"""TensorFlow's log noise, set once per process before TensorFlow is imported.

TensorFlow prints C++ start-up lines and Python deprecation warnings that bury tpulaunch's own output:
errors only by default, warnings with -v, everything with -vv.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile

_level = 40  # logging.ERROR; `logging` itself is imported only when a command starts (`--help` never needs it)


def quiet_tensorflow(verbose: int = 0) -> None:
    """Must run before TensorFlow is imported: the C++ level is read once, at import."""
    import logging

    set_engine_environment()

    global _level
    if verbose >= 2:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0")
        _level = logging.INFO
    else:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        _level = logging.WARNING if verbose == 1 else logging.ERROR
    for name in ("tensorflow", "absl"):
        logging.getLogger(name).setLevel(_level)
    if "tensorflow" in sys.modules:
        sys.modules["tensorflow"].get_logger().setLevel(_level)


def set_engine_environment() -> None:
    """What the engines the installed TensorFlow runs need in the environment before TensorFlow is imported
    (each engine's `EngineAbout.environment`; on TensorFlow 2.16+, TF_USE_LEGACY_KERAS, so tf.keras is Keras 2)."""
    from tpulaunch.seam.registry import set_environment

    set_environment()


def import_tensorflow():
    """`import tensorflow`, keeping the chosen log level (TensorFlow resets its logger on import).

    TensorFlow 2.16 and later print start-up lines (oneDNN, CUDA probes) through C++ logging that is not yet
    initialized, so TF_CPP_MIN_LOG_LEVEL does not hold them back: below -vv they are kept off the terminal
    while TensorFlow loads and finds its devices, and shown if that fails.
    """
    import logging

    if "tensorflow" in sys.modules or _level <= logging.INFO:
        import tensorflow as tf
    else:
        with _startup_lines_held():
            import tensorflow as tf

            tf.config.list_physical_devices()  # the device probe's lines (cuInit) come now, not at the first op
    tf.get_logger().setLevel(_level)
    return tf


@contextlib.contextmanager
def _startup_lines_held():
    """Send what C++ code writes to stderr to a scratch file; write it out only if the block fails."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


# A dry run must answer in seconds: TensorFlow's GCS filesystem retries an unreachable endpoint for
# about 200 s by default. These apply to `validate` only (training keeps TensorFlow's patient
# defaults), are read when the process first uses gs://, and yield to values the user sets.
DRY_RUN_GCS_RETRIES = {"GCS_RETRY_CONFIG_MAX_RETRIES": "3", "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "500000",
                       "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "2000000"}


def bound_gcs_retries() -> None:
    """Quick failure on unreachable gs:// for checks (call before the first gs:// access)."""
    for name, value in DRY_RUN_GCS_RETRIES.items():
        os.environ.setdefault(name, value)


_collection_skipped_at_exit = False


def skip_collection_at_exit() -> None:
    """At this process's exit, spare the garbage collector its walk over everything still alive. CPython collects
    cycles again and again while it clears a process's modules; with TensorFlow, Keras or JAX loaded that walk over
    millions of objects took 2 s after a `tpulaunch train`'s last line on an idle machine, and twice that on a busy
    one (benchmarks/exit_time.py). `gc.freeze()`, run first among the exit handlers, moves them out of the
    collector's reach: they are still freed as their references go, files still flushed and closed, the other exit
    handlers still run."""
    import atexit
    import gc

    global _collection_skipped_at_exit
    if not _collection_skipped_at_exit:
        atexit.register(gc.freeze)  # last registered, first run: before any handler that tears down
        _collection_skipped_at_exit = True
