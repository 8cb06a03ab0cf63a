"""TensorBoard events of a keras- or jax-engine run, where TPUEstimator writes its own on the estimator engine and
under the same names: at each log point `loss` (the loss `train` prints: the mean over the steps since the last log
point), `global_step/sec` and `examples/sec` in model_dir, and `train/learning_rate` (as the estimator engine's
model_fn names it: the rate the optimizer applied at that step, its schedule's value where it has one); each
evaluation's metrics in model_dir/eval. Only the chief writes (a multi-worker run's other processes do not), each
writer to an events file of its own (TensorFlow names it by host, process and time), so a run never writes into
another's.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator, Optional

LEARNING_RATE = "train/learning_rate"


class TensorBoardEvents:
    """A RunRecorder subscriber writing its steps and evaluations as TensorBoard scalars; `learning_rate`, set by the
    engine's session, tells the rate its optimizer applied at the last step (None: none is written)."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self.learning_rate: Optional[Callable[[], Optional[float]]] = None
        self._writers: dict = {}

    def _writer(self, folder: str):
        import tensorflow as tf

        if folder not in self._writers:
            self._writers[folder] = tf.summary.create_file_writer(folder)
        return self._writers[folder]

    def _scalars(self, folder: str, step: int, values: dict) -> None:
        import tensorflow as tf
        from tensorflow.core.framework import summary_pb2

        # tf.summary.write with the scalars plugin's metadata is what TensorBoard's tf.summary.scalar writes; it needs
        # no tensorboard package (TensorFlow 2.16 and later do not install one).
        metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
        writer = self._writer(folder)
        with writer.as_default():
            for name, value in values.items():
                if value is not None:
                    tf.summary.write(name, tf.constant(float(value), tf.float32), step=step, metadata=metadata)
        writer.flush()  # a run stopped at any moment leaves its curves up to its last log point

    def __call__(self, event) -> None:
        from tpulaunch.run.events import EvalResult, RunClosed, StepsLogged

        if isinstance(event, StepsLogged):
            self._scalars(self.model_dir, event.step, {
                "loss": event.loss, "global_step/sec": event.steps_per_sec, "examples/sec": event.examples_per_sec,
                LEARNING_RATE: self.learning_rate() if self.learning_rate is not None else None})
        elif isinstance(event, EvalResult):
            self._scalars(os.path.join(self.model_dir, "eval"), event.step, event.metrics)
        elif isinstance(event, RunClosed):
            self.close()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


@contextlib.contextmanager
def tensorboard_events(recorder, model_dir: str, writes_model_dir: bool) -> Iterator[Optional[TensorBoardEvents]]:
    """For the block, the run's steps and evaluations written as TensorBoard events by its chief (not by the other
    workers of a multi-worker run); the files closed however the block ends."""
    events = TensorBoardEvents(model_dir) if writes_model_dir else None
    if events is not None:
        recorder.subscribe(events)
    try:
        yield events
    finally:
        if events is not None:
            events.close()


def applied_learning_rate(optimizer) -> Optional[float]:
    """The learning rate a Keras optimizer (either Keras; a loss-scale wrapper's inner one) applied at its last
    update: its schedule at the iteration before its count, else its rate; None when it tells none."""
    import numpy as np

    optimizer = getattr(optimizer, "inner_optimizer", None) or optimizer
    rate = getattr(optimizer, "_learning_rate", None)
    if rate is None:
        rate = getattr(optimizer, "learning_rate", None)
    if rate is None:
        return None
    if any(cls.__name__ == "LearningRateSchedule" for cls in type(rate).__mro__):
        iterations = int(np.asarray(optimizer.iterations))
        return float(np.asarray(rate(max(iterations - 1, 0))))
    if callable(rate) and not hasattr(rate, "__array__"):  # a function of no arguments, as Keras 3 takes one
        rate = rate()
    return float(np.asarray(rate))
