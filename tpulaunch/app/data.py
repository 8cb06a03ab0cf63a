"""What `tpulaunch data bench` does beside timing the pipeline (`data/bench.py`): the rate measured set against what
the job's last training consumed, from model_dir's run record."""

from __future__ import annotations

from typing import Callable


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
