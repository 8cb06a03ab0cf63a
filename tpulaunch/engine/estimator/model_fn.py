"""The job's TPUEstimator `model_fn`: `standalone.make_model_fn` around the job's Keras builder.

The same function trains on a TPU slice (`use_tpu=True`) and on a CPU or GPU (`use_tpu=False`). The
model_fn itself (loss, metrics, optimizer wrapping, precision, host_call) is in standalone.py, which
`tpulaunch explain` prints verbatim; this module resolves the job's import paths, checks the builder
and optimizer before training starts, and turns their failures into messages naming the job key.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from tpulaunch.engine import portable
from tpulaunch.engine.estimator import standalone
from tpulaunch.engine.estimator.builder_rules import accept_model
from tpulaunch.engine.estimator.locate import build_errors, located, located_metric_fn
from tpulaunch.engine.estimator.plain import model_settings
from tpulaunch.engine.plain import optimizer_settings
from tpulaunch.job.flags import apply_flags
from tpulaunch.engine.job_code import apply_precision, job_builder, job_functions, refuse_keras_metric_objects
from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.imports import make_call, resolve
from tpulaunch.job.schema import CLASSIFICATION_LOSSES, CLASSIFICATION_METRICS, OPTIMIZERS, REGRESSION_METRICS, Job

ModelFn = Callable[..., Any]

# standalone.py keeps its own copy of these facts (it imports nothing of tpulaunch); the static checks read the schema's.
assert set(standalone.V1_OPTIMIZERS) == set(OPTIMIZERS)
assert set(portable._CROSSENTROPY) == set(CLASSIFICATION_LOSSES)
assert portable.CLASSIFICATION_METRICS == CLASSIFICATION_METRICS
assert portable.REGRESSION_METRICS == REGRESSION_METRICS


# ------------------------------------------------------------------------------------------ optimizer

def make_optimizer_factory(job: Job, *, search_path: Sequence[str] = ()) -> Callable[[], Any]:
    """A function returning a fresh v1 optimizer for the job (one per graph).

    The optimizer is built once here so that a wrong name or argument fails before training starts.

    Raises:
        TpuLaunchError: unknown name, bad arguments, or an import path that does not return a
            `tf.compat.v1.train.Optimizer` (Keras optimizers silently do not train in this graph).
    """
    spec = job.model.optimizer
    make = None
    if ":" in spec.name:
        make = resolve(spec.name, search_path=search_path, what="optimizer")
    elif spec.name not in standalone.V1_OPTIMIZERS:
        raise TpuLaunchError(f"unknown optimizer {spec.name!r}",
                             hint=f"one of {', '.join(OPTIMIZERS)}, or an import path 'pkg.mod:make' returning a "
                                  "tf.compat.v1.train.Optimizer")
    make_optimizer = standalone.optimizer_factory(make=make, **optimizer_settings(job))

    def factory():
        try:
            optimizer = make_optimizer()
        except TypeError as exc:
            raise TpuLaunchError(f"optimizer {spec.name!r} rejected its arguments: {exc}",
                                 hint="check model.optimizer.args against the optimizer's constructor") from None
        if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
            raise TpuLaunchError(
                f"optimizer {spec.name!r} returned {type(optimizer).__name__}, not a tf.compat.v1.train.Optimizer",
                hint="TPUEstimator needs a v1 optimizer (tf.compat.v1.train.AdamOptimizer, ...); a Keras optimizer "
                     "does not update the weights in this graph")
        return optimizer

    factory()
    return factory


# ------------------------------------------------------------------------------------------- model_fn

def make_model_fn(job: Job, *, use_tpu: bool, search_path: Sequence[str] = ()) -> ModelFn:
    """The TPUEstimator model_fn for `job`: `model_fn(features, labels, mode, params, config=None)`.

    Args:
        job: the validated job.
        use_tpu: build for a TPU (CrossShardOptimizer) or for CPU/GPU.
        search_path: directories tried before PYTHONPATH for the job's import paths (the job
            file's directory, so model code next to the YAML file imports as is).

    Returns:
        The model_fn. With `model.model_fn` set it is the user's own, unchanged (TPUEstimator hands it
        `model.params`, see params.py). Either way the job's `flags:` are set first.

    Raises:
        TpuLaunchError: an import path that cannot be resolved, an unknown optimizer or loss, a flag
            that the job's modules do not define or that does not take its value.
    """
    spec = job.model
    apply_flags(job, search_path=search_path)
    if spec.model_fn:
        if isinstance(spec.model_fn, str):
            own = resolve(spec.model_fn, search_path=search_path, what="model_fn")
        else:
            own = make_call(spec.model_fn, search_path=search_path, what="the model_fn")
        return located(own, job, "train", ("model", "model_fn"))
    checked_builder, kwargs = job_builder(job, search_path=search_path, accept=accept_model)
    whole_loss, custom_losses, custom_metrics = job_functions(job, search_path=search_path)
    # TensorFlow 1's metrics are (value, update_op): a job's own metric is called as a function, a Keras Metric
    # (which keeps state across batches) is not one
    refuse_keras_metric_objects(job, custom_metrics, "estimator")
    make_optimizer = make_optimizer_factory(job, search_path=search_path)
    model_fn = standalone.make_model_fn(
        checked_builder, kwargs, use_tpu=use_tpu,
        policy=apply_precision(spec.precision, use_tpu=use_tpu), make_optimizer=make_optimizer,
        custom_loss=whole_loss, custom_losses=custom_losses, custom_metrics=custom_metrics, **model_settings(job))

    def job_model_fn(features, labels, mode, params, config=None):
        with build_errors(job, mode):  # located at its job key, as validate reports it
            estimator_spec = model_fn(features, labels, mode, params, config)
        if estimator_spec.eval_metrics is not None:
            metric_fn, tensors = estimator_spec.eval_metrics
            estimator_spec = estimator_spec._replace(eval_metrics=(located_metric_fn(job, metric_fn), tensors))
        return estimator_spec

    return job_model_fn
