"""What `tpulaunch data` does: `synth` writes a starter job's example records (`data/synth.py`), `inspect` reads what
records hold (`data/inspect_records.py`), and `bench` checks the job for its target, times its input pipeline
(`data/bench.py`) and sets the rate against what the job's last training consumed, from model_dir's run record.
TensorFlow is loaded here, inside each, never by the command line's fast path."""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, List, Optional, Sequence


def planned_records(name: str, records: Optional[int], shards: Optional[int]) -> int:
    """How many records `synth` of the example `name` writes (train and eval), for a progress bar's total."""
    from tpulaunch.data.synth import planned_records as planned

    return planned(name, records, shards)


def synth(name: str, out_dir: str, *, records: Optional[int], size: Optional[int], shards: Optional[int], seed: int,
          on_record: Optional[Callable[[], None]] = None) -> List[str]:
    """The example `name`'s train and eval TFRecords written into `out_dir` (local or gs://): the files written.
    `on_record` is told after each record."""
    from tpulaunch.data import synth as synth_module
    from tpulaunch.tf_env import import_tensorflow

    import_tensorflow()  # quietly, before the records are written: TensorFlow's start-up lines stay off the terminal
    return synth_module.write_example(name, out_dir, records=records, shards=shards, seed=seed, size=size,
                                      on_record=on_record)


def inspect(pattern: str, *, records: int, compression: Optional[str]):
    """What the first `records` tf.train.Examples of the files matching `pattern` hold (`data/inspect_records.py`)."""
    from tpulaunch.data.inspect_records import inspect as inspect_records
    from tpulaunch.tf_env import import_tensorflow

    import_tensorflow()
    return inspect_records(pattern, records=records, compression=compression)


def bench(job_file: str, overrides: Sequence[str], *, local: bool, seconds: float, say: Callable[[str], None],
          warn=None, verbose: int = 0,
          showing: Callable[[str], ContextManager] = lambda text: contextlib.nullcontext()):
    """(the checked job, the pipeline's timing, its comparison with the last training or None). `showing(text)`:
    around each long wait (TensorFlow loading, the timing), for the command to show it; `say`: notes on the record;
    `warn`: called with the job's warnings; `verbose`: TensorFlow's log level."""
    from tpulaunch.app.gate import load_checked
    from tpulaunch.data.bench import bench_input
    from tpulaunch.tf_env import quiet_tensorflow

    checked = load_checked(job_file, overrides, local=local, warn=warn)
    quiet_tensorflow(verbose)
    job, engine = checked.job, checked.engine
    with showing("loading TensorFlow"):
        engine.load()
    with showing(f"timing the input pipeline for {seconds:g} s"):
        result = bench_input(job, checked.plan, seconds=seconds, search_path=job.search_path)
    return checked, result, compared_with_training(result, job, say=say)


def compared_with_training(result, job, *, say: Callable[[str], None]):
    """`data/bench.py`'s comparison of `result` with the last training in model_dir's run record, or None when none
    is recorded. A torn line of the record is skipped (said through `say`); an unreadable model_dir only loses the
    comparison (said too)."""
    from tpulaunch.data.bench import compare
    from tpulaunch.engine.core.records import record_lines
    from tpulaunch.run.record import RECORD_FILE, last_training, read_records, skipped_text

    try:
        skipped: list = []
        last = last_training(read_records(record_lines(job.run.model_dir),
                                          on_skipped=lambda number, why: skipped.append((number, why))))
        if skipped:  # a torn line (a run cut off mid-write): the whole records are compared with
            say(skipped_text(f"{job.run.model_dir.rstrip('/')}/{RECORD_FILE}", skipped))
    except Exception as exc:  # an unreadable model_dir only loses the comparison
        from tpulaunch.errors import first_line

        say(f"run record in {job.run.model_dir} not read: {first_line(exc)}")
        last = None
    return compare(result, last) if last else None
