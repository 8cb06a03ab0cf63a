"""TensorFlow's callbacks during a TPUEstimator run, turned into run events and stop requests.

The SessionRunHooks and the CheckpointSaverListener here tell a `run.events.RunRecorder` what
happened (a session began, a session run ended at a step with a loss, a checkpoint was saved,
records were skipped); the stop hooks end a session when a signal arrived or the TPU was lost. This
module imports TensorFlow: the runner imports it inside the functions that train and evaluate.
"""

from __future__ import annotations

import os
import re
from typing import Callable, Optional

import tensorflow as tf

from tpulaunch.run.events import RunRecorder

_TPU_WORDS = re.compile(r"\btpu|socket|connection", re.IGNORECASE)


class ProgressHook(tf.compat.v1.train.SessionRunHook):
    """Feeds a recorder the global step and the loss after each session run.

    `steps_per_run` is how far one session run moves the global step (iterations_per_loop on a TPU):
    the step fetched with a run may predate its update, so the exact step is read (one more tiny
    session run) only when the recorder is at a log point.
    """

    def __init__(self, recorder: RunRecorder, steps_per_run: int = 1):
        self._recorder = recorder
        self._steps_per_run = steps_per_run

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()
        # Like TF's own step hooks: the read the model_fn is built after, i.e. before the update.
        reads = tf.compat.v1.get_collection("global_step_read_op_cache")
        stale = reads[0] if reads else self._global_step
        # The Estimator puts the spec's loss (on a TPU: the loss out of the loop) last in LOSSES.
        losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
        self._fetches = [stale] + ([losses[-1]] if losses else [])

    def after_create_session(self, session, coord):
        self._recorder.session_began(int(session.run(self._global_step)))

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context, run_values):
        results = run_values.results
        step = int(results[0]) + self._steps_per_run
        if self._recorder.wants_exact_step(step):
            step = int(run_context.session.run(self._global_step))
        self._recorder.steps_run(step, float(results[1]) if len(results) > 1 else None)

    def end(self, session):
        self._recorder.session_ended()


class CheckpointListener(tf.compat.v1.train.CheckpointSaverListener):
    """Tells a recorder each checkpoint the Estimator saved, as `model_dir/model.ckpt-STEP`."""

    def __init__(self, recorder: RunRecorder, model_dir: Optional[str]):
        self._recorder = recorder
        self._model_dir = model_dir

    def after_save(self, session, global_step_value):
        step = int(global_step_value)
        path = os.path.join(self._model_dir, f"model.ckpt-{step}") if self._model_dir else None
        self._recorder.checkpoint_saved(step, path)


class SkippedRecordsHook(tf.compat.v1.train.SessionRunHook):
    """Reports the sum of the input pipelines' skip counters (data.skip_corrupt): on_count(count, session_ended).

    The counters are the ones `tpulaunch.data.pipeline` keeps in the graph (one per input pipeline:
    one per host on a TPU slice). In a graph without counters (no data.skip_corrupt, or the job's own
    input_fn) nothing is counted, and nothing is reported.
    """

    def __init__(self, on_count: Callable[[int, bool], None], on_begin: Optional[Callable[[], None]] = None):
        self._on_count = on_count
        self._on_begin = on_begin
        self._total = None

    def begin(self):
        from tpulaunch.data.pipeline import SKIPPED_RECORDS

        counters = tf.compat.v1.get_collection(SKIPPED_RECORDS)
        self._total = tf.add_n([c.read_value() for c in counters]) if counters else None

    def after_create_session(self, session, coord):
        # Also after MonitoredSession recreates a session (Aborted/Unavailable): the counters and
        # the input pipeline start again from zero then.
        if self._total is not None and self._on_begin is not None:
            self._on_begin()

    def before_run(self, run_context):
        return None if self._total is None else tf.compat.v1.train.SessionRunArgs(self._total)

    def after_run(self, run_context, run_values):
        if self._total is not None:
            self._on_count(int(run_values.results), False)

    def end(self, session):
        if self._total is not None:
            self._on_count(int(session.run(self._total)), True)


class RequestStopHook(tf.compat.v1.train.SessionRunHook):
    """Asks the session to stop after any run where `should_stop()` is true.

    The session then ends as after its last step: the Estimator's CheckpointSaverHook saves at the
    current step. Ctrl-C/SIGTERM and the TPU watchdog stop training this way.
    """

    def __init__(self, should_stop: Callable[[], bool]):
        self._should_stop = should_stop

    def after_run(self, run_context, run_values):
        if self._should_stop():
            run_context.request_stop()


class EvaluationInterrupted(Exception):
    """An evaluation was abandoned after a session run because a stop was asked for."""


class InterruptEvaluationHook(tf.compat.v1.train.SessionRunHook):
    """Abandons an evaluation after any run where `should_stop()` is true, by raising EvaluationInterrupted.

    Not `request_stop`: the Estimator would then report (and write to model_dir/eval) the metrics of
    the batches seen so far as if the evaluation were complete.
    """

    def __init__(self, should_stop: Callable[[], bool]):
        self._should_stop = should_stop

    def after_run(self, run_context, run_values):
        if self._should_stop():
            raise EvaluationInterrupted()


def progress_hooks(recorder: RunRecorder, *, steps_per_run: int = 1, model_dir: Optional[str] = None):
    """(SessionRunHook, CheckpointSaverListener) feeding `recorder` from a TPUEstimator's train."""
    return ProgressHook(recorder, steps_per_run), CheckpointListener(recorder, model_dir)


def skipped_records_hook(recorder: RunRecorder) -> SkippedRecordsHook:
    """A SessionRunHook telling `recorder` how many records the training input pipelines skipped.

    The counters start at 0 in each session, so the recorder adds sessions up.
    """
    return SkippedRecordsHook(lambda count, ended: recorder.records_skipped(count, session_ended=ended),
                              recorder.skip_counting_began)


def skipped_records_counter():
    """(hook, count): a SessionRunHook for one evaluation, and a function giving the records its input
    pipelines skipped under data.skip_corrupt (None before the evaluation ran, or when nothing counts)."""
    seen: dict = {}
    hook = SkippedRecordsHook(lambda count, ended: seen.__setitem__("count", count))
    return hook, lambda: seen.get("count")


def is_lost_tpu_error(exc: BaseException) -> bool:
    """Whether a TensorFlow error is what a TPU that went away raises."""
    if isinstance(exc, (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.DeadlineExceededError)):
        return True
    if isinstance(exc, tf.errors.InternalError):
        return bool(_TPU_WORDS.search(str(getattr(exc, "message", exc))))
    return False
