"""The jax engine's own static rules: what it does not honour yet in a key's value, each refused at its key with
what runs it (the keys it refuses whatever their value are its about.py's `refused_keys`). Pure Python
(`validate --static` runs them)."""

from __future__ import annotations

from tpulaunch.checks.engine_rules import unsupported_code
from tpulaunch.engine.jax.about import ABOUT
from tpulaunch.engine.jax.hosts import hosts_problems
from tpulaunch.engine.jax.mesh import mesh_problems
from tpulaunch.job.load import LoadedJob

NOT_YET = unsupported_code(ABOUT.name)
# The job's optimizer names, as Keras optimizers; `momentum` is SGD with momentum (as on the other engines).
OPTIMIZERS = {"sgd": ("SGD", {}), "momentum": ("SGD", {"momentum": 0.9}), "adam": ("Adam", {}),
              "adagrad": ("Adagrad", {}), "rmsprop": ("RMSprop", {})}
# The job's metric names Keras 3 compiles as they are.
METRICS = ("accuracy", "mean_squared_error", "mean_absolute_error")


def problems(loaded: LoadedJob) -> list:
    model, data = loaded.section("model"), loaded.section("data")
    found = []

    def refuse(path, code, message, hint):
        found.append(loaded.problem(path, code, message, hint))

    if model is not None:
        found += _model_problems(loaded, model)
    if data is not None and len(data.labels) != 1:
        refuse(("data", "labels"), NOT_YET, f"the jax engine trains models of one label so far; this job has "
               f"{len(data.labels)}", "set run.engine: keras")
    found += mesh_problems(loaded)  # partition: over a device mesh
    found += hosts_problems(loaded, NOT_YET)  # several hosts: data-parallel only so far
    return found


def _model_problems(loaded: LoadedJob, model) -> list:
    """A loss by name or one import path, an optimizer by name, metrics by the names Keras 3 compiles, float32 or
    bfloat16."""
    found = []
    if isinstance(model.loss, dict):
        found.append(loaded.problem(("model", "loss"), NOT_YET, "the jax engine takes one loss for the model so far",
                                    "give model.loss one name or import path"))
    if model.optimizer.name not in OPTIMIZERS:
        found.append(loaded.problem(("model", "optimizer", "name"), NOT_YET,
                                    "the jax engine makes its optimizer by name only so far",
                                    f"use one of {', '.join(OPTIMIZERS)}"))
    metrics = model.metrics or []
    if isinstance(metrics, dict) or any(name not in METRICS for name in metrics):
        found.append(loaded.problem(("model", "metrics"), NOT_YET,
                                    "the jax engine compiles metrics by these names only so far: "
                                    f"{', '.join(METRICS)}", "list only those, or set run.engine: keras"))
    if model.precision not in ("float32", "bfloat16"):
        found.append(loaded.problem(("model", "precision"), NOT_YET,
                                    f"the jax engine trains in float32 and bfloat16 only so far, not {model.precision}",
                                    "set model.precision: bfloat16, or remove it"))
    return found
