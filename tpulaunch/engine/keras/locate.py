"""Where the keras engine's own code (standalone.py's KerasTraining and its factories) calls the job's code: a
failure there is located at the job key the code comes from (`engine/core/build_failures.py`)."""

from __future__ import annotations

import functools
import os

from tpulaunch.engine.core import build_failures
from tpulaunch.engine.core.build_failures import JobCodeCalls

_LOSS, _METRICS, _OPTIMIZER = ("model", "loss"), ("model", "metrics"), ("model", "optimizer")

CALLS = JobCodeCalls(
    file=os.path.join(os.path.dirname(__file__), "standalone.py"),
    by_function={"keras_optimizer_factory": _OPTIMIZER, "factory": _OPTIMIZER, "fresh_keras_metric": _METRICS,
                 "_keras_metric": _METRICS, "_update_metric": _METRICS, "_metric_objects": _METRICS,
                 "_metrics_for_compile": _METRICS, "fresh_keras_loss": _LOSS, "_loss_for_compile": _LOSS},
    callers=("__init__", "_forward", "_replica_train_step", "_job_step_optimizer", "_compile_for_own_step"),
    by_line=(("builder(", ("model", "builder")), ("model(features", ("data", "features")),
             ("model.build(", ("data", "features")), ("make_optimizer(", _OPTIMIZER),
             ("apply_gradients(", _OPTIMIZER), ("optimizer.build(", _OPTIMIZER)),
)
build_errors = functools.partial(build_failures.build_errors, calls=CALLS)


def blame(exc: BaseException, stage: tuple, job) -> tuple:
    """(job key, message, hint) of a failure while building (`build_failures.blame`, with this engine's calls)."""
    return build_failures.blame(exc, stage, job, CALLS)
