"""Where the jax engine's own code (standalone.py's JaxTraining) calls the job's code: a failure there is located at
the job key the code comes from (`engine/core/build_failures.py`; a failure anywhere else in its build belongs to
the builder)."""

from __future__ import annotations

import functools
import os

from tpulaunch.engine.core import build_failures
from tpulaunch.engine.core.build_failures import JobCodeCalls

CALLS = JobCodeCalls(
    file=os.path.join(os.path.dirname(__file__), "standalone.py"),
    callers=("__init__",),
    by_line=(("optimizer.build(", ("model", "optimizer")),),
)
build_errors = functools.partial(build_failures.build_errors, calls=CALLS)
