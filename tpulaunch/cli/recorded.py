"""A run as `train`, `evaluate` and `export` wrap it: its phases from the first moment, a watch on slow
phases, and (train, evaluate) its record appended to model_dir/tpulaunch-runs.jsonl however it ends.

TensorFlow is loaded here, as the run's "load TensorFlow" phase: the line saying so is written
before the import starts.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional

from tpulaunch.errors import AlreadyReported, TpuLaunchError, first_line
from tpulaunch.run import phases
from tpulaunch.run.events import RunRecorder
from tpulaunch.run.lease import LeaseLost, holder_text
from tpulaunch.run.signals import Terminated, deferred

FENCED = "fenced"  # the outcome's first word for a run whose model_dir lease another run took over


def _outcome(recorder: RunRecorder, error: Optional[BaseException]) -> str:
    """"done", "stopped (SIGINT)", "stopped (TPU PREEMPTED)", "fenced: lease lost to host ..., pid ..., run ...",
    "failed: <what went wrong>"."""
    if isinstance(error, LeaseLost):
        return f"{FENCED}: lease lost to {holder_text(error.holder)}"
    if recorder.stopped_by:
        return f"stopped ({recorder.stopped_by})"
    if error is None:
        return "done"
    if isinstance(error, KeyboardInterrupt):
        return "stopped (SIGINT)"
    if isinstance(error, Terminated):
        return f"stopped ({error.name})"
    if isinstance(error, TpuLaunchError) and not isinstance(error, AlreadyReported):
        return f"failed: {error.message}"
    return f"failed: {type(error).__name__}: {first_line(error)}"


@contextlib.contextmanager
def recorded_run(obj, recorder: RunRecorder, engine, checked, command: str, *,
                 record: bool = True, lease=None) -> Iterator[None]:
    """The run of `checked` (the job through the gate) on `engine`, told to `recorder`.

    `command`: "train" (recorded as "resume" when training started from a checkpoint), "evaluate" or
    "export". The job's check, from the recorder's start to now, is the first phase (the first line,
    before TensorFlow loads), TensorFlow's import the second; a `PhaseWatch` says when a phase runs
    far past what is usual. When the block ends, however it ends, the run's record is appended to model_dir
    (when `record`, and once TensorFlow was loaded: it writes through TensorFlow's filesystem, and
    model_dir may be gs://; a run a signal stopped before that is recorded too), and the recorder is
    closed; a signal arriving meanwhile waits until the record is whole. `lease`: the model_dir lease the
    run holds (`run/lease.py`): its run id and any takeover go into the record, and a run that lost it is
    recorded as fenced (`_write_record`), never as done.
    """
    from tpulaunch.run.phase_watch import PhaseWatch

    recorder.phase_done(phases.CHECK, recorder.phases.started_at)
    watch = PhaseWatch(recorder, on_tpu=checked.plan.on_tpu).start()
    loaded, error = False, None
    try:
        with recorder.phase(phases.LOAD):
            engine.load()
        loaded = True
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
            try:
                if record and (loaded or isinstance(error, (KeyboardInterrupt, Terminated))):
                    _write_record(obj, recorder, engine, checked, command, _outcome(recorder, error), lease,
                                  through_tensorflow=loaded)
            finally:
                recorder.close()


def _refuse_what_validate_refuses(checked, command: str) -> None:
    """Validate's checks of the job's own code (flags, import paths, input_fns), now that TensorFlow is loaded:
    a job validate refuses is refused here, at the same keys, before anything is built."""
    from tpulaunch.checks.validate import code_problems
    from tpulaunch.cli.gate import JobRefused

    errors = [p for p in code_problems(checked.loaded, checked.loaded.search_path, []) if p.is_error]
    if errors:
        raise JobRefused(f"not running {command} on {checked.file}: fix the problems above "
                         f"(tpulaunch validate {checked.file})", problems=errors)


def _write_record(obj, recorder: RunRecorder, engine, checked, command: str, outcome: str, lease=None, *,
                  through_tensorflow: bool = True) -> None:
    """Append the run's record to model_dir/tpulaunch-runs.jsonl (`engine/core/records.py`: a local model_dir
    without TensorFlow, so a run a signal stopped before TensorFlow loaded is recorded too; gs:// through it).

    A fenced run (another run holds model_dir's lease now) shares that file with its successor. Its line, under
    its own run_id, says how it ended; it is appended only to a local model_dir, with one O_APPEND write and
    nothing else (no torn tail set apart: the file is the other run's now): the kernel puts the whole line at
    the file's end, after whatever the successor appended, and never over it. On gs:// an append rewrites the
    whole object (read, add, write back without a precondition), which could erase a line the successor
    appended in between: there the fenced run writes nothing and says so.
    """
    model_dir = checked.job.run.model_dir
    remote, fenced = "://" in model_dir, outcome.startswith(FENCED)
    if remote and (fenced or not through_tensorflow):
        why = ("another run holds its lease now, and an append there rewrites the whole record (it could erase that "
               "run's line)" if fenced else "the run stopped before TensorFlow, through which it is written, loaded")
        obj.err.print(f"run record not written to {model_dir}: {why}", highlight=False, markup=False, soft_wrap=True)
        return
    line = _record_line(recorder, checked, command, outcome, lease)
    try:
        if fenced:
            _append_line(model_dir, line)
        else:
            engine.append_run_record(model_dir, line)
    except Exception as exc:  # the run's own outcome matters more than its record
        obj.err.print(f"run record not written to {model_dir}: {first_line(exc)}", highlight=False,
                      markup=False, soft_wrap=True)


def _append_line(model_dir: str, line: str) -> None:
    """One write of the whole line with O_APPEND to a record file another run appends to as well."""
    from tpulaunch.run.record import RECORD_FILE

    data = line.encode("utf-8")
    fd = os.open(os.path.join(model_dir, RECORD_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # umask's mode
    try:
        if os.write(fd, data) != len(data):  # a full disk mid-line: the successor's next append sets it apart
            raise OSError(28, os.strerror(28), os.path.join(model_dir, RECORD_FILE))
    finally:
        os.close(fd)


def _record_line(recorder: RunRecorder, checked, command: str, outcome: str, lease=None) -> str:
    from tpulaunch import __version__
    from tpulaunch.engine.core.model_dir import job_document  # the job as model_dir's job copy holds it
    from tpulaunch.run.record import job_hash, record_line, run_record
    from tpulaunch.tpu.node import installed_tensorflow_version

    job, plan = checked.job, checked.plan
    if command == "train" and recorder.start_step:
        command = "resume"
    batch = plan.batch("train" if command != "evaluate" else "eval") or plan.batch("eval")
    pipelines = max(1, batch.global_batch // batch.params_batch_size) if batch else 1
    record = run_record(
        recorder, command=command, outcome=outcome, on_tpu=plan.on_tpu, input_pipelines=pipelines,
        job={"name": job.name, "hash": job_hash(job_document(job)), "model_dir": job.run.model_dir},
        versions={"tpulaunch": __version__, "tensorflow": installed_tensorflow_version()}, profile=recorder.profile,
        run_id=lease.data["run_id"] if lease is not None else None,
        lease_took_over=lease.took_over if lease is not None else None)
    rollbacks = getattr(recorder, "nan_rollbacks", None)  # engine/core/loop.py's, after a NaN loss (train.on_nan)
    if rollbacks:
        record["nan_rollbacks"] = list(rollbacks)
    return record_line(record)
