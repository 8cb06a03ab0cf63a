"""The job's own code, resolved for either engine: its Keras builder (checked as it builds), its loss and
metric functions, and the Keras precision policy.

Failures become messages naming the job key: a builder that rejects model.params, one that cannot
download its weights, one that returns something other than a Keras model, and one its engine does not
train (the engine's own rule, passed in: the estimator engine's refuses Keras 3 models and models that would
train otherwise than their author wrote, `engine/estimator/builder_rules.py`). A Keras Metric (class or object) given
by import path is refused at its job key on the estimator engine and fed each batch on the keras engine; a
Keras Loss given as a metric is refused on both; a Keras Loss as model.loss trains (portable.compute_loss).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple

from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.builder_args import builder_kwargs
from tpulaunch.job.imports import job_import_path, resolve
from tpulaunch.job.schema import Job

_policy_in_effect = None


@contextlib.contextmanager
def running_job_code(job: Job) -> Iterator[None]:
    """While the job's code runs (every verb's build, train, evaluation and export): the job file's directory,
    then python_path, lead the import path (a model_fn that imports a module beside it when it is called finds
    it), and the job file's directory is the working directory, so a relative path the job hands its own code
    (in model.params, eval.params, a call's args) is relative to the job file, as every other path in it is,
    wherever tpulaunch runs from. Both are restored after."""
    job_dir = getattr(job, "_source_dir", None)  # None: a Job made in code, not loaded from a file
    before = os.getcwd()
    with job_import_path(job.search_path):
        if job_dir:
            os.chdir(job_dir)
        try:
            yield
        finally:
            os.chdir(before)


def command_line_path(path: Optional[str]) -> Optional[str]:
    """A path from the command line (export's directory, --checkpoint), absolute before the job's code runs from the
    job file's directory (`running_job_code`): it stays relative to where tpulaunch was started."""
    return path if path is None or "://" in path else os.path.abspath(path)


def as_given(path: str, given: str) -> str:
    """`path`, written under `command_line_path(given)`, said under `given` again, as the user wrote it."""
    absolute = command_line_path(given)
    return path if absolute == given else os.path.join(given, os.path.relpath(path, absolute))


def export_from_command_line(export: Callable[..., str], job: Job, plan, out_dir: str, checkpoint: Optional[str],
                             say: Optional[Callable[[str], None]] = None) -> str:
    """An engine runner's `export(job, plan, out_dir, checkpoint=, search_path=, say=)` with the job's code running
    (`running_job_code`) and the command line's paths kept relative to where tpulaunch started; the SavedModel's
    directory as the user wrote `out_dir`. `say`: told which checkpoint is exported when a newer one was skipped."""
    given, out_dir, checkpoint = out_dir, command_line_path(out_dir), command_line_path(checkpoint)
    with running_job_code(job):
        path = export(job, plan, out_dir, checkpoint=checkpoint, search_path=job.search_path,
                      say=say or (lambda line: None))
    return as_given(path, given)


def apply_precision(precision: str, *, use_tpu: bool) -> str:
    """Set the process-wide Keras policy for this job (only when it changes) in every Keras imported (the
    builder's module has imported its own by now) and return its name."""
    from tpulaunch.engine import portable

    global _policy_in_effect
    name = portable.policy_name(precision, use_tpu=use_tpu)
    kerases = tuple(id(keras) for keras in portable.imported_kerases())
    if (name, kerases) != _policy_in_effect:
        portable.set_precision_policy(name)
        _policy_in_effect = (name, kerases)
    return name


def job_builder(job: Job, *, search_path: Sequence[str] = (),
                accept: Callable[[str, Any], None] = lambda builder, model: None) -> Tuple[Callable, dict]:
    """(the job's builder, wrapped so its failures name model.builder / model.params, its keyword arguments).

    The builder must return a Keras model (tf.keras or Keras 3); `accept(builder, model)` is the engine's own rule
    of which it trains (raising a TpuLaunchError for one it does not: the estimator engine's
    `builder_rules.accept_model`)."""
    from tpulaunch.engine.portable import SpecError, keras_of
    from tpulaunch.engine.weights import download_error, download_failure

    spec = job.model
    builder = resolve(spec.builder, search_path=search_path, what="model builder")
    kwargs = builder_kwargs(builder, spec.params, job.data.features)

    def checked_builder(**kwargs):
        try:
            model = builder(**kwargs)
        except TypeError as exc:
            raise TpuLaunchError(f"model builder {spec.builder!r} rejected its arguments: {exc}",
                                 hint="check model.params against the builder's signature") from None
        except Exception as exc:  # pylint: disable=broad-except  # a failed download, or a param it refused
            failure = download_failure(exc)
            if failure is None:
                refused = _param_named(exc, spec.params)
                if refused is None:
                    raise
                raise SpecError(f"model builder {spec.builder!r} refused {refused}: {str(exc).strip()}",
                                hint="give the builder a value it takes", key=("model", "params", refused)) from exc
            message, hint = download_error(spec.builder, failure)
            raise TpuLaunchError(message, hint=hint, code="builder-download-failed") from exc
        keras = keras_of(model)
        if keras is None or not isinstance(model, keras.Model):
            raise TpuLaunchError(f"model builder {spec.builder!r} returned {type(model).__name__}, not a Keras model "
                                 "(tf.keras or Keras 3)",
                                 hint="return the model itself (a Keras model), not its outputs or a wrapper")
        accept(spec.builder, model)
        _refuse_empty_outputs(spec, model)
        return model

    return checked_builder, kwargs


def _param_named(exc: BaseException, params: dict) -> Optional[str]:
    """The one model.params key a builder's ValueError names ("num_classes must be at least 1"), or None."""
    if not isinstance(exc, ValueError):
        return None
    import re

    named = [name for name in params if re.search(rf"\b{re.escape(name)}\b", str(exc))]
    return named[0] if len(named) == 1 else None


def _refuse_empty_outputs(spec, model) -> None:
    """A model with an output of no elements (Dense(0) from num_classes: 0) cannot train: TensorFlow's CPU kernels
    abort the process on it, and a loss over nothing is no loss. Said at the model.params key set to 0, if one is."""
    from tpulaunch.engine.portable import SpecError

    for output in getattr(model, "outputs", None) or ():
        shape = [getattr(d, "value", d) for d in tuple(getattr(output, "shape", ()))[1:]]
        if 0 not in shape:
            continue
        zeros = [name for name, value in spec.params.items() if value == 0 and not isinstance(value, bool)]
        key = ("model", "params", zeros[0]) if len(zeros) == 1 else ("model", "builder")
        raise SpecError(f"model builder {spec.builder!r} built a model whose output {getattr(output, 'name', '')!r} "
                        f"has shape {[None, *shape]}: an axis of size 0 holds nothing to train",
                        hint="give the builder values that make every output axis at least 1 (e.g. num_classes >= 1)",
                        key=key)


def job_functions(job: Job, *, search_path: Sequence[str] = ()
                  ) -> Tuple[Optional[Callable], Dict[str, Callable], Dict[str, Callable]]:
    """(the loss function for all labels when model.loss is one import path, import-path losses by path,
    import-path metrics by path); a Keras Loss as a metric and a Keras Metric as a loss are refused at their job
    key. An engine that calls a job's own metric as a function refuses a Keras Metric itself
    (`refuse_keras_metric_objects`)."""
    spec = job.model
    functions = {}
    for key, path in spec.function_paths():
        function = resolve(path, search_path=search_path, what="loss" if key[1] == "loss" else "metric")
        _refuse_keras_objects(key, path, function)
        functions[(key[1], path)] = function
    custom_losses = {path: fn for (kind, path), fn in functions.items() if kind == "loss"}
    custom_metrics = {path: fn for (kind, path), fn in functions.items() if kind == "metrics"}
    whole_loss = custom_losses.get(spec.loss) if isinstance(spec.loss, str) else None  # gets all labels and outputs
    return whole_loss, custom_losses, custom_metrics


# --------------------------------------------------------------------------- losses and metrics by path

_KERAS_BASES = (("metrics", "Metric"), ("losses", "Loss"))


def _keras_kind(function) -> Optional[str]:
    """'tf.keras.metrics.Metric class', 'keras.losses.Loss object' (Keras 3), ... for a Keras metric or loss; else
    None."""
    from tpulaunch.engine.portable import keras_base

    for module, name in _KERAS_BASES:
        kind = keras_base(function, module, name)
        if kind is not None:
            return kind
    return None


def _refuse_keras_objects(key: tuple, path: str, function) -> None:
    """A Keras Metric as a loss and a Keras Loss as a metric, refused at its key before anything is built. A Loss as
    model.loss trains (portable.compute_loss)."""
    from tpulaunch.engine.core.build_failures import BuildError

    kind = _keras_kind(function)
    if kind is None or (key[1] == "loss" and ".losses." in kind) or (key[1] == "metrics" and ".metrics." in kind):
        return
    found = f"{path!r} is a {kind}"
    if key[1] == "loss":
        raise BuildError(key, "train", f"{found}, not a loss",
                         hint="give model.loss a Keras loss name, a tf.keras.losses.Loss (class or object) or a "
                              "function fn(labels, outputs) by its import path")
    raise BuildError(key, "train", f"{found}, and a Keras Loss is no metric", hint=METRIC_HINT)


METRIC_HINT = ("use a built-in metric name (accuracy, auc, precision, recall, mean_iou, mean_squared_error, ...), or "
               "a function fn(labels, outputs) by its import path: the batch's value on the keras engine (which also "
               "takes a Keras Metric), a tf.compat.v1.metrics (value, update_op) on the estimator engine")


def refuse_keras_metric_objects(job: Job, custom_metrics: Dict[str, Callable], engine: str) -> None:
    """For an engine that calls a job's own metric as a function on each batch: a Keras Metric among
    `custom_metrics` (from `job_functions`) refused at its key, naming `engine`."""
    from tpulaunch.engine.core.build_failures import BuildError

    for key, path in job.model.function_paths():
        kind = _keras_kind(custom_metrics[path]) if key[1] == "metrics" and path in custom_metrics else None
        if kind is not None:
            raise BuildError(key, "train", f"{path!r} is a {kind}: the {engine} engine calls a job's own metric as a "
                                           "function fn(labels, outputs) on each batch", hint=METRIC_HINT)
