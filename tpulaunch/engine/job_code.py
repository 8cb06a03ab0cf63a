"""The job's own code, resolved for either engine: its Keras builder (checked as it builds), its loss and
metric functions, and the Keras precision policy.

Failures become messages naming the job key: a builder that rejects model.params, one that cannot
download its weights, one that returns something other than a tf.keras.Model.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Tuple

from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.builder_args import builder_kwargs
from tpulaunch.job.imports import resolve
from tpulaunch.job.schema import Job

_policy_in_effect = None


def apply_precision(precision: str, *, use_tpu: bool) -> str:
    """Set the process-wide Keras policy for this job (only when it changes) and return its name."""
    import tensorflow as tf

    from tpulaunch.engine import portable

    global _policy_in_effect
    name = portable.policy_name(precision, use_tpu=use_tpu)
    if name != _policy_in_effect:
        tf.keras.mixed_precision.set_global_policy(name)
        _policy_in_effect = name
    return name


def job_builder(job: Job, *, search_path: Sequence[str] = ()) -> Tuple[Callable, dict]:
    """(the job's builder, wrapped so its failures name model.builder / model.params, its keyword arguments)."""
    import tensorflow as tf

    from tpulaunch.engine.estimator.weights import download_error, download_failure

    spec = job.model
    builder = resolve(spec.builder, search_path=search_path, what="model builder")
    kwargs = builder_kwargs(builder, spec.params, job.data.features)

    def checked_builder(**kwargs):
        try:
            model = builder(**kwargs)
        except TypeError as exc:
            raise TpuLaunchError(f"model builder {spec.builder!r} rejected its arguments: {exc}",
                                 hint="check model.params against the builder's signature") from None
        except Exception as exc:  # pylint: disable=broad-except  # only a failed download is explained here
            failure = download_failure(exc)
            if failure is None:
                raise
            message, hint = download_error(spec.builder, failure)
            raise TpuLaunchError(message, hint=hint, code="builder-download-failed") from exc
        if not isinstance(model, tf.keras.Model):
            raise TpuLaunchError(f"model builder {spec.builder!r} returned {type(model).__name__}, not a tf.keras.Model")
        return model

    return checked_builder, kwargs


def job_functions(job: Job, *, search_path: Sequence[str] = ()) -> Tuple[Optional[Callable], Dict[str, Callable],
                                                                        Dict[str, Callable]]:
    """(the loss function for all labels when model.loss is one import path, import-path losses by path,
    import-path metrics by path)."""
    spec = job.model
    functions = {(key[1], path): resolve(path, search_path=search_path, what="loss" if key[1] == "loss" else "metric")
                 for key, path in spec.function_paths()}
    custom_losses = {path: fn for (kind, path), fn in functions.items() if kind == "loss"}
    custom_metrics = {path: fn for (kind, path), fn in functions.items() if kind == "metrics"}
    whole_loss = custom_losses.get(spec.loss) if isinstance(spec.loss, str) else None  # gets all labels and outputs
    return whole_loss, custom_losses, custom_metrics
