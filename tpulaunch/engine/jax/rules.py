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
    if model is not None and data is not None and len(data.labels) > 1:
        found += _labels_problems(loaded, model)
    found += mesh_problems(loaded)  # partition: over a device mesh
    found += hosts_problems(loaded, NOT_YET)  # several hosts: data-parallel only so far
    return found


def _labels_problems(loaded: LoadedJob, model) -> list:
    """Several labels: each label's loss and metrics are Keras's compile() per output; one import-path loss of all
    the labels and outputs (RetinaNet's) replaces the model's compute_loss, which leaves Keras no pairing of labels
    with outputs to score metrics by."""
    whole = isinstance(model.loss, str) and ":" in model.loss
    if whole and model.metrics:
        return [loaded.problem(("model", "metrics"), NOT_YET, "the jax engine scores no metrics of a model whose "
                               f"one loss ({model.loss}) takes all its labels and outputs so far: it pairs no label "
                               "with an output for them", "remove model.metrics, give each label its loss by name "
                               "(model.loss: {label: loss}), or set run.engine: keras")]
    return []


def _model_problems(loaded: LoadedJob, model) -> list:
    """A loss by name or one import path (several labels: or a name per label), an optimizer by name, metrics by
    the names Keras 3 compiles (a list, or per label), float32 or bfloat16."""
    found = []
    if isinstance(model.loss, dict):  # each label's loss by name; Keras's compile() sums them
        found += [loaded.problem(("model", "loss", label), NOT_YET, "the jax engine takes a label's own loss by "
                                 f"name only so far, not an import path ({path})",
                                 "name a Keras loss for the label, or give model.loss one import path "
                                 "fn(labels, outputs) for all the labels, or set run.engine: keras")
                  for label, path in model.loss.items() if isinstance(path, str) and ":" in path]
    if model.optimizer.name not in OPTIMIZERS:
        found.append(loaded.problem(("model", "optimizer", "name"), NOT_YET,
                                    "the jax engine makes its optimizer by name only so far",
                                    f"use one of {', '.join(OPTIMIZERS)}"))
    metrics = model.metrics or []
    names = [name for listed in metrics.values() for name in listed] if isinstance(metrics, dict) else metrics
    if any(name not in METRICS for name in names):
        found.append(loaded.problem(("model", "metrics"), NOT_YET,
                                    "the jax engine compiles metrics by these names only so far: "
                                    f"{', '.join(METRICS)}", "list only those, or set run.engine: keras"))
    if model.precision not in ("float32", "bfloat16"):
        found.append(loaded.problem(("model", "precision"), NOT_YET,
                                    f"the jax engine trains in float32 and bfloat16 only so far, not {model.precision}",
                                    "set model.precision: bfloat16, or remove it"))
    return found
