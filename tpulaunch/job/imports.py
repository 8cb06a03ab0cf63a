"""Resolve 'package.module:function' strings from a job file, with errors that name the module; the job's import
search path in effect while its code runs; what TensorFlow 2 removed, and what replaces it."""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import traceback
from typing import Any, Iterator, Optional, Sequence

from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.schema import IMPORT_PATH


class ImportPathError(TpuLaunchError):
    """An import path from the job file could not be resolved."""


def resolve(spec: str, *, search_path: Sequence[str] = (), what: str = "object") -> Any:
    """Import `module:attr.sub` and return the attribute.

    `search_path` (e.g. the job file's directory) is tried before sys.path, so a job's own model code
    sitting next to its YAML file imports without installing anything.

    Raises:
        ImportPathError: malformed string, module not found, error while importing, or missing attribute.
    """
    if not IMPORT_PATH.match(spec or ""):
        raise ImportPathError(f"{what} {spec!r} is not of the form 'package.module:function'",
                              hint="e.g. my_models.unet:build")
    module_name, _, attr_path = spec.partition(":")
    with job_import_path(search_path):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or module_name
            frame = _last_frame_in_user_code(exc)
            removed = removed_in_tensorflow2(missing, _source_line(exc))
            if removed is not None:
                said, instead = removed
                raise ImportPathError(f"cannot import {what} {spec!r}: module '{module_name}' imports {said}"
                                      + (f" (at {frame})" if frame else ""), hint=instead) from None
            if missing == module_name or module_name.startswith(missing + "."):
                where = ", ".join(os.path.abspath(p) for p in search_path) or "the current directory"
                raise ImportPathError(f"cannot import {what} {spec!r}: no module named '{missing}'",
                                      hint=f"looked in {where} and PYTHONPATH; check the spelling or install the package") from None
            raise ImportPathError(f"cannot import {what} {spec!r}: module '{module_name}' needs '{missing}', which is not installed",
                                  hint=f"pip install the package that provides '{missing}'") from None
        except ImportPathError:
            raise
        except Exception as exc:  # the user's module failed while importing: show where, not a traceback
            frame = _last_frame_in_user_code(exc)
            removed = removed_in_tensorflow2(str(exc), _source_line(exc))
            hint = f"the error is raised at {frame}" if frame else "rerun with --debug for the traceback"
            raise ImportPathError(f"importing module '{module_name}' for {what} {spec!r} failed: {type(exc).__name__}: {exc}",
                                  hint=f"{removed[1]} ({hint})" if removed else hint) from exc
    obj: Any = module
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n, None))]
            import difflib
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"did you mean '{module_name}:{close[0]}'?" if close else (
                f"callables in {module_name}: {', '.join(names[:10])}" if names else None)
            raise ImportPathError(f"module '{module_name}' has no attribute '{attr_path}' (for {what} {spec!r})", hint=hint)
        obj = getattr(obj, part)
    return obj


@contextlib.contextmanager
def job_import_path(search_path: Sequence[str]) -> Iterator[None]:
    """The job's search path (the job file's directory, then python_path) in front of sys.path, in that order, while
    the job's code runs: a model_fn or input_fn that imports a module beside it when it is called (TF1 programs do)
    finds it, as under `PYTHONPATH=...`. Entries already on sys.path stay where they are; those added are removed
    on exit, so jobs run one after another in one process do not see each other's directories."""
    added = [p for p in dict.fromkeys(search_path) if p and p not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for p in added:
            if p in sys.path:
                sys.path.remove(p)


# What TensorFlow 2.0 removed that TF1-era programs import, and what replaces the common pieces (longest name first).
_CONTRIB_REPLACEMENTS = (
    ("slim", "tf-slim (pip install tf-slim; `import tf_slim as slim`)"),
    ("tpu", "tf.compat.v1.estimator.tpu (TPUEstimator, RunConfig, TPUConfig) and tf.compat.v1.tpu "
            "(CrossShardOptimizer, bfloat16_scope, cross_replica_sum)"),
    ("layers", "tf-slim's layers (`tf_slim.layers`: arg_scope, conv2d, batch_norm) or tf.keras.layers"),
    ("framework", "tf-slim (`tf_slim.arg_scope`, `tf_slim.add_arg_scope`) or tf.compat.v1"),
    ("training", "tf.compat.v1.estimator (HParams: a plain dict of params)"),
    ("estimator", "tf.estimator (tensorflow-estimator)"),
    ("learn", "tf.estimator (tensorflow-estimator)"),
    ("data", "tf.data and tf.data.experimental"),
    ("summary", "tf.compat.v2.summary"),
    ("metrics", "tf.compat.v1.metrics"),
    ("distribute", "tf.distribute"),
    ("image", "tf.image, or tf.raw_ops.ImageProjectiveTransformV3 for rotate/translate/transform"),
    ("opt", "tf.compat.v1.train's optimizers (LARS and the like: copy the optimizer into the program)"),
    ("cloud", "nothing in TensorFlow (Bigtable input: read TFRecords instead)"),
)
_REMOVED = re.compile(r"(?:\btensorflow|\btf)\.contrib(?:\.(\w+)| import (\w+))?|"
                      r"module 'tensorflow(?:\.compat\.v1)?' has no attribute 'contrib'")


# TensorFlow 1's shapes held Dimension objects (`shape[1].value`); TensorFlow 2's hold ints and None.
_DIMENSION_VALUE = re.compile(r"'(?:NoneType|int)' object has no attribute 'value'")


def removed_in_tensorflow2(*texts: Optional[str]) -> Optional[tuple]:
    """(what the program used, what to do) when `texts` (a missing module's name, an error message, the source line
    that failed) show something TensorFlow 2 removed: `tensorflow.contrib`, or TF1's Dimension objects in shapes
    (`shape[1].value`); else None."""
    found = [m for text in texts if text for m in _REMOVED.finditer(text)]
    if not found:
        if any(text and _DIMENSION_VALUE.search(text) for text in texts):
            return ("a TensorFlow 1 shape dimension's .value",
                    "TensorFlow 2's shapes hold ints and None, not TF1's Dimension objects: `shape[i]` instead of "
                    "`shape[i].value`, or tf.compat.v1.disable_v2_tensorshape() where the program starts; "
                    "docs/own-program.md, 'Porting a TF1-era program'")
        return None
    parts = [part for m in found for part in m.groups() if part]
    said = f"'tensorflow.contrib.{parts[0]}'" if parts else "'tensorflow.contrib'"
    known = dict(_CONTRIB_REPLACEMENTS)
    if parts and parts[0] in known:
        instead = f"tensorflow.contrib.{parts[0]} -> {known[parts[0]]}"
    else:
        instead = "; ".join(f"contrib.{name} -> {use}" for name, use in _CONTRIB_REPLACEMENTS[:5])
    return (f"{said}, which TensorFlow 2 removed (tf.contrib ended with TensorFlow 1.15)",
            f"no package provides it: port the import ({instead}); docs/own-program.md, 'Porting a TF1-era "
            f"program'")


def _source_line(exc: BaseException) -> Optional[str]:
    """The source line the innermost frame outside importlib failed on (`import tensorflow.contrib.slim as slim`)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename]
    return frames[-1].line if frames else None


def _last_frame_in_user_code(exc: BaseException) -> Optional[str]:
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    frames = [f for f in frames if "importlib" not in f.filename and not f.filename.endswith("imports.py")]
    if not frames:
        return None
    last = frames[-1]
    return f"{last.filename}:{last.lineno}"


def resolve_input_fn(data, mode: str, *, search_path: Sequence[str] = ()) -> Any:
    """The job's own input_fn for `mode`: the function its import path names, or what its call makes."""
    call = data.input_fn_call(mode)
    if call is None:
        return resolve(data.input_fn_for(mode), search_path=search_path, what=f"{mode} input_fn")
    return make_call(call, search_path=search_path, what=f"the {mode} input_fn")


def make_call(call, *, search_path: Sequence[str] = (), what: str) -> Any:
    """What a job-file Call makes (schema.Call): `factory(**args)` or its `.method`, or `function` with `args`
    bound; a value in `args` that is itself a call is made first.

    Raises:
        ImportPathError: a path that does not import, a factory that refuses its arguments, or no such method.
    """
    import functools

    from tpulaunch.job.schema import Call, is_call

    target = resolve(call.path, search_path=search_path, what=what)
    args = {name: make_call(Call.model_validate(value), search_path=search_path, what=f"{what}'s {name}")
            if is_call(value) else value for name, value in call.args.items()}
    if call.function:
        return functools.partial(target, **args)
    try:
        made = target(**args)
    except Exception as exc:  # the program's own code: its message, located at the job key
        raise ImportPathError(f"{call.path}(**args) failed making {what}: {type(exc).__name__}: {exc}",
                              hint="check the args against its parameters") from None
    if call.method is None:
        return made
    method = getattr(made, call.method, None)
    if not callable(method):
        raise ImportPathError(f"what {call.path} makes has no method {call.method!r}",
                              hint="name the method TensorFlow should call, e.g. method: input_fn")
    return method
