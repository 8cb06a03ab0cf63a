"""The model layer of `validate`: build the graphs `train` builds, on this machine, and stop before a session.

For each mode the job runs (train, eval), in a fresh graph: the features and labels the input_fn
yields (the job's own input_fn called and its dataset's element spec taken; tpulaunch's pipeline
parses a placeholder of serialized records with the same parse code), then the job's real model_fn
(made from the builder, or the user's own) with the params TPUEstimator would pass, the eval metrics
built from `eval_metrics` as TPUEstimator builds them. Nothing is read and no step runs, so a 256^3
volume costs what a small one does. What the model_fn refuses here, `train` would refuse: the error
is reported at the job key its code comes from, with TensorFlow's (or the user's) message.
"""

from __future__ import annotations

import contextlib
import traceback
from dataclasses import dataclass
from typing import Optional

from tpulaunch.errors import TpuLaunchError, first_line

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
        super().__init__(f"{'.'.join(map(str, key))}: building the {mode} graph: {detail}", hint=hint, code=code)
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
    return problems_of(loaded, build_modes(loaded.job, plan), "graph")


def problems_of(loaded, builds, built: str) -> list:
    """`builds` (ModeBuild per mode) as problems, one per job key and message: 'building the train and eval {built}'."""
    failed: dict = {}
    for build in builds:
        if not build.ok:
            failed.setdefault((build.key, build.message, build.hint, build.code), []).append(build.mode)
    return [loaded.problem(key, code or "model-build-failed", f"building the {' and '.join(modes)} {built}: {message}",
                           hint)
            for (key, message, hint, code), modes in failed.items()]


def build_modes(job, plan, modes=("train", "eval")) -> list:
    """One `ModeBuild` per mode the job runs, each from a fresh graph."""
    return [_build(job, plan, mode) for mode in modes if getattr(job, mode, None) is not None]


def _build(job, plan, mode: str) -> ModeBuild:
    import tensorflow as tf

    from tpulaunch.engine.estimator.model_fn import make_model_fn

    keys = {"train": tf.estimator.ModeKeys.TRAIN, "eval": tf.estimator.ModeKeys.EVAL}
    batch = plan.batch(mode)
    params = {"batch_size": batch.params_batch_size if plan.on_tpu else batch.global_batch, "use_tpu": False}
    params.update(_user_params(job))
    graph = tf.Graph()
    stage = ("data", "input_fn") if job.data.input_fn else ("data", "features")
    try:
        with graph.as_default():
            features, labels = _inputs(job, mode, params)
            stage = ("model", "model_fn") if job.model.model_fn else ("model", "builder")
            model_fn = make_model_fn(job, use_tpu=False, search_path=job.search_path)
            spec = _call_model_fn(model_fn, features, labels, keys[mode], params, _config(job))
            if mode == "eval" and getattr(spec, "eval_metrics", None):
                stage = ("model", "metrics")
                fn, tensors = spec.eval_metrics
                fn(**tensors) if isinstance(tensors, dict) else fn(*tensors)
            return ModeBuild(mode, True)
    except Exception as exc:  # noqa: BLE001 (any failure of the user's code or TF's is the verdict)
        key, message, hint = _blame(exc, stage, job)
        return ModeBuild(mode, False, key, message, hint,
                         code=getattr(exc, "code", None) if isinstance(exc, TpuLaunchError) else None)


def _call_model_fn(model_fn, features, labels, mode, params, config):
    """`model_fn` called as TPUEstimator calls it: labels, mode and config only if it takes them, params always."""
    from tensorflow.python.util import function_utils  # TPUEstimator's own reading of a model_fn's arguments

    accepted = function_utils.fn_args(model_fn)
    if "labels" not in accepted and labels is not None:  # TPUEstimator's words, here and below
        raise ValueError("model_fn does not take labels, but input_fn returns labels.")
    if "params" not in accepted:
        raise ValueError(f"model_fn ({model_fn}) does not include params argument, required by TPUEstimator to pass "
                         "batch size as params['batch_size']")
    given = {"labels": labels, "mode": mode, "params": params, "config": config}
    return model_fn(features=features, **{name: value for name, value in given.items() if name in accepted})


def _user_params(job) -> dict:
    """What a model_fn job's `params` hold beyond TensorFlow's keys (model.params, when the schema has it)."""
    extra = getattr(job.model, "params", None) or {}
    return dict(extra) if job.model.model_fn else {}


def _config(job):
    import tensorflow as tf

    return tf.compat.v1.estimator.tpu.RunConfig(model_dir=job.run.model_dir)


def _inputs(job, mode: str, params: dict):
    """(features, labels) as the input_fn yields them, as graph placeholders of its element spec."""
    import tensorflow as tf

    if job.data.input_fn:
        from tpulaunch.engine.estimator.runner import _input_fn

        dataset = _input_fn(job, mode, False, job.search_path)(params)
        spec = dataset.element_spec
    else:
        from tpulaunch.engine import portable
        from tpulaunch.engine.estimator.plain import spec_errors, tensor_specs

        with spec_errors():
            parse = portable.parse_batch_fn(tensor_specs(job.data.features), tensor_specs(job.data.labels))
        records = tf.compat.v1.placeholder(tf.string, [params["batch_size"]], name="serialized_records")
        return parse(records)
    if not isinstance(spec, tuple) or len(spec) != 2:
        spec = (spec, None)

    def placeholder(s):
        return tf.compat.v1.placeholder(s.dtype, s.shape, name=None)

    return tuple(tf.nest.map_structure(placeholder, part) if part is not None else None for part in spec)


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
    """Build the job's training step (its real model_fn, TRAIN mode, loss, optimizer) for PROBE_BATCH examples of
    the declared shapes and list what its gradient computation reads from the forward pass.

    Raises:
        TpuLaunchError, or whatever the job's code raises while building (the caller reports it).
    """
    import tensorflow as tf

    from tpulaunch.engine.estimator.model_fn import make_model_fn
    from tpulaunch.plan.auto import main_feature

    graph = tf.Graph()
    with graph.as_default():
        params = {"batch_size": PROBE_BATCH, "use_tpu": False, **_user_params(job)}
        features, labels = _inputs(job, "train", params)
        model_fn = make_model_fn(job, use_tpu=use_tpu, search_path=job.search_path)
        _call_model_fn(model_fn, features, labels, tf.estimator.ModeKeys.TRAIN, params, _config(job))
        kept = _kept_by_backward(graph)
        variables = [v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
                     if "global_step" not in v.name]
        trainable = graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
        params_count = _model_params(trainable, variables)
    shape = tuple(job.data.features[main_feature(job.data.features)].shape)
    return StepTensors(shape, params_count, sum(_elements(v) for v in trainable), tuple(kept))


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
