"""The keyword arguments a model builder is called with: the job's params, plus input shapes.

Shared by training (tpulaunch.engine.estimator.model_fn) and validation (tpulaunch.checks.model), so both build the same
model. Pure Python.
"""

from __future__ import annotations

import inspect
from typing import Callable, Mapping


def builder_kwargs(builder: Callable, params: Mapping, features: Mapping) -> dict:
    """`params`, plus `input_shape` (one feature) or `input_shapes` (several) when the builder takes it.

    Shapes are per example (no batch dim), from the job's feature specs; an explicit param wins.
    """
    kwargs = dict(params)
    try:
        accepted = inspect.signature(builder).parameters
    except (TypeError, ValueError):
        accepted = {}
    if len(features) == 1:
        if "input_shape" in accepted and "input_shape" not in kwargs:
            kwargs["input_shape"] = tuple(next(iter(features.values())).shape)
    elif "input_shapes" in accepted and "input_shapes" not in kwargs:
        kwargs["input_shapes"] = {name: tuple(spec.shape) for name, spec in features.items()}
    return kwargs
