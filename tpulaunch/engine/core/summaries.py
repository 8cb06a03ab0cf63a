"""TensorBoard events of a keras- or jax-engine run, where TPUEstimator writes its own on the estimator engine and
under the same names: at each log point `loss` (the loss `train` prints: the mean over the steps since the last log
point), `global_step/sec` and `examples/sec` in model_dir; each evaluation's metrics in model_dir/eval. Only the chief
writes (a multi-worker run's other processes do not), each writer to an events file of its own (TensorFlow names it
by host, process and time), so a run never writes into another's. Learning rates are not written.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional


class TensorBoardEvents:
    """A RunRecorder subscriber writing its steps and evaluations as TensorBoard scalars."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
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
            self._scalars(self.model_dir, event.step, {"loss": event.loss, "global_step/sec": event.steps_per_sec,
                                                       "examples/sec": event.examples_per_sec})
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
