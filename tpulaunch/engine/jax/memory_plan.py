"""Will it fit? The jax engine's training step, for `plan`'s estimate and for XLA's TPU compiler.

The step is Keras 3's own on JAX: `model.train_step(state, data)`, stateless (the trainable, non-trainable,
optimizer and metrics variables in, their new values out), the job's loss, optimizer and metrics compiled as
`train` compiles them (`training.JaxTraining`).

- The estimate (`step_tensors`): what the backward pass keeps is what JAX saves for it, the residuals of the
  loss's VJP with respect to the trainable variables, traced for PROBE_BATCH abstract examples
  (`jax.ShapeDtypeStruct`: nothing is computed). Each is classed by the backward operation that reads it, as
  `engine/core/step_tensors.py` classes TensorFlow's gradient ops: a convolution's or a matmul's operand and a
  normalisation's input (a product in JAX's backward) are required; a ReLU's mask and a max-pool's input (a
  select) could be recomputed (the lower bound); what only an elementwise chain of the loss reads, and the
  step's own inputs, are not charged. Beside them the backward pass holds a buffer of its own at its peak: the
  gradient of the largest activation kept, charged once.
- XLA's answer (`export_step`, in the step child of `plan/memory.py`): the same train step under `jax.jit`,
  lowered for the TPU (`jax.export`, platform "tpu") at the per-replica batch as StableHLO, its variables'
  buffers donated, the features first among its parameters; `plan/xla_compile.py` compiles it for the job's
  topology with the shardings and donations every engine's step gets there.
"""

from __future__ import annotations

import os
import tempfile
from typing import Sequence

from tpulaunch.engine.core.step_tensors import PROBE_BATCH, KeptTensor, StepTensors

# The backward operations that read a forward value, by how the estimate charges it (see the module's doc).
_REQUIRED = {"conv_general_dilated", "dot_general", "mul", "div"}
_REMATERIALISABLE = {"select_n", "select_and_scatter_add", "select_and_gather_add", "max", "min"}
# An operation that only passes its operand on: its reader is the reader of what it reads.
_PASS_THROUGH = {"convert_element_type", "reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims",
                 "copy", "copy_p", "sharding_constraint"}


def _one_device_host() -> None:
    """The step child compiles one replica's program: JAX on one CPU device, whatever XLA_FLAGS split the host
    into for the job's own runs."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    os.environ["XLA_FLAGS"] = " ".join(flags)


def _training(job, search_path: Sequence[str], builder_kwargs=None):
    """The job's JaxTraining (its model, loss, optimizer, metrics), as `train` makes it; the builder's arguments as the
    plan asks for them (`builder_kwargs`: at the tile's shape) where given."""
    from tpulaunch.engine.jax.training import JaxTraining, load_keras
    from tpulaunch.engine.job_code import job_builder, job_functions
    from tpulaunch.job.flags import apply_flags

    load_keras()
    apply_flags(job, search_path=search_path)  # before the job's code runs, as `train` does
    builder, kwargs = job_builder(job, search_path=search_path)
    whole_loss, _losses, _metrics = job_functions(job, search_path=search_path)
    return JaxTraining(job, builder, dict(builder_kwargs) if builder_kwargs is not None else kwargs,
                       custom_loss=whole_loss)


def data_specs(job, model, batch: int) -> tuple:
    """Abstract features (one tensor, or a dict by name, as the input pipeline hands them) and label (several: a
    dict by name, as the pipeline hands them) at `batch` examples, at the shapes the model was built for."""
    import jax

    def spec(shape, dtype):
        return jax.ShapeDtypeStruct((batch, *shape), "float32" if dtype == "bfloat16" else dtype)

    names = list(job.data.features)
    if len(names) == 1:
        built = tuple(int(d) for d in model.inputs[0].shape[1:]) if getattr(model, "inputs", None) else None
        features = spec(built or tuple(job.data.features[names[0]].shape), job.data.features[names[0]].dtype)
    else:
        features = {name: spec(tuple(s.shape), s.dtype) for name, s in job.data.features.items()}
    labels = {name: spec(tuple(s.shape), s.dtype) for name, s in job.data.labels.items()}
    return features, next(iter(labels.values())) if len(labels) == 1 else labels


def abstract_state(model):
    """The model's step state as abstract values: (trainable, non-trainable, optimizer, metrics variables)."""
    import jax

    def specs(variables):
        return [jax.ShapeDtypeStruct(tuple(v.shape), v.dtype) for v in variables]

    return (specs(model.trainable_variables), specs(model.non_trainable_variables),
            specs(model.optimizer.variables), specs(model.metrics_variables))


def _built(training, features, labels) -> None:
    """Keras builds the compiled loss's and metrics' variables at the first batch: built here on zeros of the
    abstract batch's shapes, so the step's state is whole before it is traced."""
    import jax
    import numpy as np

    def zeros(spec):
        return np.zeros(spec.shape, spec.dtype)

    training.model._symbolic_build(data_batch=(jax.tree_util.tree_map(zeros, features),
                                               jax.tree_util.tree_map(zeros, labels)))


# ------------------------------------------------------------------------------------------ the estimate

def step_tensors(job, *, use_tpu: bool) -> StepTensors:
    """What one training step keeps for its backward pass, per example (the residuals of the loss's VJP, traced at
    PROBE_BATCH abstract examples), the weights and the optimizer's slots (its per-weight variables)."""
    import numpy as np

    from tpulaunch.plan.auto import main_feature

    training = _training(job, job.search_path)
    model = training.model
    features, labels = data_specs(job, model, PROBE_BATCH)
    labels = training.keras_labels(labels)  # several: as the model's compile() takes them
    _built(training, features, labels)
    trainable, non_trainable, optimizer, metrics = abstract_state(model)

    def loss(weights, others, slots, metric_values, x, y):
        value, _aux = model.compute_loss_and_updates(weights, others, metric_values, x, y, None, training=True,
                                                     optimizer_variables=slots)
        return value

    kept = _kept(loss, trainable, (non_trainable, optimizer, metrics, features, labels))
    params = sum(int(np.prod(v.shape)) for v in model.weights)
    trainable_params = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    slots = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.optimizer.variables
                if len(v.shape))  # its step counter and scalars left out, as the other engines count
    shape = tuple(job.data.features[main_feature(job.data.features)].shape)
    return StepTensors(shape, params, trainable_params, tuple(kept), slots)


def _kept(loss, weights, others: tuple) -> list:
    """The residuals JAX saves for the backward pass of `loss` with respect to `weights`, per example, classed by
    what reads them in the backward pass."""
    import jax
    from jax.extend import core as jax_core

    treedef = {}

    def forward(weights, others):
        value, backward = jax.vjp(lambda w: loss(w, *others), weights)
        leaves, treedef["tree"] = jax.tree_util.tree_flatten(backward)
        return value, leaves

    closed, (value, residuals) = jax.make_jaxpr(forward, return_shape=True)(weights, others)
    backward = jax.make_jaxpr(lambda leaves, cotangent: jax.tree_util.tree_unflatten(treedef["tree"], leaves)(
        cotangent))(residuals, value)
    forward_jaxpr = closed.jaxpr
    arguments = set(forward_jaxpr.invars)
    produced = {out: eqn for eqn in forward_jaxpr.eqns for out in eqn.outvars}
    readers = _readers(backward.jaxpr)
    out, seen = [], set()
    for source, read_as in zip(forward_jaxpr.outvars[1:], backward.jaxpr.invars[:len(residuals)]):
        if isinstance(source, jax_core.Literal):  # a constant the backward pass reads: no memory of the step's
            continue
        aval = source.aval
        per_example = bool(aval.shape) and aval.shape[0] == PROBE_BATCH
        floating_or_mask = jax.numpy.issubdtype(aval.dtype, jax.numpy.inexact) or aval.dtype == bool
        if source in arguments or source not in produced or source in seen or not (per_example and floating_or_mask):
            continue
        seen.add(source)
        how = readers.get(read_as, set())
        if how & _REQUIRED:
            required = True
        elif how & _REMATERIALISABLE:
            required = False
        else:
            continue  # read only by an elementwise chain (a loss's), which XLA fuses and recomputes
        out.append(KeptTensor(tuple(int(d) for d in aval.shape[1:]), aval.dtype.itemsize, required))
    return out + _largest_cotangent(out)


def _largest_cotangent(kept: list) -> list:
    """The backward pass's own buffer at its peak: the gradient of the largest activation it keeps, live beside the
    residuals while the layer that made it is differentiated (a mask's gradient is its activation's)."""
    import math

    activations = [k for k in kept if k.bytes_per_element > 1]
    if not activations:
        return []
    largest = max(activations, key=lambda k: math.prod(k.shape) * k.bytes_per_element)
    return [KeptTensor(largest.shape, largest.bytes_per_element, True)]


def _readers(jaxpr) -> dict:
    """For each input variable of `jaxpr`: the primitives that read it (through pass-through operations and into
    nested calls: a `jit`, a `custom_jvp_call`)."""
    from jax.extend import core as jax_core

    readers: dict = {}

    def visit(inner, names: dict) -> None:
        for eqn in inner.eqns:
            for position, variable in enumerate(eqn.invars):
                if isinstance(variable, jax_core.Literal) or variable not in names:
                    continue
                found = names[variable]
                sub = _nested(eqn)
                if sub is not None and position < len(sub.invars):
                    visit(sub, {sub.invars[position]: found})
                elif eqn.primitive.name in _PASS_THROUGH:
                    for result in eqn.outvars:  # read by the equations after it
                        names[result] = found
                else:
                    readers.setdefault(found, set()).add(eqn.primitive.name)

    visit(jaxpr, {v: v for v in jaxpr.invars})
    return readers


def _nested(eqn):
    """The jaxpr a call-like equation runs (pjit, custom_jvp_call, closed_call, remat), else None."""
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        inner = eqn.params.get(key)
        if inner is not None:
            return getattr(inner, "jaxpr", inner)
    return None


# ------------------------------------------------------------------------------------------ XLA's answer

def export_step(request: dict) -> dict:
    """Lower one training step of the job's model at `request["batch"]` examples for the TPU and write its
    StableHLO; runs in the step child (`plan/memory.py`), the plan's environment.

    Returns:
        {"hlo": path, "format": "stablehlo", "inputs": the features' parameters (first), "donated": the
         variables' parameters, "parameters": count, "input_shape": per example, as built}.
    """
    _one_device_host()
    from tpulaunch.engine.jax.training import load_keras
    from tpulaunch.job.schema import Job

    _keras, jax = load_keras()
    # XLA's sharding annotations as `plan/xla_compile.py` puts them on every engine's step (not Shardy's).
    jax.config.update("jax_use_shardy_partitioner", False)
    job = Job.model_validate(request["job"])
    training = _training(job, request["search_path"], request["kwargs"])
    model = training.model
    features, labels = data_specs(job, model, request["batch"])
    labels = training.keras_labels(labels)  # several: as the model's compile() takes them
    _built(training, features, labels)
    state = abstract_state(model)

    def step(features, labels, state):
        _logs, new_state = model.train_step(state, (features, labels))
        return new_state

    exported = jax.export.export(jax.jit(step, donate_argnums=(2,)), platforms=["tpu"])(features, labels, state)
    inputs = len(jax.tree_util.tree_leaves(features))
    label_count = len(jax.tree_util.tree_leaves(labels))
    parameters = inputs + label_count + len(jax.tree_util.tree_leaves(state))
    fd, path = tempfile.mkstemp(prefix="tpulaunch-step-", suffix=".mlir", dir=request.get("dir"))
    with os.fdopen(fd, "w") as f:
        f.write(exported.mlir_module())
    first = jax.tree_util.tree_leaves(features)[0]
    return {"hlo": path, "format": "stablehlo", "inputs": inputs,
            "donated": list(range(inputs + label_count, parameters)), "parameters": parameters,
            "input_shape": [int(d) for d in first.shape[1:]]}
