"""The run record: one JSON object per `train`, resume and `evaluate`, appended to model_dir/tpulaunch-runs.jsonl.

What a run did and where its time went, for the user and for tools (`tpulaunch data bench` compares
the input pipeline with the step rate the last training run needed)::

    {"command": "train", "job": "quickstart", "job_hash": "sha256:...", "model_dir": "runs/quickstart",
     "outcome": "done", "start": "2025-01-01T10:00:00.000Z", "end": "...", "wall_s": 31.2,
     "steps": {"from": 0, "to": 300, "run": 300, "total": 300},
     "phases": {"check the job": 0.3, "load TensorFlow": 3.4, ..., "training": 21.9, "other": 0.2},
     "steps_per_s": 13.7, "examples_per_s": 876.0, "steady_examples_per_s": 912.3, "batch_size": 64,
     "input_pipelines": 1,
     "goodput": 0.7, "input_wait_share": 0.03, "input_bound": false, "records_skipped": null,
     "events": [], "resumes": 0, "steps_lost": 0, "evals": [{"step": 300, "metrics": {...}, "left_out": null}],
     "on_tpu": false, "profile": null, "versions": {"tpulaunch": "0.1.0", "tensorflow": "2.15.1"},
     "run_id": "20250101T100000Z-vm-1-4242-1a2b3c", "lease_took_over": null}

`run_id` is the id the run's model_dir lease names (`run/lease.py`); `lease_took_over`, when this run took
a lease over, names the run it took it from and how long that one had not renewed it.

`phases` are the recorder's exclusive seconds per phase ("other": what no phase covered), so they add
up to `wall_s`. `examples_per_s` counts all the time in training sessions (as the final line does);
`steady_examples_per_s` leaves out each session's first step (start-up, XLA's compile). Building the
record is pure Python; the engine writes it (model_dir may be gs://).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import sys
import time
from typing import Any, Callable, Dict, Iterable, Optional

from tpulaunch.run.events import INPUT_BOUND_SHARE, RunRecorder

RECORD_FILE = "tpulaunch-runs.jsonl"
COMMANDS = ("train", "resume", "evaluate")


def job_hash(document: dict) -> str:
    """A stable hash of the resolved job (as plain data): the same job, the same hash."""
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _iso(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _rounded(value: Optional[float], digits: int = 4) -> Optional[float]:
    return None if value is None else round(value, digits)


def run_record(recorder: RunRecorder, *, command: str, outcome: str, job: Dict[str, Any],
               versions: Dict[str, Optional[str]], on_tpu: bool, input_pipelines: int = 1,
               profile: Optional[str] = None, wall_clock: Callable[[], float] = time.time,
               run_id: Optional[str] = None, lease_took_over: Optional[dict] = None) -> dict:
    """The record of the run `recorder` kept, as of now.

    Args:
        command: "train", "resume" (a train that started from a checkpoint) or "evaluate".
        outcome: "done", "stopped (SIGINT)", "failed: <what went wrong>"...
        job: {"name", "hash", "model_dir"} of the job.
        versions: {"tpulaunch": ..., "tensorflow": ...}.
        on_tpu: the run trained on a TPU.
        input_pipelines: input pipelines feeding the run (one per input_fn call over the slice).
        profile: where a profile of the run went (`train --profile`), if one did.
        wall_clock: the calendar clock (seconds since the epoch), for the start and end times.
        run_id: the run's id, as its model_dir lease names it (None: the run held no lease).
        lease_took_over: the holder whose lease this run took over ({host, pid, run_id, renewed_s_ago, stale,
            forced}), if it took one over.
    """
    if command not in COMMANDS:
        raise ValueError(f"`command` must be one of {COMMANDS}, got {command!r}")
    wall, seconds = recorder.phases.snapshot()
    end = wall_clock()
    summary = recorder.summary()
    share = recorder.input_share
    steady = recorder.steady_steps_per_sec
    steps = {"from": summary.start_step, "to": summary.final_step, "run": summary.steps_run,
             "total": summary.total_steps}
    if command == "evaluate" and summary.evals:  # the checkpoint's step
        steps = {"from": summary.evals[-1].step, "to": summary.evals[-1].step, "run": 0, "total": None}
    return {
        "command": command,
        "job": job.get("name"),
        "job_hash": job.get("hash"),
        "model_dir": job.get("model_dir"),
        "outcome": outcome,
        "start": _iso(end - (wall or 0.0)),
        "end": _iso(end),
        "wall_s": _rounded(wall, 3),
        "steps": steps,
        "phases": {name: round(value, 3) for name, value in seconds.items()},
        "steps_per_s": _rounded(summary.steps_per_sec),
        "examples_per_s": _rounded(summary.examples_per_sec, 2),
        "steady_examples_per_s": _rounded(steady * recorder.batch_size if steady else None, 2),
        "batch_size": recorder.batch_size,
        "input_pipelines": input_pipelines,
        "goodput": _rounded(summary.goodput),
        "input_wait_share": _rounded(share),
        "input_bound": None if share is None else share >= INPUT_BOUND_SHARE,
        "records_skipped": summary.records_skipped,
        "events": [{"kind": e.kind, "detail": e.detail, "step": e.step, "checkpoint_step": e.checkpoint_step,
                    "steps_lost": e.steps_lost, "resumed": e.resumed, "recreated": e.recreated,
                    "recovery_s": e.recovery_s} for e in summary.events],
        "resumes": summary.resumes,
        "steps_lost": summary.steps_lost,
        "evals": [{"step": e.step, "metrics": e.metrics, "records_skipped": e.records_skipped,
                   "left_out": None if e.left_out is None else {"examples": e.left_out.examples,
                                                                "records": e.left_out.records}}
                  for e in summary.evals],
        "on_tpu": on_tpu,
        "profile": profile,
        "versions": dict(versions),
        "run_id": run_id,
        "lease_took_over": lease_took_over,
    }


def _finite(value):
    """The record with NaN and infinities as null (a diverged loss): strict JSON for every reader."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def record_line(record: dict) -> str:
    """One line of the JSON-lines file."""
    return json.dumps(_finite(record), separators=(", ", ": "), allow_nan=False, default=str) + "\n"


TORN_SUFFIX = ".torn"  # model_dir/tpulaunch-runs.jsonl.torn: the torn tails set apart, one per line


def split_torn(text: str) -> tuple:
    """(whole lines, torn tail) of a record file's text: the torn tail is what follows the last newline (a
    record whose write was cut short by a crash or a full disk); "" when the file ends with a whole line."""
    cut = text.rfind("\n") + 1
    return text[:cut], text[cut:]


def read_records(lines: Iterable[str], on_skipped: Optional[Callable[[int, str], None]] = None) -> list:
    """The records of a tpulaunch-runs.jsonl file, oldest first.

    A line that is not a JSON object (a record cut short by a crash or a full disk, or text written by
    something else) is skipped: `on_skipped(line_number, why)` is told of each, so a reader can say so.
    """
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif on_skipped is not None:
            on_skipped(number, "a torn or foreign line, not a JSON object")
    return records


def skipped_text(path: str, skipped: list) -> str:
    """One line for the records a reader skipped: `skipped` as [(line number, why)]."""
    numbers = ", ".join(str(number) for number, _ in skipped[:5]) + (", ..." if len(skipped) > 5 else "")
    plural = "s" if len(skipped) > 1 else ""
    return (f"{path}: skipped {len(skipped)} line{plural} ({numbers}) that {'are' if plural else 'is'} not a whole "
            f"record ({skipped[0][1]}); the other records are read")


def local_records(model_dir: str, say: Callable[[str], None] = lambda text: print(text, file=sys.stderr)) -> list:
    """The records of a local model_dir's run record (none when it has none), for tools: a line that is not a
    whole record is skipped, and `say` told of it."""
    path = os.path.join(model_dir, RECORD_FILE)
    try:
        with open(path, "rb") as handle:
            lines = handle.read().decode("utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return []
    skipped: list = []
    records = read_records(lines, on_skipped=lambda number, why: skipped.append((number, why)))
    if skipped:
        say(skipped_text(path, skipped))
    return records


def training_rate(record: dict) -> Optional[float]:
    """Examples/s a train/resume record measured: its steady rate when known, else its overall one."""
    return record.get("steady_examples_per_s") or record.get("examples_per_s") or None


def last_training(records: list) -> Optional[dict]:
    """The newest train/resume record that measured a step rate, or None."""
    for record in reversed(records):
        if record.get("command") in ("train", "resume") and training_rate(record):
            return record
    return None
