"""What one training step keeps for its backward pass, read from the graph an engine built (the memory
estimate's input, `plan/memory.py`): the forward tensors the gradient ops read, per example."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

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
    # The bytes of the state the step's optimizer made (its slot variables: Adam's m and v, Momentum's
    # accumulator), counted in the built step; None where the engine could not count them.
    optimizer_bytes: Optional[int] = None


def elements(variable) -> int:
    return int(variable.shape.num_elements() or 0)


def state_bytes(variables) -> int:
    """The bytes of the per-weight state among `variables` (an optimizer's slots): the scalars beside them (a step
    counter, Adam's beta powers, a learning rate) are left out, so the count is that of the slots alone."""
    import tensorflow as tf

    total = 0
    for variable in variables:
        shape = tf.TensorShape(variable.shape)
        if shape.rank:
            total += int(shape.num_elements() or 0) * tf.as_dtype(variable.dtype).size
    return total


def _is_gradient(name: str) -> bool:
    # tf.gradients names its ops gradients/... (the estimator's graph); tf.GradientTape gradient_tape/... (keras)
    return name.startswith("gradients") or name.startswith("gradient_tape")


def kept_by_backward(graph) -> list:
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
