"""`validate`'s input_fn check: what the job's input_fn yields is what data.features and data.labels declare.

For an input_fn job, data.features and data.labels describe the tensors the input_fn yields (what
model_fn receives), not what any records store: export builds its serving signature from them, and
plan and `validate --tf` shape their checks by them. Each input_fn the job runs is called once, as
TPUEstimator calls it (params with `batch_size` and the job's model.params; `mode` and `config` when
it names them), inside a scratch graph: the dataset is built, never iterated, and its
`element_spec` is compared with the declarations.
"""

from __future__ import annotations

import inspect
from typing import Optional, Sequence

from tpulaunch.errors import first_line
from tpulaunch.job.imports import ImportPathError, resolve, resolve_input_fn
from tpulaunch.job.load import LoadedJob
from tpulaunch.plan.partition import shape_text

CALL_FAILED = "input-fn-call-failed"
STRUCTURE = "input-fn-structure"
DTYPE = "input-fn-dtype"
SHAPE = "input-fn-shape"


def input_signature_problems(loaded: LoadedJob, search_path: Sequence[str] = ()) -> list:
    """For each mode the job runs with an input_fn: a failed call, or each difference from the declarations."""
    job = loaded.job
    if job is None or job.data.input_fn is None:
        return []
    from tpulaunch.engine.job_code import running_job_code

    with running_job_code(job):  # as the run calls it: from the job file's directory, python_path in effect
        return _first_per_key([p for mode in ("train", "eval") for p in _mode_problems(loaded, mode, search_path)])


def _mode_problems(loaded: LoadedJob, mode: str, search_path: Sequence[str]) -> list:
    from tpulaunch.engine.estimator.locate import input_fn_key

    job = loaded.job
    path = job.data.input_fn_for(mode)
    if getattr(job, mode) is None or path is None:
        return []
    key = input_fn_key(job.data, mode)
    try:
        resolve(path, search_path=search_path, what=f"{mode} input_fn")
    except ImportPathError:
        return []  # reported by the model check, at the same key
    try:
        input_fn = resolve_input_fn(job.data, mode, search_path=search_path)
    except ImportPathError as exc:  # a factory that refused its arguments
        return [loaded.problem(key, CALL_FAILED, exc.message, exc.hint)]
    try:
        yielded = yielded_spec(loaded, input_fn, mode)
    except Exception as exc:  # pylint: disable=broad-except  # the user's function failed: say where, not a traceback
        return [_call_failed(loaded, key, mode, path, exc)]
    return compare(loaded, f"the {mode} input_fn ({path})", yielded)


def _first_per_key(problems: list) -> list:
    """One problem per key and kind: train and eval input_fns usually yield alike, and one fix serves both."""
    seen, out = set(), []
    for p in problems:
        if (p.path, p.code) not in seen:
            seen.add((p.path, p.code))
            out.append(p)
    return out


def input_fn_params(loaded: LoadedJob, mode: str) -> dict:
    """The params TPUEstimator gives the input_fn for `mode` in the run validate checks for."""
    from tpulaunch.checks.static import per_replica_batch
    from tpulaunch.engine.estimator.params import estimator_params

    from tpulaunch.engine.estimator.params import mode_params

    return {**(estimator_params(loaded.job) or {}), **mode_params(loaded.job, mode),
            "batch_size": per_replica_batch(loaded, mode)}


def yielded_spec(loaded: LoadedJob, input_fn, mode: str):
    """The input_fn's output structure as TensorSpecs (a Dataset's element_spec), built in a scratch graph.

    Raises:
        TypeError: the function takes no `params` (TPUEstimator always passes it).
        Exception: whatever the input_fn raises.
    """
    import tensorflow as tf

    accepted = inspect.signature(input_fn).parameters
    if "params" not in accepted:
        raise TypeError("it takes no params argument; TPUEstimator calls input_fn(params) with params['batch_size']")
    kwargs = {"params": input_fn_params(loaded, mode)}
    if "mode" in accepted:
        kwargs["mode"] = mode
    if "config" in accepted:
        from tpulaunch.engine.estimator.make import plan_on_this_machine, run_config

        kwargs["config"] = run_config(loaded.job, plan_on_this_machine(loaded.job))
    with tf.Graph().as_default():
        result = input_fn(**kwargs)
        if isinstance(result, tf.data.Dataset):
            return result.element_spec
        return tf.nest.map_structure(tf.TensorSpec.from_tensor, result)


def compare(loaded: LoadedJob, what: str, yielded) -> list:
    """Problems where `yielded` ((features, labels) or features) differs from data.features / data.labels."""
    data = loaded.job.data
    if isinstance(yielded, tuple) and len(yielded) == 2:
        features, labels = yielded
    else:
        features, labels = (yielded[0] if isinstance(yielded, tuple) and len(yielded) == 1 else yielded), None
    problems = _group(loaded, what, "features", features, data.features)
    if labels is None and data.labels:
        problems.append(loaded.problem(("data", "labels"), STRUCTURE,
                                       f"{what} yields no labels, but data.labels declares {', '.join(data.labels)}",
                                       "yield (features, labels), or remove data.labels"))
    elif labels is not None and not data.labels:
        problems.append(loaded.problem(("data",), STRUCTURE,
                                       f"{what} yields (features, labels), but data.labels declares none",
                                       "declare the labels it yields under data.labels"))
    elif labels is not None:
        problems += _group(loaded, what, "labels", labels, data.labels)
    return problems


def _group(loaded: LoadedJob, what: str, group: str, yielded, declared: dict) -> list:
    if len(declared) == 1:
        (name, spec), = declared.items()
        if isinstance(yielded, dict):
            return [loaded.problem(
                ("data", group), STRUCTURE,
                f"{what} yields a dict of {group} {sorted(yielded)}, but data.{group} declares one tensor '{name}'",
                f"one entry under data.{group} means a single tensor (export feeds one, partition dims are one list); "
                f"declare every key of the dict, or yield the tensor itself")]
        return _tensor(loaded, what, group, name, spec, yielded)
    if not isinstance(yielded, dict):
        return [loaded.problem(("data", group), STRUCTURE,
                               f"{what} yields one {group[:-1]} tensor, but data.{group} declares "
                               f"{len(declared)} ({', '.join(declared)})",
                               f"declare the one tensor it yields, or yield a dict keyed {', '.join(declared)}")]
    problems = []
    missing = [n for n in declared if n not in yielded]
    extra = [n for n in yielded if n not in declared]
    for name in missing:
        problems.append(loaded.problem(("data", group, name), STRUCTURE,
                                       f"{what} yields no '{name}' (it yields {', '.join(sorted(yielded))})",
                                       f"declare under data.{group} the keys the input_fn yields", at_key=True))
    if extra:
        problems.append(loaded.problem(("data", group), STRUCTURE,
                                       f"{what} also yields {', '.join(sorted(extra))}, not declared in data.{group}",
                                       f"declare every tensor the input_fn yields under data.{group}"))
    for name in declared:
        if name in yielded:
            problems += _tensor(loaded, what, group, name, declared[name], yielded[name])
    return problems


def _tensor(loaded: LoadedJob, what: str, group: str, name: str, spec, yielded) -> list:
    import tensorflow as tf

    if not isinstance(yielded, tf.TensorSpec):
        return [loaded.problem(("data", group, name), STRUCTURE,
                               f"{what} yields '{name}' as {type(yielded).__name__}, not a dense tensor",
                               "yield dense tensors (convert sparse or ragged ones in the input_fn)")]
    problems = []
    if yielded.dtype.name != spec.dtype:
        problems.append(loaded.problem(
            ("data", group, name, "dtype"), DTYPE,
            f"{what} yields '{name}' as {yielded.dtype.name}, but it is declared {spec.dtype}",
            f"data.{group} describes what the input_fn yields (decoded), not what records store: "
            f"declare dtype: {yielded.dtype.name}"))
    example = _per_example(yielded.shape)
    if example is not None and not _agree(example, spec.shape):
        problems.append(loaded.problem(
            ("data", group, name, "shape"), SHAPE,
            f"{what} yields '{name}' with {shape_text(example)} per example (batch dim left out), but it is declared "
            f"{shape_text(spec.shape)}",
            f"declare shape: {shape_text(example)} (per example, without the batch dim)"))
    return problems


def _per_example(shape) -> Optional[list]:
    """The shape without its batch dim; None when the rank is unknown."""
    if shape.rank is None:
        return None
    dims = shape.as_list()
    return dims[1:] if dims else dims


def _agree(a: Sequence[Optional[int]], b: Sequence[Optional[int]]) -> bool:
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def _call_failed(loaded: LoadedJob, key: tuple, mode: str, path: str, exc: Exception):
    from tpulaunch.engine.core.build_failures import DEBUG_HINT, raised_line, unstaged, where_raised
    from tpulaunch.job.imports import removed_in_tensorflow2

    exc = unstaged(exc)  # the error tf.data's autograph wrapped (an input_fn's map function that failed)
    on_tpu = loaded.section("tpu") is not None
    keys = ", ".join(sorted(input_fn_params(loaded, mode)))
    message = f"{type(exc).__name__}: {first_line(exc)}"
    frame = where_raised(exc)
    removed = removed_in_tensorflow2(message, raised_line(exc))
    hint = (f"raised at {frame}; " if frame else "") + (f"{removed[1]}; " if removed else "") + (
        f"validate calls it as TPUEstimator does, with params {{{keys}}}, and reads nothing ({DEBUG_HINT})")
    if on_tpu:
        hint += "; on the TPU it also gets params['context'] (a TPUContext), which validate cannot give it"
    return loaded.problem(key, CALL_FAILED, f"calling the {mode} input_fn {path} to see what it yields failed: {message}",
                          hint, severity="warning" if on_tpu else "error")
