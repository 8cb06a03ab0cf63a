"""A run as `train`, `evaluate` and `export` wrap it: its phases from the first moment, a watch on slow
phases, and (train, evaluate) its record appended to model_dir/tpulaunch-runs.jsonl however it ends.

TensorFlow is loaded here, as the run's "load TensorFlow" phase: the line saying so is written
before the import starts.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

from tpulaunch.errors import AlreadyReported, TpuLaunchError, first_line
from tpulaunch.run import phases
from tpulaunch.run.events import RunRecorder


def _outcome(recorder: RunRecorder, error: Optional[BaseException]) -> str:
    """"done", "stopped (SIGINT)", "stopped (TPU PREEMPTED)", "failed: <what went wrong>"."""
    if recorder.stopped_by:
        return f"stopped ({recorder.stopped_by})"
    if error is None:
        return "done"
    if isinstance(error, KeyboardInterrupt):
        return "stopped (SIGINT)"
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
    model_dir may be gs://), and the recorder is closed. `lease`: the model_dir lease the run holds
    (`run/lease.py`): its run id and any takeover go into the record.
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
    except BaseException as exc:
        error = exc
        raise
    finally:
        watch.stop()
        try:
            if record and loaded:
                _write_record(obj, recorder, engine, checked, command, _outcome(recorder, error), lease)
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


def _write_record(obj, recorder: RunRecorder, engine, checked, command: str, outcome: str, lease=None) -> None:
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
    try:
        engine.append_run_record(job.run.model_dir, record_line(record))
    except Exception as exc:  # the run's own outcome matters more than its record
        obj.err.print(f"run record not written to {job.run.model_dir}: {first_line(exc)}", highlight=False,
                      markup=False, soft_wrap=True)
