"""The resolved job as plain data: what model_dir's job copy holds and the run record's job hash is taken of."""

from __future__ import annotations

from typing import Any

from tpulaunch.job.schema import Job


def job_document(job: Job) -> dict:
    """The resolved job as plain data, its secrets masked (`job/secrets.py`: the values from `${VAR}`s, from `--set`s
    under secret-looking keys, and under secret-looking keys of the job's own mappings)."""
    return job.secrets.mask(job.model_dump(mode="json", exclude_none=True))


def value_at(data: Any, keys) -> Any:
    """The value under `keys` in a job as plain data (mappings by key, lists by index); None where one is missing."""
    for key in keys:
        if isinstance(data, dict) and key in data:
            data = data[key]
        elif isinstance(data, list) and isinstance(key, int) and -len(data) <= key < len(data):
            data = data[key]
        else:
            return None
    return data
