"""One run's line in model_dir's run record (`record.py` has the record's fields and goodput): how the run ended,
the line assembled from what the recorder saw, the Plan and the lease, and appended however the run ended."""

from __future__ import annotations

import os
from typing import Callable

from tpulaunch.errors import AlreadyReported, TpuLaunchError, first_line, resource_limit_error
from tpulaunch.run.events import RunRecorder
from tpulaunch.run.lease import LeaseLost, holder_text
from tpulaunch.run.signals import Terminated
from tpulaunch.run.stop_deadline import ForcedStop

FENCED = "fenced"  # the outcome's first word for a run whose model_dir lease another run took over


def outcome(recorder: RunRecorder, error: BaseException = None) -> str:
    """"done", "stopped (SIGINT)", "stopped (TPU PREEMPTED)", "fenced: lease lost to host ..., pid ..., run ...",
    "stopped (SIGINT): the step did not return within 30 s of SIGINT (...)" (a step the signal's stop could not
    wait for), "failed: <what went wrong>"."""
    if isinstance(error, ForcedStop):
        return f"stopped ({error.name}): {error.reason}"
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
    from tpulaunch.job.secrets import redact  # the job's own code's message may quote a secret of the job

    if isinstance(error, TpuLaunchError) and not isinstance(error, AlreadyReported):
        return f"failed: {redact(error.message)}"
    limited = resource_limit_error(error)
    if limited is not None:  # out of memory under ulimit -v, too many open files: the limit, as the user is told
        return f"failed: {redact(limited.message)}"
    return f"failed: {type(error).__name__}: {redact(first_line(error))}"


def write_record(recorder: RunRecorder, append: Callable[[str, str], object], job, plan, command: str, ended: str,
                 lease=None, *, through_framework: bool = True, say: Callable[[str], None]) -> None:
    """Append the run's record to model_dir/tpulaunch-runs.jsonl with `append(model_dir, line)` (`engine/core/
    records.py`'s: a local model_dir without the framework, so a run a signal stopped before it loaded is recorded
    too; gs:// through it). `ended`: the run's `outcome`. One record per run, the chief's: the other workers of a
    run over several hosts (`run/workers.py`) append none.

    A fenced run (another run holds model_dir's lease now) shares that file with its successor. Its line, under
    its own run_id, says how it ended; it is appended only to a local model_dir, with one O_APPEND write and
    nothing else (no torn tail set apart: the file is the other run's now): the kernel puts the whole line at
    the file's end, after whatever the successor appended, and never over it. On gs:// an append rewrites the
    whole object (read, add, write back without a precondition), which could erase a line the successor
    appended in between: there the fenced run writes nothing and says so.
    """
    from tpulaunch.run.workers import is_chief_worker

    if not is_chief_worker():
        return
    model_dir = job.run.model_dir
    remote, fenced = "://" in model_dir, ended.startswith(FENCED)
    if remote and (fenced or not through_framework):
        why = ("another run holds its lease now, and an append there rewrites the whole record (it could erase that "
               "run's line)" if fenced else "the run ended before TensorFlow, through which it is written, loaded")
        say(f"run record not written to {model_dir}: {why}")
        return
    line = record_line_of(recorder, job, plan, command, ended, lease)
    try:
        if fenced:
            _append_line(model_dir, line)
        else:
            append(model_dir, line)
    except Exception as exc:  # the run's own outcome matters more than its record
        say(f"run record not written to {model_dir}: {first_line(exc)}")


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


def record_line_of(recorder: RunRecorder, job, plan, command: str, ended: str, lease=None) -> str:
    """The run's record line: what `recorder` saw, the job (its hash: model_dir's job copy), its Plan, the lease."""
    from tpulaunch import __version__
    from tpulaunch.job.document import job_document  # the job as model_dir's job copy holds it
    from tpulaunch.run.record import job_hash, record_line, run_record
    from tpulaunch.tpu.node import installed_tensorflow_version

    if command == "train" and recorder.start_step:
        command = "resume"
    batch = plan.batch("train" if command != "evaluate" else "eval") or plan.batch("eval")
    pipelines = max(1, batch.global_batch // batch.params_batch_size) if batch else 1
    record = run_record(
        recorder, command=command, outcome=ended, on_tpu=plan.on_tpu, input_pipelines=pipelines,
        job={"name": job.name, "hash": job_hash(job_document(job)), "model_dir": job.run.model_dir},
        versions={"tpulaunch": __version__, "tensorflow": installed_tensorflow_version()}, profile=recorder.profile,
        run_id=lease.data["run_id"] if lease is not None else None,
        lease_took_over=lease.took_over if lease is not None else None)
    rollbacks = getattr(recorder, "nan_rollbacks", None)  # engine/core/loop.py's, after a NaN loss (train.on_nan)
    if rollbacks:
        record["nan_rollbacks"] = list(rollbacks)
    return record_line(record)
