"""Static rules for a model's heads: `model.loss` and `model.metrics` given per label name labels that
exist, every label has a loss, and every metric fits a head (class metrics need a crossentropy loss,
value metrics a regression loss).

Whether the model's outputs pair with the labels is known only once the model is built (validate's
build stage). Pure Python and fast: no TensorFlow.
"""

from __future__ import annotations

import difflib

from tpulaunch.job.load import LoadedJob
from tpulaunch.job.schema import metric_fits_loss


def head_problems(loaded: LoadedJob) -> list:
    model, data = loaded.section("model"), loaded.section("data")
    if model is None or data is None or model.model_fn:
        return []
    labels = list(data.labels)
    problems = []
    if isinstance(model.loss, dict):
        problems += _keys_not_labels(loaded, "loss", model.loss, labels)
        missing = [name for name in labels if name not in model.loss]
        if missing:
            problems.append(loaded.problem(
                ("model", "loss"), "label-without-loss",
                f"model.loss gives a loss per label but none for {', '.join(repr(m) for m in missing)}",
                "add " + ", ".join(f"{m}: <loss>" for m in missing) + " (every label is scored by its own loss)"))
    if isinstance(model.outputs, dict):
        problems += _keys_not_labels(loaded, "outputs", model.outputs, labels)
    losses = model.losses_by_label(labels)
    if isinstance(model.metrics, dict):
        problems += _keys_not_labels(loaded, "metrics", model.metrics, labels)
        for label, names in model.metrics.items():
            for i, metric in enumerate(names):
                if label in losses and not metric_fits_loss(metric, losses[label]):
                    problems.append(loaded.problem(
                        ("model", "metrics", label, i), "metric-does-not-fit",
                        f"metric {metric!r} does not fit label {label!r}, scored by {losses[label]}",
                        _fit_hint(metric)))
    elif losses:
        for i, metric in enumerate(model.metrics):
            if not any(metric_fits_loss(metric, loss) for loss in losses.values()):
                scored = ", ".join(f"{label}: {loss}" for label, loss in losses.items())
                problems.append(loaded.problem(
                    ("model", "metrics", i), "metric-fits-no-head",
                    f"metric {metric!r} fits none of the model's heads ({scored})", _fit_hint(metric)))
    return problems


def _keys_not_labels(loaded: LoadedJob, key: str, mapping: dict, labels: list) -> list:
    problems = []
    for name in mapping:
        if name in labels:
            continue
        close = difflib.get_close_matches(name, labels, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'?" if close else f"the labels are: {', '.join(labels) or 'none declared'}"
        problems.append(loaded.problem(("model", key, name), f"{key}-key-not-a-label",
                                       f"model.{key} names '{name}', which is not a label in data.labels", hint,
                                       at_key=True))
    return problems


def _fit_hint(metric: str) -> str:
    if metric in ("mean_squared_error", "mean_absolute_error"):
        return "value metrics need a regression loss (mean_squared_error, mean_absolute_error, huber); remove it"
    return "class metrics need a crossentropy loss; use mean_squared_error or mean_absolute_error on a regression head"
