"""Static rules for a job that brings its own TPUEstimator program: its model_fn, input_fns and params.

Keys such a job cannot use are refused rather than silently ignored: tpulaunch's loss, optimizer,
metrics and precision belong to the model it builds from a Keras builder, and TPUEstimator sets
`batch_size`, `use_tpu` and `context` in params itself. Data the job's input_fn replaces is warned
about. Pure Python and fast: no TensorFlow.
"""

from __future__ import annotations

from tpulaunch.job.load import LoadedJob
from tpulaunch.job.schema import InputFns

# Model keys that only mean something for a model tpulaunch builds from `model.builder`.
BUILDER_ONLY = ("loss", "optimizer", "metrics", "precision", "outputs")


def own_program_problems(loaded: LoadedJob) -> list:
    """Every rule below, for the sections that validated."""
    return model_fn_key_problems(loaded) + eval_params_problems(loaded) + input_fn_problems(loaded)


def model_fn_key_problems(loaded: LoadedJob) -> list:
    """Builder-only keys, and params TensorFlow sets itself, on a `model.model_fn` job."""
    model = loaded.section("model")
    written = loaded.data.get("model") if isinstance(loaded.data, dict) else None
    if model is None or not model.model_fn or not isinstance(written, dict):
        return []
    problems = []
    for key in BUILDER_ONLY:
        if key in written:
            problems.append(loaded.problem(
                ("model", key), "model-fn-job-key",
                f"model.{key} is not used with model.model_fn: your model_fn makes its own {key}",
                "remove it; pass values your model_fn reads through model.params (params[...]) or flags:",
                at_key=True))
    for key in model.params:
        if key in loaded.engine_about.params_set_by_tensorflow:
            problems.append(loaded.problem(
                ("model", "params", key), "params-set-by-tensorflow",
                f"params['{key}'] is set by TPUEstimator itself",
                "use another name; the batch size comes from train.batch_size and eval.batch_size", at_key=True))
    return problems


def eval_params_problems(loaded: LoadedJob) -> list:
    """eval.params on a builder job (whose model.params are the builder's arguments, the same model in every mode),
    and params TensorFlow sets itself."""
    model, evaluation = loaded.section("model"), loaded.section("eval")
    if model is None or evaluation is None or not evaluation.params:
        return []
    if not model.model_fn:
        return [loaded.problem(("eval", "params"), "eval-params-builder-job",
                               "eval.params are the params of a model_fn job's graphs that do not train; a builder "
                               "job's model.params are the builder's arguments, one model for every mode",
                               "remove eval.params: Keras layers (dropout, batch norm) already run in inference mode "
                               "when evaluating", at_key=True)]
    return [loaded.problem(("eval", "params", key), "params-set-by-tensorflow",
                           f"params['{key}'] is set by TPUEstimator itself",
                           "use another name; the batch size comes from eval.batch_size", at_key=True)
            for key in evaluation.params if key in loaded.engine_about.params_set_by_tensorflow]


def input_fn_problems(loaded: LoadedJob) -> list:
    """A mode the job runs without a function in the data.input_fn mapping; data the input_fn replaces."""
    data = loaded.section("data")
    if data is None or data.input_fn is None:
        return []
    problems = []
    for mode in ("train", "eval"):
        if loaded.section(mode) is None:
            continue
        if data.input_fn_for(mode) is None:
            named = ", ".join(m for m in ("train", "eval", "predict") if data.input_fn_for(m))
            problems.append(loaded.problem(
                ("data", "input_fn"), "input-fn-mode-missing",
                f"the job has {'an' if mode == 'eval' else 'a'} {mode}: section but data.input_fn names functions only for {named}",
                f"add {mode}: pkg.mod:{mode}_input_fn under data.input_fn, or remove the {mode}: section"))
        elif getattr(data, mode) is not None:
            problems.append(loaded.problem(
                ("data", mode), "records-not-read",
                f"data.{mode} is not read: the {mode} data comes from data.input_fn",
                f"remove data.{mode}, or data.input_fn{'.' + mode if isinstance(data.input_fn, InputFns) else ''}",
                severity="warning"))
    for group in ("features", "labels"):
        for name, spec in getattr(data, group).items():
            for key in ("encoding", "key"):
                if getattr(spec, key) is not None:
                    problems.append(loaded.problem(
                        ("data", group, name, key), "input-fn-storage-key",
                        f"data.{group}.{name}.{key} describes stored records, but this job's input_fn yields the "
                        "tensors: data.features and data.labels describe what it yields",
                        f"remove {key}; give the dtype and shape of the tensor the input_fn yields", severity="warning",
                        at_key=True))
    return problems
