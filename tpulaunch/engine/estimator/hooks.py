"""TensorFlow's callbacks during a TPUEstimator run, turned into run events and stop requests.

The SessionRunHooks and the CheckpointSaverListener here tell a `run.events.RunRecorder` what
happened (the phases of a training session, a session run ended at a step with a loss and a wait for
input, a checkpoint was saved, records were skipped); the stop hooks end a session when a signal
arrived or the TPU was lost; the profile hook captures a TensorBoard profile of chosen steps. This
module imports TensorFlow: the runner imports it inside the functions that train and evaluate.
"""

from __future__ import annotations

import math
import numbers
import os
import threading
from typing import Callable, Optional, Tuple

import tensorflow as tf
from tensorflow.python.client.session import SessionInterface

from tpulaunch.engine import portable
from tpulaunch.engine.core.checkpoints import step_in_name
from tpulaunch.engine.core.loop import NonFiniteLoss
from tpulaunch.engine.core.staged_save import staged_write
from tpulaunch.engine.estimator.input_wait import input_initializers, input_wait_tensor
from tpulaunch.errors import TpuLaunchError
from tpulaunch.run import phases
from tpulaunch.run.events import RunRecorder
from tpulaunch.run.lease import ensure_held, raise_if_lost



class ProgressHook(tf.compat.v1.train.SessionRunHook):
    """Feeds a recorder the phases of a training session, and the global step, the loss and the wait
    for input after each session run (starting the timed input's iterator with each session).

    The graph is built when `begin` runs: from there the session is restored (or initialised) until
    the first run is asked for, which is the first step (on a TPU: after the TPU system started, with
    XLA's compile), and training from its end until the session closes. The recorder's session begins
    with that first run.

    `steps_per_run` is how far one session run moves the global step (iterations_per_loop on a TPU):
    the step fetched with a run may predate its update, so the exact step is read (one more tiny
    session run) only when the recorder is at a log point.
    """

    def __init__(self, recorder: RunRecorder, steps_per_run: int = 1, model_dir: Optional[str] = None,
                 on_tpu: bool = False):
        self._recorder = recorder
        self._steps_per_run = steps_per_run
        self._model_dir = model_dir
        self._on_tpu = on_tpu
        self._start_step: Optional[int] = None

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()
        # Like TF's own step hooks: the read the model_fn is built after, i.e. before the update.
        reads = tf.compat.v1.get_collection("global_step_read_op_cache")
        stale = reads[0] if reads else self._global_step
        # The Estimator puts the spec's loss (on a TPU: the loss out of the loop) last in LOSSES.
        losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
        self._fetches = {"step": stale}
        if losses:
            self._fetches["loss"] = losses[-1]
        wait = input_wait_tensor()
        if wait is not None:
            self._fetches["input_wait"] = wait
        self._input_initializers = input_initializers()
        restoring = bool(self._model_dir and tf.train.latest_checkpoint(self._model_dir))
        self._recorder.phase_switch(phases.RESTORE if restoring else phases.INITIALISE)

    def after_create_session(self, session, coord):
        # The timed input's iterator starts with each session (also one MonitoredSession recreates).
        if self._input_initializers:
            session.run(self._input_initializers)
        # Other hooks' after_create_session (TPU system start, the first checkpoint) still follow.
        self._start_step = int(session.run(self._global_step))
        if self._start_step < self._recorder.step:  # a session TensorFlow recreated: never trained from scratch
            raise went_back(self._start_step, self._recorder.step)

    def before_run(self, run_context):
        if self._start_step is not None:
            self._recorder.phase_switch(phases.FIRST_STEP, "XLA compiles the TPU program" if self._on_tpu else None)
            self._recorder.session_began(self._start_step)
            self._start_step = None
        return tf.compat.v1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context, run_values):
        results = run_values.results
        step = int(results["step"]) + self._steps_per_run
        if self._recorder.wants_exact_step(step):
            step = int(run_context.session.run(self._global_step))
        if self._recorder.phases.open_phases()[-1:] == [phases.FIRST_STEP]:
            self._recorder.phase_switch(phases.TRAINING)
        wait = results.get("input_wait")
        loss = float(results["loss"]) if "loss" in results else None
        self._recorder.steps_run(step, loss, float(wait) if wait is not None else None)
        if loss is not None and not math.isfinite(loss):  # NaN or Inf: TensorFlow's NanTensorHook sees NaN only
            raise NonFiniteLoss(step, loss)

    def end(self, session):
        opened = [name for name in self._recorder.phases.open_phases() if name in _SESSION_PHASES]
        if opened:  # training, or the phase a session that stopped early was still in
            self._recorder.phase_ended(opened[0])
        self._recorder.session_ended()
        # The last checkpoint and TensorFlow's session close follow (the runner's phase scope ends it).
        self._recorder.phase_began(phases.CLOSE)


_SESSION_PHASES = (phases.INITIALISE, phases.RESTORE, phases.FIRST_STEP, phases.TRAINING)


class CheckpointListener(tf.compat.v1.train.CheckpointSaverListener):
    """Tells a recorder each checkpoint the Estimator saved, as `model_dir/model.ckpt-STEP`, and the
    checkpoint phase while it is written.

    Before each save (the CheckpointSaverHook's, at a session's start, every save_checkpoints_steps and at
    its end) it checks that this run still holds model_dir's lease: a run another run took it over from
    raises `LeaseLost` there, and the save does not happen."""

    def __init__(self, recorder: RunRecorder, model_dir: Optional[str]):
        self._recorder = recorder
        self._model_dir = model_dir

    def begin(self):
        # The Estimator makes its Saver itself (after the model_fn, with the RunConfig's settings) and puts it in
        # the SAVERS collection, whence the CheckpointSaverHook takes it: made a StagedSaver in place, it keeps
        # every one of those settings. A model_fn's own Saver (in its scaffold, not the collection) is left as is.
        if self._model_dir:
            for saver in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS):
                if type(saver) is tf.compat.v1.train.Saver:
                    saver.__class__ = StagedSaver

    def before_save(self, session, global_step_value):
        if self._model_dir:
            ensure_held(self._model_dir)
        self._recorder.phase_began(phases.CHECKPOINT)

    def after_save(self, session, global_step_value):
        self._recorder.phase_ended(phases.CHECKPOINT)
        step = int(global_step_value)
        path = os.path.join(self._model_dir, f"model.ckpt-{step}") if self._model_dir else None
        self._recorder.checkpoint_saved(step, path)


class StagedSaver(tf.compat.v1.train.Saver):
    """TensorFlow's Saver, writing each checkpoint (its meta graph included) under a staging prefix and moving it
    into model_dir only while the run holds the lease (`engine/core/staged_save`): a run frozen mid-save that
    thaws fenced leaves its successor's checkpoints untouched. The state file and the deletion of old checkpoints
    are the Saver's own, but its state file is written to a temporary name and renamed only after a third reread
    (`portable.write_checkpoint_state`), and old checkpoints are deleted only after a fourth."""

    def save(self, sess, save_path, global_step=None, latest_filename=None, meta_graph_suffix="meta",
             write_meta_graph=True, write_state=True, strip_default_attrs=False, save_debug_info=False):
        if tf.executing_eagerly() or self.saver_def is None:
            return super().save(sess, save_path, global_step, latest_filename, meta_graph_suffix, write_meta_graph,
                                write_state, strip_default_attrs, save_debug_info)

        def write_meta_graph_to(staged: str) -> None:  # staged with the checkpoint's files, moved with them
            if write_meta_graph:
                with sess.graph.as_default():
                    self.export_meta_graph(f"{staged}.{meta_graph_suffix}", strip_default_attrs=strip_default_attrs,
                                           save_debug_info=save_debug_info)

        self._model_dir = model_dir = os.path.dirname(save_path)
        # A session TensorFlow recreated after an error (MonitoredSession's recovery from an AbortedError: a save
        # that Cloud Storage failed) restores through the checkpoint state; when that read fails too it initialises
        # afresh, and its saves would name lower steps and delete the good checkpoints. Stopped here, first.
        step = None if global_step is None else int(global_step) if isinstance(global_step, numbers.Integral) else int(
            tf.compat.v1.train.global_step(sess, global_step))
        newest = max((step_in_name(path) or 0 for path in self.last_checkpoints), default=None)
        if step is not None and newest is not None and step < newest:
            raise went_back(step, newest)
        if latest_filename not in (None, "checkpoint"):  # (never from an Estimator) the state file is TensorFlow's
            raise ValueError(f"a StagedSaver writes model_dir's checkpoint state only, not {latest_filename!r}")
        staged_session = _StagedSaveSession(sess, self.saver_def, write_meta_graph_to)
        path = super().save(staged_session, save_path, global_step, latest_filename, meta_graph_suffix,
                            write_meta_graph=False, write_state=False, strip_default_attrs=strip_default_attrs,
                            save_debug_info=save_debug_info)
        if write_state and path is not None:  # as the Saver does, but the state file written fenced
            self._RecordLastCheckpoint(path)
            portable.write_checkpoint_state(model_dir, path, self.last_checkpoints, fence=lambda: ensure_held(model_dir))
            self._MaybeDeleteOldCheckpoints(meta_graph_suffix=meta_graph_suffix)
        return path

    def _MaybeDeleteOldCheckpoints(self, meta_graph_suffix="meta"):  # noqa: N802 (TensorFlow's name)
        if getattr(self, "_model_dir", None):  # a run frozen while naming its checkpoint deletes none of its successor's
            ensure_held(self._model_dir)
            # What a copied or moved state names elsewhere is never deleted from here.
            self._last_checkpoints = [entry for entry in self._last_checkpoints
                                      if portable.name_in(self._model_dir, entry[0])]
        super()._MaybeDeleteOldCheckpoints(meta_graph_suffix)


def went_back(step: int, newest: int) -> TpuLaunchError:
    """The error of a training session that TensorFlow recreated at a lower step than the run had reached."""
    return TpuLaunchError(
        f"training went back to step {step} after step {newest}: TensorFlow recreated its training session after an "
        "error and could not restore model_dir's newest checkpoint (reading its checkpoint state failed: is "
        "model_dir's storage reachable?); stopped before training or saving over the checkpoints",
        hint="rerun the same command once model_dir's storage answers: it resumes from the newest complete "
             "checkpoint")


class _StagedSaveSession(SessionInterface):  # the Saver checks for a SessionInterface
    """The session a StagedSaver saves through: its one run of the save op writes to a staging prefix (the
    filename is fed), then `also(staged_prefix)` writes beside it; it returns the checkpoint's real prefix once
    the files are moved there."""

    def __init__(self, session, saver_def, also: Callable[[str], None]):
        self._session = session
        self._filename = saver_def.filename_tensor_name
        self._save = saver_def.save_tensor_name
        self._also = also

    @property
    def graph(self):
        return self._session.graph

    @property
    def sess_str(self):
        return self._session.sess_str

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        if fetches != self._save or not feed_dict or self._filename not in feed_dict:
            return self._session.run(fetches, feed_dict, options, run_metadata)
        prefix = feed_dict[self._filename]
        prefix = prefix.decode() if isinstance(prefix, bytes) else prefix

        def write(staged: str) -> None:
            self._session.run(fetches, {**feed_dict, self._filename: staged}, options, run_metadata)
            self._also(staged)

        return staged_write(write, prefix)

    def partial_run_setup(self, *args, **kwargs):
        return self._session.partial_run_setup(*args, **kwargs)

    def partial_run(self, *args, **kwargs):
        return self._session.partial_run(*args, **kwargs)


class SkippedRecordsHook(tf.compat.v1.train.SessionRunHook):
    """Reports the sum of the input pipelines' skip counters (data.skip_corrupt): on_count(count, session_ended).

    The counters are the ones `tpulaunch.engine.pipeline` keeps in the graph (one per input pipeline:
    one per host on a TPU slice). In a graph without counters (no data.skip_corrupt, or the job's own
    input_fn) nothing is counted, and nothing is reported.
    """

    def __init__(self, on_count: Callable[[int, bool], None], on_begin: Optional[Callable[[], None]] = None):
        self._on_count = on_count
        self._on_begin = on_begin
        self._total = None

    def begin(self):
        from tpulaunch.engine.pipeline import SKIPPED_RECORDS

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
    current step. Ctrl-C/SIGTERM/SIGHUP and the TPU watchdog stop training this way.
    """

    def __init__(self, should_stop: Callable[[], bool]):
        self._should_stop = should_stop

    def after_run(self, run_context, run_values):
        if self._should_stop():
            run_context.request_stop()


class LeaseLostHook(tf.compat.v1.train.SessionRunHook):
    """Ends the session at once, without its closing checkpoint, when the lease's renewal found model_dir
    taken over by another run: `LeaseLost` raised from a hook skips the hooks' `end` (where the
    CheckpointSaverHook would save). Checked before each session run (no step, no summary of it) and after it."""

    def __init__(self, model_dir: str):
        self._model_dir = model_dir

    def before_run(self, run_context):
        raise_if_lost(self._model_dir)

    def after_run(self, run_context, run_values):
        raise_if_lost(self._model_dir)


# The port of a Cloud TPU Node worker's profiler service (Cloud TPU's `capture_tpu_profile` asks it).
TPU_PROFILER_PORT = 8466


class ProfileHook(tf.compat.v1.train.SessionRunHook):
    """Captures a TensorBoard profile of global steps `first` to `last` (both included) into `logdir`.

    The profiler starts before the session run that reaches `first` and stops after the one that
    reaches `last` (or when the session ends first). In this process (CPU, GPU, a TPU VM) it is
    TensorFlow's own profiler (`tf.profiler.experimental.start/stop`); on a Cloud TPU Node the TPU
    workers' profiler services are asked for a trace of about the window's duration, as Cloud TPU's
    `capture_tpu_profile` does. The profile lands in `logdir/plugins/profile/<time>/`, where
    TensorBoard's Profile tab reads it.

    Args:
        service: "grpc://host:8466,..." for a TPU Node's profiler services; None: this process.
        on_done: told (first step profiled, last step, or an error message) when the capture ends.
        seconds_per_step: the current seconds per step (for a TPU Node's trace duration), None if unknown.
    """

    def __init__(self, first: int, last: int, logdir: str, *, steps_per_run: int = 1, service: Optional[str] = None,
                 on_done: Callable[[Optional[Tuple[int, int]], Optional[str]], None] = lambda steps, error: None,
                 seconds_per_step: Callable[[], Optional[float]] = lambda: None):
        self._first, self._last = first, last
        self._logdir = logdir
        self._steps_per_run = steps_per_run
        self._service = service
        self._on_done = on_done
        self._seconds_per_step = seconds_per_step
        self._from: Optional[int] = None  # the first step under the profiler, while it runs
        self._finished = False
        self._trace: Optional[threading.Thread] = None
        self._error: Optional[str] = None

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()

    def after_create_session(self, session, coord):
        self._step = int(session.run(self._global_step))

    def before_run(self, run_context):
        if self._finished or self._from is not None:
            return None
        if self._step < self._last and self._step + self._steps_per_run >= self._first:
            try:
                self._start()
            except (tf.errors.OpError, RuntimeError, ValueError) as exc:
                self._finished = True
                self._on_done(None, str(getattr(exc, "message", exc)).strip().splitlines()[0])
                return None
            self._from = self._step + 1
        return None

    def after_run(self, run_context, run_values):
        self._step += self._steps_per_run
        if self._from is not None and self._step >= self._last:
            self._stop()

    def end(self, session):
        if self._from is not None:
            self._stop()

    def _start(self) -> None:
        if self._service is None:
            tf.profiler.experimental.start(self._logdir)
            return
        per_step = self._seconds_per_step() or 1.0
        duration_ms = int(max(2.0, 1.5 * per_step * (self._last - self._step)) * 1000)

        def trace():
            try:
                tf.profiler.experimental.client.trace(self._service, self._logdir, duration_ms)
            except Exception as exc:  # reported through on_done: a profile must never stop training
                self._error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__

        self._trace = threading.Thread(target=trace, name="tpulaunch-profile", daemon=True)
        self._trace.start()

    def _stop(self) -> None:
        steps, self._from, self._finished = (self._from, min(self._step, self._last)), None, True
        if self._service is None:
            try:
                tf.profiler.experimental.stop()
            except (tf.errors.OpError, RuntimeError) as exc:
                self._error = str(getattr(exc, "message", exc)).strip().splitlines()[0]
        elif self._trace is not None:
            self._trace.join()
        self._on_done(None if self._error else steps, self._error)


def profiler_service(cluster_resolver) -> Optional[str]:
    """The TPU Node workers' profiler services ("grpc://10.0.0.2:8466,..."); None when the TPU runs in this
    process (a TPU VM, or no TPU): then TensorFlow's in-process profiler sees it."""
    if cluster_resolver is None:
        return None
    workers = cluster_resolver.cluster_spec().as_dict().get("worker") or []
    hosts = [address.rsplit(":", 1)[0] for address in workers]
    if not hosts or all(host in ("localhost", "127.0.0.1", "[::1]") for host in hosts):
        return None
    return ",".join(f"grpc://{host}:{TPU_PROFILER_PORT}" for host in hosts)


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


def progress_hooks(recorder: RunRecorder, *, steps_per_run: int = 1, model_dir: Optional[str] = None,
                   on_tpu: bool = False):
    """(SessionRunHook, CheckpointSaverListener) feeding `recorder` from a TPUEstimator's train."""
    return ProgressHook(recorder, steps_per_run, model_dir, on_tpu), CheckpointListener(recorder, model_dir)


def profile_hooks(profile: Tuple[int, int], recorder: RunRecorder, *, start_step: int, total_steps: int,
                  model_dir: str, steps_per_run: int = 1, cluster_resolver=None) -> list:
    """[ProfileHook] capturing global steps `profile` (first, last) into model_dir, telling `recorder`;
    no hook (and a note) when the run trains none of those steps."""
    first, last = profile
    if last <= start_step or first > total_steps:
        recorder.note(f"profile | steps {first}-{last} are not trained in this run (steps {start_step + 1} to "
                      f"{total_steps}): nothing profiled")
        return []

    def done(steps, error):
        if error:
            recorder.note(f"profile | not captured: {error}")
        else:
            recorder.profile_captured(*steps, model_dir, os.path.join(model_dir, "plugins", "profile"))

    def seconds_per_step():
        rate = recorder.steps_per_sec
        return 1 / rate if rate else None

    return [ProfileHook(first, last, model_dir, steps_per_run=steps_per_run, on_done=done,
                        service=profiler_service(cluster_resolver), seconds_per_step=seconds_per_step)]


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
