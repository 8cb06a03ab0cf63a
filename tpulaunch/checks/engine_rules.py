"""Which engine's rules a job is checked against, and the dispatch to them. Pure Python.

Each engine declares its own static rules (`EngineAbout.static_rules`, in its folder); the rules every
engine shares are in `checks/static.py`.
"""

from __future__ import annotations

from tpulaunch.job.load import LoadedJob

# A key only another engine runs (TPUEstimator's own functions, on the keras engine): explain names the way out.
ESTIMATOR_ONLY = "estimator-only-key"


def engine_problems(loaded: LoadedJob) -> list:
    """The rules of the job's engine (`loaded.engine`, worked out once) that `checks/static.py` does not hold."""
    return loaded.engine_about.rules()(loaded)
