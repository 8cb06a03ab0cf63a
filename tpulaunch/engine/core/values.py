"""Plain values read from a Job the same way by both engines (and the input pipeline). Pure Python."""

from __future__ import annotations

import contextlib

from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.schema import Job

# Plain progress lines (and RunConfig's step logging) on CPU/GPU when the job does not say; a TPU job
# uses iterations_per_loop.
DEFAULT_LOG_EVERY_STEPS = 100


def tensor_specs(group: dict) -> dict:
    """The job's tensor specs as standalone.py reads them: record key, stored form, shape, dtype."""
    return {name: {"key": spec.key or name, "stored_as": spec.stored_as, "shape": list(spec.shape),
                   "dtype": spec.dtype} for name, spec in group.items()}


def log_every_steps(job: Job) -> int:
    if job.run.log_every_steps:
        return job.run.log_every_steps
    return job.tpu.iterations_per_loop if job.tpu else DEFAULT_LOG_EVERY_STEPS


@contextlib.contextmanager
def spec_errors():
    """portable.SpecError (declared data or model settings that cannot work together) as a TpuLaunchError."""
    from tpulaunch.engine.portable import SpecError

    try:
        yield
    except SpecError as exc:
        raise TpuLaunchError(str(exc), hint=exc.hint) from None
