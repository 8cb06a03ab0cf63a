"""The model layer of `validate`: the graphs `train` builds, built by `train`'s own code and stopped before a step.

For each mode the job runs (train, eval), `stopped_run.build_stopped` makes the TPUEstimator `train --local`
makes and calls its own `train`/`evaluate` with the job's input_fn, stopping once the session exists,
before the first step: nothing is read and nothing trains, so a 256^3 volume costs what a small one
does. What fails there is what `train` would refuse, reported at the job key its code comes from
(`model.builder`, `model.loss`, `model.metrics`, `model.optimizer`, `data.features`, `model.model_fn`,
`data.input_fn`) with TensorFlow's (or the job's code's) message; `train` raises the same BuildErrors,
since the wrappers that locate them (`build_errors`, `located`) are in the code both run.

Also here: what one training step keeps for its backward pass (`step_tensors`, the memory plan's input),
read from the same stopped build.
"""

from __future__ import annotations

import contextlib
import traceback
from dataclasses import dataclass
from typing import Optional

from tpulaunch.errors import TpuLaunchError, first_line
from tpulaunch.job.yamlfile import dotted

STANDALONE = "standalone.py"

# Which job key a failure inside standalone.py's model_fn belongs to, by the function it failed in.
_KEY_OF_FUNCTION = {
    "compute_loss": ("model", "loss"), "_single_loss": ("model", "loss"), "_label_loss": ("model", "loss"),
    "head_for": ("model", "loss"), "metrics_by_label": ("model", "metrics"),
    "metric_fn": ("model", "metrics"), "_one_metric": ("model", "metrics"), "_classes": ("model", "metrics"),
    "_values_like_labels": ("model", "metrics"),
    "factory": ("model", "optimizer"), "optimizer_factory": ("model", "optimizer"),
    "_keras_metric": ("model", "metrics"), "_update_metric": ("model", "metrics"),
    "_metric_objects": ("model", "metrics"), "keras_optimizer_factory": ("model", "optimizer"),
}
# ... and, in the functions that call the job's code (the estimator's model_fn, the keras engine's
# KerasTraining), by the line it failed on.
_KEY_OF_LINE = (("builder(", ("model", "builder")), ("model(features", ("data", "features")),
                ("model.build(", ("data", "features")), ("minimize(", ("model", "optimizer")),
                ("make_optimizer(", ("model", "optimizer")), ("apply_gradients(", ("model", "optimizer")),
                ("optimizer.build(", ("model", "optimizer")))
_CALLERS_OF_JOB_CODE = ("model_fn", "__init__", "_forward", "_replica_train_step")


class BuildError(TpuLaunchError):
    """The job's model_fn failed to build a graph (at `train` as at `validate`): `key` is the job key the
    failing code comes from, `detail` the message (TensorFlow's, the job's code's or tpulaunch's)."""

    def __init__(self, key: tuple, mode: str, detail: str, hint: Optional[str], code: Optional[str] = None):
        super().__init__(f"{dotted(key)}: building the {mode} graph: {detail}", hint=hint, code=code)
        self.key = key
        self.detail = detail


@contextlib.contextmanager
def build_errors(job, mode: str, stage: tuple = ("model", "builder")):
    """Any failure of the model_fn tpulaunch makes around the job's builder (or of its metric_fn: `stage`
    ("model", "metrics")) as a BuildError at the job key its code comes from."""
    try:
        yield
    except BuildError:
        raise
    except Exception as exc:  # noqa: BLE001 (the user's code, Keras or TensorFlow: located, never "unexpected")
        key, detail, hint = _blame(exc, stage, job)
        code = exc.code if isinstance(exc, TpuLaunchError) else None
        raise BuildError(key, {"infer": "predict"}.get(mode, mode), detail, hint, code) from exc


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


@dataclass
class ModeBuild:
    mode: str
    ok: bool
    key: Optional[tuple] = None  # the job key a failure is reported at
    message: Optional[str] = None
    hint: Optional[str] = None
    code: Optional[str] = None  # a problem code of its own (e.g. builder-download-failed)


def build_problems(loaded, plan) -> list:
    """The failed builds as problems: one per job key and message, naming the graphs that failed."""
    del plan  # validate builds what `train --local` builds (the TPU's graphs: validate --tf, verdict.py)
    return problems_of(loaded, build_modes(loaded.job), "graph")


def problems_of(loaded, builds, built: str) -> list:
    """`builds` (ModeBuild per mode) as problems, one per job key and message: 'building the train and eval {built}'."""
    failed: dict = {}
    for build in builds:
        if not build.ok:
            failed.setdefault((build.key, build.message, build.hint, build.code), []).append(build.mode)
    return [loaded.problem(key, code or "model-build-failed", f"building the {' and '.join(modes)} {built}: {message}",
                           hint)
            for (key, message, hint, code), modes in failed.items()]


def build_modes(job, modes=("train", "eval")) -> list:
    """One `ModeBuild` per mode the job runs: `train`'s and `evaluate`'s own calls, stopped before the first step."""
    return [_build(job, mode) for mode in modes if _runs(job, mode)]


def _runs(job, mode: str) -> bool:
    """Whether the job runs `mode` (as the runner decides: a section, and data or the job's own input_fn)."""
    return (getattr(job, mode, None) is not None
            and (getattr(job.data, mode) is not None or bool(job.data.input_fn)))


def _build(job, mode: str) -> ModeBuild:
    from tpulaunch.engine.estimator.stopped_run import build_stopped

    try:
        build_stopped(job, mode)
        return ModeBuild(mode, True)
    except BuildError as exc:
        return ModeBuild(mode, False, exc.key, exc.detail, exc.hint, exc.code)


def located_error(job, mode: str, exc: BaseException) -> BuildError:
    """`exc`, raised while building `mode`, as a BuildError at the job key its code comes from."""
    if isinstance(exc, BuildError):
        return exc
    key, message, hint = _blame(exc, _stage(job, mode, exc), job)
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


def _unstaged(exc: BaseException) -> BaseException:
    """The error the job's code (or ours) raised, under the StagingError tf.function's autograph wraps it in
    (the keras engine traces its steps; an error class autograph cannot rebuild comes out as StagingError)."""
    seen = 0
    while type(exc).__name__ == "StagingError" and seen < 10:
        inner = exc.__cause__ or exc.__context__
        if inner is None:
            break
        exc, seen = inner, seen + 1
    return exc


def _blame(exc: BaseException, stage: tuple, job) -> tuple:
    """(job key, message, hint) for a failure while building: the key of the code it failed in."""
    from tpulaunch.engine.portable import SpecError

    exc = _unstaged(exc)
    if isinstance(exc, BuildError):
        return exc.key, exc.detail, exc.hint
    if isinstance(exc, TpuLaunchError):
        return _named_key(exc) or _key_in_trace(exc, stage, job), exc.message, exc.hint
    if isinstance(exc, SpecError):
        return exc.key or _key_in_trace(exc, stage, job), str(exc), exc.hint or None
    message = f"{type(exc).__name__}: {first_line(exc)}"
    if any(frame.name == "add_loss" for frame in traceback.extract_tb(exc.__traceback__)):
        return ("model", "builder"), message, (
            "the model calls add_loss() where Keras refuses it: a subclassed model is built with Model.build(), "
            "which runs call() outside Keras's call context; build the model functionally (from tf.keras.Input), "
            "or compute that loss in model.loss ('pkg.mod:fn(labels, outputs)')")
    key = _key_in_trace(exc, stage, job)
    hints = {("model", "loss"): "the loss must take the labels as declared and the model's outputs",
             ("model", "metrics"): "each metric must fit the labels and outputs (classification metrics need a "
                                   "classification loss)",
             ("model", "optimizer"): "check model.optimizer and its args",
             ("data", "features"): "the model must accept the declared features: one tensor, or a dict by name",
             ("model", "builder"): "check model.params against the builder, and the builder itself "
                                   "(`tpulaunch --debug train --local` shows the traceback)",
             ("model", "model_fn"): "the error is in the job's model_fn (`tpulaunch --debug train --local` shows the traceback)",
             ("data", "input_fn"): "the error is in the job's input_fn (`tpulaunch --debug train --local` shows the traceback)"}
    return key, message, hints.get(key)


def _named_key(exc: BaseException) -> tuple:
    """The job key a portable.SpecError names (plain.spec_errors re-raises it, so it is the context)."""
    while exc is not None:
        if getattr(exc, "key", None):
            return tuple(exc.key)
        exc = exc.__context__
    return ()


def _key_in_trace(exc: BaseException, stage: tuple, job) -> tuple:
    if stage in (("data", "input_fn"), ("model", "model_fn"), ("data", "features")):
        return stage
    frames = traceback.extract_tb(exc.__traceback__)
    inside = [f for f in frames if f.filename.endswith(STANDALONE)]
    for frame in reversed(inside):
        if frame.name in _KEY_OF_FUNCTION:
            return _KEY_OF_FUNCTION[frame.name]
        if frame.name in _CALLERS_OF_JOB_CODE:
            for text, key in _KEY_OF_LINE:
                if text in (frame.line or ""):
                    return key
    whole_loss = isinstance(job.model.loss, str) and ":" in job.model.loss
    if stage == ("model", "builder") and whole_loss and any(f.name == "_single_loss" for f in inside):
        return ("model", "loss")
    return stage


# ---------------------------------------------------------------------- what one training step keeps

# What the backward pass keeps is what its non-elementwise ops read from the forward pass: XLA fuses
# elementwise chains (a loss's sigmoid, exp and products; casts) forward and backward and recomputes
# them from their inputs, so their intermediates are never held for the step. Calibrated against the
# published Cloud TPU runs (DESIGN.md "Memory model"): convolution, matmul and batch-norm inputs are
# required; ReLU outputs and pooling inputs/outputs are kept but could be rematerialised (the lower bound).
_REQUIRED_READERS = {"Conv2DBackpropFilter", "Conv2DBackpropInput", "Conv3DBackpropFilter", "Conv3DBackpropFilterV2",
                     "Conv3DBackpropInputV2", "DepthwiseConv2dNativeBackpropFilter",
                     "DepthwiseConv2dNativeBackpropInput", "Conv2D", "Conv3D", "MatMul", "BatchMatMul",
                     "BatchMatMulV2", "BatchMatMulV3", "Einsum", "FusedBatchNormGrad", "FusedBatchNormGradV2",
                     "FusedBatchNormGradV3"}
_REMATERIALISABLE = {"ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "LeakyReluGrad", "MaxPoolGrad", "MaxPoolGradV2",
                     "MaxPool3DGrad", "AvgPoolGrad", "AvgPool3DGrad"}
# A dtype conversion or identity is fused by XLA into whatever reads it: the tensor kept is its source.
_PASS_THROUGH = {"Cast", "Identity"}
_WEIGHT_SOURCES = {"ReadVariableOp", "VarHandleOp", "VariableV2", "Const", "Placeholder", "PlaceholderWithDefault"}
_CONVOLUTIONS = {"Conv2D", "Conv3D", "DepthwiseConv2dNative", "Conv2DBackpropInput", "Conv3DBackpropInputV2"}
# Built with this static batch: a tensor whose first dim is it holds examples (weights and constants are excluded by
# where they come from, so a [2, n] kernel is not mistaken for one).
PROBE_BATCH = 2


@dataclass(frozen=True)
class KeptTensor:
    """One tensor the backward pass of a training step reads, per example (no batch dim)."""

    shape: tuple
    bytes_per_element: int
    required: bool  # read by a gradient op that cannot recompute it cheaply
    halo: tuple = ()  # per spatial axis: the rows a convolution reads beyond its tile, when spatially partitioned


@dataclass(frozen=True)
class StepTensors:
    """What the memory estimate needs from one built training step."""

    input_shape: tuple  # per example: the main feature's shape the graph was built for
    params: int
    trainable_params: int
    kept: tuple  # KeptTensor, per example


def step_tensors(job, *, use_tpu: bool) -> StepTensors:
    """Build the job's training step as `train --local` builds it (build_stopped: its real model_fn, TRAIN mode,
    loss, optimizer, input pipeline) for a global batch of PROBE_BATCH examples, and list what its gradient
    computation reads from the forward pass. `use_tpu` does not change what is kept: the TPU's CrossShardOptimizer
    sums gradients across replicas after they are computed, and bfloat16 is 2 bytes wherever it runs.

    Raises:
        TpuLaunchError, or whatever the job's code raises while building (the caller reports it).
    """
    import tensorflow as tf

    from tpulaunch.engine.estimator.stopped_run import build_stopped
    from tpulaunch.plan.auto import main_feature

    del use_tpu
    found = {}

    def measure(graph):
        variables = [v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
                     if "global_step" not in v.name]
        trainable = graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
        found.update(kept=_kept_by_backward(graph), params=_model_params(trainable, variables),
                     trainable=sum(_elements(v) for v in trainable))

    probe = job.model_copy(update={"train": job.train.model_copy(update={"batch_size": PROBE_BATCH})})
    with build_errors(job, "train"):
        build_stopped(probe, "train", on_graph=measure)
    shape = tuple(job.data.features[main_feature(job.data.features)].shape)
    return StepTensors(shape, found["params"], found["trainable"], tuple(found["kept"]))


def _elements(variable) -> int:
    return int(variable.shape.num_elements() or 0)


def _model_params(trainable, variables) -> int:
    """The model's own weights: the trainable ones, and non-trainable ones beside them (batch-norm statistics).

    Optimizer slots are named after their variable ('.../kernel/Adam') and the optimizer's own state
    ('beta1_power') sits outside the model's scopes: neither is a weight.
    """
    names = {v.op.name for v in trainable}
    scopes = {n.split("/")[0] for n in names if "/" in n}
    model = list(trainable)
    for v in variables:
        name = v.op.name
        if name in names or any(name.startswith(n + "/") for n in names):
            continue
        if "/" in name and name.split("/")[0] in scopes:
            model.append(v)
    return sum(_elements(v) for v in model)


def _is_gradient(name: str) -> bool:
    # tf.gradients names its ops gradients/... (the estimator's graph); tf.GradientTape gradient_tape/... (keras)
    return name.startswith("gradients") or name.startswith("gradient_tape")


def _kept_by_backward(graph) -> list:
    found: dict = {}
    for op in graph.get_operations():
        if not _is_gradient(op.name) or op.type not in _REQUIRED_READERS | _REMATERIALISABLE:
            continue
        for tensor in op.inputs:
            tensor = _source(tensor)
            if (_is_gradient(tensor.op.name) or not tensor.dtype.is_floating
                    or tensor.op.type in _WEIGHT_SOURCES or tensor.shape.rank in (None, 0)
                    or tensor.shape[0] != PROBE_BATCH or not tensor.shape.is_fully_defined()):
                continue
            entry = found.setdefault(tensor.name, {"tensor": tensor, "required": False})
            entry["required"] |= op.type in _REQUIRED_READERS
    out = []
    for entry in found.values():
        tensor = entry["tensor"]
        out.append(KeptTensor(tuple(int(d) for d in tensor.shape[1:]), tensor.dtype.size, entry["required"],
                              _halo(tensor)))
    return out


def _source(tensor):
    while tensor.op.type in _PASS_THROUGH and tensor.op.inputs:
        tensor = tensor.op.inputs[0]
    return tensor


def _halo(tensor) -> tuple:
    """The widest halo of the convolutions that read `tensor`: (kernel - 1) * dilation per spatial axis."""
    best: tuple = ()
    for consumer in _consumers_through_casts(tensor):
        if consumer.type not in _CONVOLUTIONS or _is_gradient(consumer.name):
            continue
        kernel = consumer.inputs[1].shape.as_list()[:-2]  # the filter: spatial dims, then in/out channels
        dilations = list(consumer.get_attr("dilations"))[1:-1] if "dilations" in consumer.node_def.attr else []
        dilations = dilations or [1] * len(kernel)
        halo = tuple(max(0, (k - 1) * d) for k, d in zip(kernel, dilations) if k is not None)
        best = tuple(max(a, b) for a, b in zip(best, halo)) if best else halo
    return best


def _consumers_through_casts(tensor) -> list:
    out = []
    for consumer in tensor.consumers():
        if consumer.type in _PASS_THROUGH:
            out += _consumers_through_casts(consumer.outputs[0])
        else:
            out.append(consumer)
    return out
