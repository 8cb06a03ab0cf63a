"""`validate`'s model checks before anything is built: the job's import paths resolve, and the builder
takes the job's params (did-you-mean at the parameter's key, also for builders that take **kwargs).

Whether the model then builds, takes the declared features and fits the labels, loss, metrics and
optimizer is not modelled here: the engine builds the graphs `train` builds (`Engine.check_build`)
and reports what fails, at the key its code comes from.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Sequence

from tpulaunch.job.imports import ImportPathError, resolve
from tpulaunch.job.load import LoadedJob

# Parameters tpulaunch passes to a builder itself (job/builder_args.py).
AUTOMATIC_PARAMS = {"input_shape", "input_shapes"}


def model_problems(loaded: LoadedJob, search_path: Sequence[str] = ()) -> list:
    """Problems with the job's model, located at the model keys they come from."""
    model = loaded.section("model")
    if model is None:
        return []
    problems = []

    def importable(key: tuple, spec: str, what: str):
        try:
            return resolve(spec, search_path=search_path, what=what)
        except ImportPathError as exc:
            problems.append(loaded.problem(key, "import-failed", exc.message, exc.hint))
            return None

    data = loaded.section("data")
    if data is not None and isinstance(data.input_fn, str):
        importable(("data", "input_fn"), data.input_fn, "input_fn")
    elif data is not None and data.input_fn is not None:
        for mode in ("train", "eval", "predict"):
            if data.input_fn_for(mode):
                importable(("data", "input_fn", mode), data.input_fn_for(mode), f"{mode} input_fn")
    if model.serving_input_fn:
        importable(("model", "serving_input_fn"), model.serving_input_fn, "serving_input_fn")
    if model.model_fn:
        importable(("model", "model_fn"), model.model_fn_path, "model_fn")
        return problems
    builder = importable(("model", "builder"), model.builder, "model builder")
    for key, path in model.function_paths():
        importable(key, path, "loss" if key[1] == "loss" else "metric")
    if ":" in model.optimizer.name:
        importable(("model", "optimizer", "name"), model.optimizer.name, "optimizer")
    if builder is None:
        return problems
    problems.extend(_params_problems(loaded, builder, model))
    return problems


def _params_problems(loaded: LoadedJob, builder, model) -> list:
    """Each model.params key is a parameter of the builder; each parameter without a default is given.

    A builder that also takes **kwargs (Keras Applications, wrappers) accepts any name, so a key is
    refused only when it is one edit away from a named parameter it is not (`clases` for `classes`).
    """
    try:
        signature = inspect.signature(builder)
    except (TypeError, ValueError):
        return []
    parameters = signature.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    accepted = [name for name, p in parameters.items()
                if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    problems = []
    for name in model.params:
        if name in accepted:
            continue
        close = difflib.get_close_matches(name, accepted, n=1, cutoff=0.8 if takes_any else 0.6)
        if takes_any and not close:
            continue  # passed on through **kwargs
        hint = f"did you mean '{close[0]}'?" if close else f"{model.builder} takes: {', '.join(accepted) or 'no parameters'}"
        problems.append(loaded.problem(("model", "params", name), "unknown-param",
                                       f"{model.builder} has no parameter '{name}'", hint, at_key=True))
    for name, p in parameters.items():
        if (p.default is inspect.Parameter.empty and name not in model.params and name not in AUTOMATIC_PARAMS
                and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)):
            problems.append(loaded.problem(("model", "params"), "missing-param",
                                           f"{model.builder} needs parameter '{name}'",
                                           f"add it under model.params: {{{name}: ...}}"))
    return problems
