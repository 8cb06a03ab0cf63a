"""Failures of the job's own code, and of TensorFlow's code between the job's functions, located at the job key
the code comes from (a BuildError): the wrappers `train` runs and `validate`'s stopped build runs alike."""

from __future__ import annotations

import functools
import os

from tpulaunch.engine.core import build_failures
from tpulaunch.engine.core.build_failures import BuildError, JobCodeCalls
from tpulaunch.engine.estimator.params import mode_params
from tpulaunch.errors import TpuLaunchError, resource_limit_error

MODEL_FN = ("model", "model_fn")
_LOSS, _METRICS, _OPTIMIZER = ("model", "loss"), ("model", "metrics"), ("model", "optimizer")

# Where standalone.py calls the job's code: a failure in one of these functions, or on one of these lines of its
# model_fn, belongs to that job key.
CALLS = JobCodeCalls(
    file=os.path.join(os.path.dirname(__file__), "standalone.py"),
    by_function={"optimizer_factory": _OPTIMIZER, "factory": _OPTIMIZER, "_one_metric": _METRICS,
                 "metric_fn": _METRICS},
    callers=("model_fn",),
    by_line=(("builder(", ("model", "builder")), ("model(features", ("data", "features")),
             ("minimize(", _OPTIMIZER), ("make_optimizer(", _OPTIMIZER)),
)
build_errors = functools.partial(build_failures.build_errors, calls=CALLS)


def input_fn_key(data, mode: str) -> tuple:
    """The job key of the input_fn for `mode`: data.input_fn when one function serves every mode, else the mode's
    own entry (data.input_fn.eval), so that what fails building the eval graph is located at the eval entry."""
    from tpulaunch.job.schema import InputFns

    return ("data", "input_fn", mode) if isinstance(data.input_fn, InputFns) else ("data", "input_fn")


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
    from tensorflow.python.util import tf_decorator

    if isinstance(function, functools.partial):  # TensorFlow reads a partial's remaining arguments itself
        return functools.partial(located(function.func, job, mode, key), *function.args, **function.keywords)

    takes_params = key == MODEL_FN or key[:2] == ("data", "input_fn")

    def job_function(*args, **kwargs):
        # TPUEstimator passes everything by keyword; a model_fn's (features, labels, mode, params) by position too.
        positional_mode = key == MODEL_FN and len(args) > 2
        called_in = args[2] if positional_mode else kwargs.get("mode", mode)
        if takes_params and mode_params(job, called_in):  # eval.params over model.params: the graphs that do not train
            if "params" in kwargs:
                kwargs["params"] = {**kwargs["params"], **mode_params(job, called_in)}
            elif key == MODEL_FN and len(args) > 3:
                args = (*args[:3], {**args[3], **mode_params(job, called_in)}, *args[4:])
        try:
            with build_errors(job, called_in, key):
                result = function(*args, **kwargs)
        except BuildError as exc:
            if not (takes_params and mode_params(job, called_in)):
                raise
            over = ", ".join(sorted(mode_params(job, called_in)))
            raise BuildError(exc.key, {"infer": "predict"}.get(str(called_in), str(called_in)), exc.detail,
                             f"{exc.hint}; in this graph params has eval.params ({over}) over model.params",
                             exc.code) from exc.__cause__
        eval_metrics = getattr(result, "eval_metrics", None)  # a TPUEstimatorSpec's metric_fn runs later
        if eval_metrics is not None and key == MODEL_FN:
            metric_fn, tensors = eval_metrics
            result = result._replace(eval_metrics=(located(metric_fn, job, "eval", key), tensors))
        return result

    return tf_decorator.make_decorator(function, job_function)


def located_error(job, mode: str, exc: BaseException) -> TpuLaunchError:
    """`exc`, raised while building `mode`, as a BuildError at the job key its code comes from (or, when the
    machine's limit on memory or open files failed it, as that: `errors.resource_limit_error`)."""
    if isinstance(exc, BuildError):
        return exc
    limited = resource_limit_error(exc)
    if limited is not None:
        return limited
    key, message, hint = build_failures.blame(exc, _stage(job, mode, exc), job, CALLS)
    code = exc.code if isinstance(exc, TpuLaunchError) else None
    return BuildError(key, {"infer": "predict"}.get(mode, mode), message, hint, code)


def _stage(job, mode: str, exc: BaseException) -> tuple:
    """The job key of a failure raised by TensorFlow's own code between the job's functions (its checks of
    what a model_fn returned, of the eval metrics): the code that gave TensorFlow what it refused."""
    if job.data.input_fn and "input_fn" in str(exc):
        return input_fn_key(job.data, mode)
    if job.model.model_fn:
        return ("model", "model_fn")
    if mode == "eval" and "metric" in str(exc):
        return ("model", "metrics")
    return ("model", "builder")
