"""Which engine's rules a job is checked against, and the dispatch to them. Pure Python.

Each engine declares its own static rules (`EngineAbout.static_rules`, in its folder); the rules every
engine shares are in `checks/static.py`.
"""

from __future__ import annotations

from tpulaunch.engine import registry
from tpulaunch.job.load import LoadedJob

# A key only another engine runs (TPUEstimator's own functions, on the keras engine): explain names the way out.
ESTIMATOR_ONLY = "estimator-only-key"


def job_engine(loaded: LoadedJob) -> str:
    """The job's engine; a `run:` section with a mistake elsewhere still names it (`run.engine` as written)."""
    run = loaded.section("run")
    if run is None and isinstance(loaded.data, dict) and isinstance(loaded.data.get("run"), dict):
        written = loaded.data["run"].get("engine")
        if written in registry.names():
            return written
    return registry.engine_name(run)


def job_engine_about(loaded: LoadedJob):
    return registry.about(job_engine(loaded))


def engine_problems(loaded: LoadedJob) -> list:
    """The rules of the job's engine that `checks/static.py` does not hold."""
    return job_engine_about(loaded).rules()(loaded)
