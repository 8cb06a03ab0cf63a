"""Resolve 'package.module:function' strings from a job file, with errors that name the module."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any, Optional, Sequence

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
    added = [p for p in search_path if p and p not in sys.path]
    sys.path[:0] = added
    try:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or module_name
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
            raise ImportPathError(f"importing module '{module_name}' for {what} {spec!r} failed: {type(exc).__name__}: {exc}",
                                  hint=f"the error is raised at {frame}" if frame else "rerun with --debug for the traceback") from exc
    finally:
        for p in added:
            if p in sys.path:
                sys.path.remove(p)
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
