"""The resolved job as plain data: what model_dir's job copy holds and the run record's job hash is taken of."""

from __future__ import annotations

from tpulaunch.job.schema import Job


def job_document(job: Job) -> dict:
    """The resolved job as plain data, its secrets masked (`job/secrets.py`: the values from `${VAR}`s, from `--set`s
    under secret-looking keys, and under secret-looking keys of the job's own mappings)."""
    return job.secrets.mask(job.model_dump(mode="json", exclude_none=True))


