"""`validate`'s model checks: the job's import paths resolve, the builder takes the job's params, and
the model it builds takes the declared features and produces what the loss needs for the labels.

The model is built symbolically (Keras shapes only, no step is run), at the declared per-example
shapes, so a 256^3 volume costs no more than a small one.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Optional, Sequence

from tpulaunch.job.imports import ImportPathError, resolve
from tpulaunch.job.load import LoadedJob
from tpulaunch.plan.partition import shape_text

# Losses whose label shape is the output shape without the class axis.
_SPARSE_LOSSES = ("sparse_categorical_crossentropy",)
_DENSE_LOSSES = ("categorical_crossentropy", "binary_crossentropy", "mean_squared_error",
                 "mean_absolute_error", "huber")


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
    if model.model_fn:
        importable(("model", "model_fn"), model.model_fn, "model_fn")
        return problems
    builder = importable(("model", "builder"), model.builder, "model builder")
    if ":" in model.loss:
        importable(("model", "loss"), model.loss, "loss")
    for i, metric in enumerate(model.metrics):
        if ":" in metric:
            importable(("model", "metrics", i), metric, "metric")
    if ":" in model.optimizer.name:
        importable(("model", "optimizer", "name"), model.optimizer.name, "optimizer")
    if builder is None:
        return problems
    param_problems = _params_problems(loaded, builder, model)
    problems.extend(param_problems)
    if not param_problems and data is not None and not any(p.is_error for p in problems):
        problems.extend(_built_model_problems(loaded, builder, model, data))
    return problems


def _params_problems(loaded: LoadedJob, builder, model) -> list:
    try:
        signature = inspect.signature(builder)
    except (TypeError, ValueError):
        return []
    parameters = signature.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return []
    accepted = [name for name, p in parameters.items()
                if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    problems = []
    for name in model.params:
        if name not in accepted:
            close = difflib.get_close_matches(name, accepted, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"{model.builder} takes: {', '.join(accepted) or 'no parameters'}"
            problems.append(loaded.problem(("model", "params", name), "unknown-param",
                                           f"{model.builder} has no parameter '{name}'", hint, at_key=True))
    automatic = {"input_shape", "input_shapes"}
    for name, p in parameters.items():
        if (p.default is inspect.Parameter.empty and name not in model.params and name not in automatic
                and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)):
            problems.append(loaded.problem(("model", "params"), "missing-param",
                                           f"{model.builder} needs parameter '{name}'",
                                           f"add it under model.params: {{{name}: ...}}"))
    return problems


def _built_model_problems(loaded: LoadedJob, builder, model, data) -> list:
    import tensorflow as tf

    from tpulaunch.job.builder_args import builder_kwargs

    try:
        keras_model = builder(**builder_kwargs(builder, model.params, data.features))
    except Exception as exc:  # the user's builder failed: report it at the builder, with the message
        from tpulaunch.engine.estimator.weights import download_error, download_failure

        failure = download_failure(exc)
        if failure is not None:
            return [loaded.problem(("model", "builder"), "builder-download-failed", *download_error(model.builder, failure))]
        return [loaded.problem(("model", "builder"), "builder-failed",
                               f"{model.builder} raised {type(exc).__name__}: {_first_line(exc)}",
                               "rerun with --debug for the traceback; check model.params and the feature shapes")]
    if not isinstance(keras_model, tf.keras.Model):
        return [loaded.problem(("model", "builder"), "builder-not-keras",
                               f"{model.builder} returned {type(keras_model).__name__}, not a tf.keras.Model",
                               "return the (uncompiled) tf.keras.Model; or use model.model_fn for a hand-written model_fn")]
    problems = _input_problems(loaded, keras_model, data)
    if not problems:
        problems = _output_problems(loaded, keras_model, model, data)
    return problems


def _input_problems(loaded: LoadedJob, keras_model, data) -> list:
    inputs = keras_model.inputs or []
    features = data.features
    if len(features) == 1:
        if len(inputs) != 1:
            return [loaded.problem(("data", "features"), "model-inputs-mismatch",
                                   f"the model takes {len(inputs)} inputs but data.features declares one tensor",
                                   "declare one feature per model input (the model then gets a dict)")]
        (name, spec), = features.items()
        got = list(inputs[0].shape)[1:]
        if not _shapes_agree(got, spec.shape):
            return [loaded.problem(("data", "features", name, "shape"), "model-input-shape",
                                   f"the model's input is {shape_text(got)} per example but '{name}' is declared {shape_text(spec.shape)}",
                                   "make the builder use input_shape (tpulaunch passes it), or fix the declared shape")]
        return []
    names = {getattr(t, "name", "").split(":")[0] for t in inputs}
    missing = [n for n in features if n not in names and not any(n in x for x in names)]
    if missing and len(inputs) != len(features):
        return [loaded.problem(("data", "features"), "model-inputs-mismatch",
                               f"the model takes {len(inputs)} inputs but data.features declares {len(features)}",
                               "name the Keras Inputs like the features (tf.keras.Input(..., name='image'))")]
    return []


def _output_problems(loaded: LoadedJob, keras_model, model, data) -> list:
    outputs = keras_model.outputs or []
    if len(outputs) != 1 or len(data.labels) != 1 or ":" in model.loss:
        return []  # several heads or a custom loss: the loss function defines the pairing
    (name, label), = data.labels.items()
    out = list(outputs[0].shape)[1:]
    if model.loss in _SPARSE_LOSSES:
        expected = out[:-1]
        if not _shapes_agree(expected, label.shape):
            return [loaded.problem(("data", "labels", name, "shape"), "label-shape-mismatch",
                                   f"{model.loss} needs labels shaped like the output without its class axis: "
                                   f"the model outputs {shape_text(out)}, so '{name}' should be {shape_text(expected)}, "
                                   f"but it is declared {shape_text(label.shape)}",
                                   "fix the label shape, or use categorical_crossentropy for one-hot labels")]
        if label.dtype in ("float32", "float16", "bfloat16"):
            return [loaded.problem(("data", "labels", name, "dtype"), "label-dtype",
                                   f"{model.loss} needs integer class ids, but '{name}' is {label.dtype}",
                                   "declare dtype: int64 (or int32/uint8 with encoding: raw)")]
    elif model.loss in _DENSE_LOSSES and not _shapes_agree(out, label.shape):
        return [loaded.problem(("data", "labels", name, "shape"), "label-shape-mismatch",
                               f"{model.loss} needs labels shaped like the output {shape_text(out)}, "
                               f"but '{name}' is declared {shape_text(label.shape)}",
                               "fix the label shape, or use sparse_categorical_crossentropy for class ids")]
    return []


def _shapes_agree(a: Sequence[Optional[int]], b: Sequence[Optional[int]]) -> bool:
    if len(a) != len(b):
        return False
    return all(x is None or y is None or x == y for x, y in zip(a, b))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else ""
