"""Where a failure while building a job's step belongs: the job key its code comes from (every engine).

Each engine's own code calls the job's code (builder, loss, metrics, optimizer) from its `standalone.py`; a
failure there is located by the function, or the line, it failed in, as the engine declares them (`JobCodeCalls`,
in its locate.py), and reported at that key with the framework's (or the job's code's) message, in `train` as in
`validate`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import traceback
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence, Tuple

from tpulaunch.errors import TpuLaunchError, first_line, resource_limit_error
from tpulaunch.job.imports import removed_in_tensorflow2
from tpulaunch.job.yamlfile import dotted

@dataclass(frozen=True)
class JobCodeCalls:
    """Where an engine's own code calls the job's code (builder, loss, metrics, optimizer), so that a failure
    inside it is located at the job key that code comes from: each engine declares its own (its locate.py), and
    `tests/core/engine/test_job_code_calls.py` holds each declaration against the engine's file."""

    file: str  # the engine's module that calls the job's code (its standalone.py), by path
    by_function: Mapping[str, tuple] = field(default_factory=dict)  # the key of a failure inside one of its functions
    callers: Tuple[str, ...] = ()  # its functions that call the job's code directly, whose failures are located ...
    by_line: Tuple[Tuple[str, tuple], ...] = ()  # ... by the text of the line they failed on

    def key_in(self, frames: Sequence) -> Optional[tuple]:
        """The job key of the innermost of `frames` in this file that says one (None: none does)."""
        path = os.path.realpath(self.file)
        for frame in reversed([f for f in frames if os.path.realpath(f.filename) == path]):
            if frame.name in self.by_function:
                return self.by_function[frame.name]
            if frame.name in self.callers:
                for text, key in self.by_line:
                    if text in (frame.line or ""):
                        return key
        return None


class BuildError(TpuLaunchError):
    """The job's model_fn failed to build a graph (at `train` as at `validate`): `key` is the job key the
    failing code comes from, `detail` the message (TensorFlow's, the job's code's or tpulaunch's)."""

    def __init__(self, key: tuple, mode: str, detail: str, hint: Optional[str], code: Optional[str] = None):
        super().__init__(f"{dotted(key)}: building the {mode} graph: {detail}", hint=hint, code=code)
        self.key = key
        self.detail = detail


@contextlib.contextmanager
def build_errors(job, mode: str, stage: tuple = ("model", "builder"), *, calls: JobCodeCalls):
    """Any failure of the engine's code around the job's builder (or of its metric_fn: `stage` ("model",
    "metrics")) as a BuildError at the job key its code comes from (`calls`: where the engine calls it)."""
    try:
        yield
    except BuildError:
        raise
    except Exception as exc:  # noqa: BLE001 (the user's code, Keras or TensorFlow: located, never "unexpected")
        if _named_key(exc)[:1] in (("train",), ("eval",)):  # the run's settings (no batch to evaluate), not its code
            raise
        limited = resource_limit_error(exc)
        if limited is not None:  # the machine's limit, not the job's code: said with the limit and its fix
            raise limited from exc
        key, detail, hint = blame(exc, stage, job, calls)
        code = exc.code if isinstance(exc, TpuLaunchError) else None
        raise BuildError(key, {"infer": "predict"}.get(mode, mode), detail, hint, code) from exc


@dataclass
class ModeBuild:
    mode: str
    ok: bool
    key: Optional[tuple] = None  # the job key a failure is reported at
    message: Optional[str] = None
    hint: Optional[str] = None
    code: Optional[str] = None  # a problem code of its own (e.g. builder-download-failed)


def problems_of(loaded, builds, built: str) -> list:
    """`builds` (ModeBuild per mode) as problems, one per job key and message: 'building the train and eval {built}'."""
    failed: dict = {}
    for build in builds:
        if not build.ok:
            failed.setdefault((build.key, build.message, build.hint, build.code), []).append(build.mode)
    return [loaded.problem(key, code or "model-build-failed", f"building the {' and '.join(modes)} {built}: {message}",
                           hint)
            for (key, message, hint, code), modes in failed.items()]



def unstaged(exc: BaseException) -> BaseException:
    """The error the job's code (or ours) raised, under the StagingError tf.function's autograph wraps it in
    (the keras engine traces its steps; an error class autograph cannot rebuild comes out as StagingError)."""
    seen = 0
    while type(exc).__name__ == "StagingError" and seen < 10:
        inner = exc.__cause__ or exc.__context__
        if inner is None:
            break
        exc, seen = inner, seen + 1
    return exc


def blame(exc: BaseException, stage: tuple, job, calls: JobCodeCalls) -> tuple:
    """(job key, message, hint) for a failure while building: the key of the code it failed in (`calls`: where
    the engine calls the job's code)."""
    from tpulaunch.engine.portable import SpecError

    exc = unstaged(exc)
    if isinstance(exc, BuildError):
        return exc.key, exc.detail, exc.hint
    if isinstance(exc, TpuLaunchError):
        return _named_key(exc) or _key_in_trace(exc, stage, calls), exc.message, exc.hint
    if isinstance(exc, SpecError):
        return exc.key or _key_in_trace(exc, stage, calls), str(exc), exc.hint or None
    message = f"{type(exc).__name__}: {first_line(exc)}"
    if any(frame.name == "add_loss" for frame in traceback.extract_tb(exc.__traceback__)):
        return ("model", "builder"), message, (
            "the model calls add_loss() where Keras refuses it: a subclassed model is built with Model.build(), "
            "which runs call() outside Keras's call context; build the model functionally (from tf.keras.Input), "
            "or compute that loss in model.loss ('pkg.mod:fn(labels, outputs)')")
    key = _key_in_trace(exc, stage, calls)
    removed = removed_in_tensorflow2(message, raised_line(exc))
    if removed is not None:
        return key, message, _at_job_frame(exc, removed[1])
    hints = {("model", "loss"): "the loss must take the labels as declared and the model's outputs",
             ("model", "metrics"): "each metric must fit the labels and outputs (classification metrics need a "
                                   "classification loss)",
             ("model", "optimizer"): "check model.optimizer and its args",
             ("data", "features"): "the model must accept the declared features: one tensor, or a dict by name",
             ("model", "builder"): "check model.params against the builder, and the builder itself "
                                   "(`tpulaunch --debug train --local` shows the traceback)",
             ("model", "model_fn"): "the error is in the job's model_fn",
             ("data", "input_fn"): "the error is in the job's input_fn"}
    if key[:2] in (("model", "model_fn"), ("data", "input_fn")):
        return key, message, _at_job_frame(exc, hints[key[:2]])
    return key, message, hints.get(key)


DEBUG_HINT = "`tpulaunch --debug train --local` shows the traceback"


def _at_job_frame(exc: BaseException, said: str) -> str:
    """`said`, then where the job's own code raised `exc` (file:line, in function), then how to see the traceback."""
    frame = where_raised(exc)
    return f"{said}, at {frame} ({DEBUG_HINT})" if frame else f"{said} ({DEBUG_HINT})"


def where_raised(exc: BaseException) -> Optional[str]:
    """'file:line, in function' where the job's own code raised `exc`: in a Keras layer's call() that autograph
    converted (TF1 programs' layers), the line of the job's source autograph maps it back to; else the traceback's."""
    frame = _raising_frame(exc)
    return f"{frame[0]}:{frame[1]}, in {frame[2]}" if frame else None


def raised_line(exc: BaseException) -> Optional[str]:
    """The source line of the job's own code that raised `exc` (`from tensorflow.contrib import image`), or None."""
    frame = _raising_frame(exc)
    return getattr(frame, "line", None) or getattr(frame, "code", None) if frame else None


def _raising_frame(exc: BaseException):
    metadata = getattr(exc, "ag_error_metadata", None)
    # Autograph lists the innermost converted call first (each layer's cause before its caller's line).
    translated = _job_frame(reversed(getattr(metadata, "translated_stack", None) or ()))
    return translated or _job_frame(traceback.extract_tb(exc.__traceback__))


def _library_dirs() -> tuple:
    """The directories of tpulaunch and of the libraries it runs the job's code with (TensorFlow, Keras, absl, ...)."""
    from tpulaunch.job.flags import LIBRARY_PACKAGES

    dirs = [path for name in (*LIBRARY_PACKAGES, "numpy", "google", "six")
            for path in (getattr(sys.modules.get(name), "__path__", None) or ())
            if isinstance(path, str)]  # a package whose import failed halfway (tf.keras without tf-keras) has None
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs)


def job_frame(frames: Sequence) -> Optional[str]:
    """'file:line, in function' of the innermost frame of the job's own code among `frames` (a traceback's, or an
    op's `traceback`, where TensorFlow recorded what made it), or None. The job's code is what is not tpulaunch's,
    a library's or the standard library's: a program installed as a package (tapas) is the job's too."""
    frame = _job_frame(frames)
    return f"{frame[0]}:{frame[1]}, in {frame[2]}" if frame else None


def _job_frame(frames: Sequence):
    libraries, stdlib = _library_dirs(), os.path.join(os.path.realpath(sysconfig.get_paths()["stdlib"]), "")
    for frame in reversed(list(frames)):
        filename, line, name = frame[0], frame[1], frame[2]
        if not filename or filename.startswith("<") or "__autograph_generated" in filename:
            continue
        path = os.path.realpath(filename)
        installed = any(f"{os.sep}{where}{os.sep}" in path for where in ("site-packages", "dist-packages"))
        if path.startswith(libraries) or (path.startswith(stdlib) and not installed):
            continue
        return frame
    return None


def _named_key(exc: BaseException) -> tuple:
    """The job key a portable.SpecError names (plain.spec_errors re-raises it, so it is the context)."""
    while exc is not None:
        if getattr(exc, "key", None):
            return tuple(exc.key)
        exc = exc.__context__
    return ()


def _key_in_trace(exc: BaseException, stage: tuple, calls: JobCodeCalls) -> tuple:
    if stage[:2] in (("data", "input_fn"), ("model", "model_fn"), ("data", "features")):
        return stage
    return calls.key_in(traceback.extract_tb(exc.__traceback__)) or stage
