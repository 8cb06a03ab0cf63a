"""A run as `train`, `evaluate` and `export` wrap it: its phases from the first moment, a watch on slow
phases, and (train, evaluate) its record appended to model_dir/tpulaunch-runs.jsonl however it ends (the line's
assembly and writing are `run/run_record.py`'s).

TensorFlow is loaded here, as the run's "load TensorFlow" phase: the line saying so is written
before the import starts.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

from tpulaunch.engine.core.records import append_record
from tpulaunch.run import phases
from tpulaunch.run.events import RunRecorder
from tpulaunch.run.run_record import outcome, write_record
from tpulaunch.run.signals import deferred, raise_if_held, raise_if_swallowed


@contextlib.contextmanager
def recorded_run(say: Callable[[str], None], recorder: RunRecorder, engine, checked, command: str, *,
                 record: bool = True, lease=None) -> Iterator[None]:
    """The run of `checked` (the job through the gate) on `engine`, told to `recorder`.

    `command`: "train" (recorded as "resume" when training started from a checkpoint), "evaluate" or
    "export". The job's check, from the recorder's start to now, is the first phase (the first line,
    before TensorFlow loads), TensorFlow's import the second; a `PhaseWatch` says when a phase runs
    far past what is usual. When the block ends, however it ends, the run's record is appended to model_dir
    (when `record`; a run that ended before TensorFlow loaded, through which a gs:// model_dir is written, only
    to a local one), and the recorder is closed; a signal arriving meanwhile waits until the record is whole.
    A step that does not return after a signal is stopped where it is (`run/stop_deadline.py`): the record
    is then written from there, stopped with the reason. `lease`: the model_dir lease the
    run holds (`run/lease.py`): its run id and any takeover go into the record, and a run that lost it is
    recorded as fenced (`run/run_record.py`), never as done. `say`: where a line about the record goes (one
    that could not be written).
    """
    from tpulaunch.run import stop_deadline
    from tpulaunch.run.phase_watch import PhaseWatch

    recorder.phase_done(phases.CHECK, recorder.phases.started_at)
    watch = PhaseWatch(recorder, on_tpu=checked.plan.on_tpu).start()
    loaded, error = False, None

    def end(forced: Optional[BaseException]) -> None:
        """The record (a run that ended before TensorFlow loaded too: written without it where model_dir is local),
        then the recorder closed; `forced`: a signal's stop the run did not reach in time (`run/stop_deadline.py`)."""
        try:
            ended = forced or error
            if record and (loaded or ended is not None):
                write_record(recorder, append_record, checked.job, checked.plan, command, outcome(recorder, ended),
                             lease, through_framework=loaded, say=say)
        finally:
            recorder.close()

    ending = stop_deadline.Ending(end, describe=lambda: _unfinished(recorder),
                                  after=lambda: _resume_from(recorder) if command == "train" else None)
    try:
        stop_deadline.arm()  # a signal is honoured within its grace, whatever the step waits on
        raise_if_held()  # a signal that came while the lease was taken: this run is recorded as it stopped
        with recorder.phase(phases.LOAD):
            engine.load()
        loaded = True
        raise_if_swallowed()  # a Ctrl-C while the libraries loaded, whose exception one of them swallowed
        with recorder.phase(phases.CHECK_CODE):
            _refuse_what_validate_refuses(checked, command)
        yield
        if lease is not None:
            lease.ensure_held()  # a run that lost its lease is not done: its record must not say so
    except BaseException as exc:
        error = exc
        raise
    finally:
        watch.stop()
        with deferred():
            ending()


# The phases in which the run waits on its step (training's, or an evaluation's).
_STEPPING = (phases.FIRST_STEP, phases.TRAINING, phases.EVALUATION)


def _unfinished(recorder: RunRecorder) -> tuple:
    """What a run that did not stop in time had not finished, and what it likely waits on."""
    current = recorder.phases.current()
    if current is None:
        return "the run did not end", None
    if current[0] in _STEPPING:
        return "the step did not return", "waiting on its input, a store or a collective?"
    return f"the phase '{current[0]}' did not end", None


def _resume_from(recorder: RunRecorder) -> str:
    last = recorder.last_checkpoint
    return ("a rerun of the same command resumes from the last complete checkpoint"
            + (f", {last}" if last else " in model_dir"))


def _refuse_what_validate_refuses(checked, command: str) -> None:
    """Validate's checks of the job's own code (flags, import paths, input_fns) and, for train, its data stage (the
    files, a sample of records, the counts against the batches), now that TensorFlow is loaded: a job validate
    refuses is refused here, at the same keys, before anything is built. (evaluate reads only data.eval, and a
    machine that evaluates may lack data.train: its evaluation says what it finds.)"""
    from tpulaunch.checks.validate import code_problems, data_problems
    from tpulaunch.app.gate import JobRefused

    problems = code_problems(checked.loaded, checked.loaded.search_path, [])
    if command == "train":  # data.eval only when it evaluates (a job with eval: null never reads it)
        evaluates = checked.loaded.section("eval") is not None
        problems += data_problems(checked.loaded, splits=("train", "eval") if evaluates else ("train",))
    errors = [p for p in problems if p.is_error]
    if errors:
        raise JobRefused(f"not running {command} on {checked.file}: fix the problems above "
                         f"(tpulaunch validate {checked.file})", problems=errors)
