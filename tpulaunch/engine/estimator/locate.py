"""Failures of the job's own code, and of TensorFlow's code between the job's functions, located at the job key
the code comes from (a BuildError): the wrappers `train` runs and `validate`'s stopped build runs alike."""

from __future__ import annotations

from tpulaunch.engine.core.build_failures import BuildError, blame, build_errors
from tpulaunch.errors import TpuLaunchError


def located_metric_fn(job, metric_fn):
    """`metric_fn` whose failures (TPUEstimator calls it while building the eval graph) are BuildErrors."""

    def job_metric_fn(**tensors):
        with build_errors(job, "eval", ("model", "metrics")):
            return metric_fn(**tensors)

    return job_metric_fn


def located(function, job, mode: str, key: tuple):
    """The job's own `function` (its model_fn, an input_fn) with its failures located at `key` (a BuildError),
    in train as in validate. TensorFlow reads the arguments it passes from the function's signature
    (`function_utils.fn_args`), so the wrapper is a TensorFlow decorator that shows the function's own."""
    import functools

    from tensorflow.python.util import tf_decorator

    if isinstance(function, functools.partial):  # TensorFlow reads a partial's remaining arguments itself
        return functools.partial(located(function.func, job, mode, key), *function.args, **function.keywords)

    def job_function(*args, **kwargs):
        with build_errors(job, kwargs.get("mode", mode), key):
            result = function(*args, **kwargs)
        eval_metrics = getattr(result, "eval_metrics", None)  # a TPUEstimatorSpec's metric_fn runs later
        if eval_metrics is not None and key == ("model", "model_fn"):
            metric_fn, tensors = eval_metrics
            result = result._replace(eval_metrics=(located(metric_fn, job, "eval", key), tensors))
        return result

    return tf_decorator.make_decorator(function, job_function)


def located_error(job, mode: str, exc: BaseException) -> BuildError:
    """`exc`, raised while building `mode`, as a BuildError at the job key its code comes from."""
    if isinstance(exc, BuildError):
        return exc
    key, message, hint = blame(exc, _stage(job, mode, exc), job)
    code = exc.code if isinstance(exc, TpuLaunchError) else None
    return BuildError(key, {"infer": "predict"}.get(mode, mode), message, hint, code)


def _stage(job, mode: str, exc: BaseException) -> tuple:
    """The job key of a failure raised by TensorFlow's own code between the job's functions (its checks of
    what a model_fn returned, of the eval metrics): the code that gave TensorFlow what it refused."""
    if job.data.input_fn and "input_fn" in str(exc):
        return ("data", "input_fn")
    if job.model.model_fn:
        return ("model", "model_fn")
    if mode == "eval" and "metric" in str(exc):
        return ("model", "metrics")
    return ("model", "builder")
