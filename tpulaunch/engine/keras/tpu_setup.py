"""The keras engine's TPUStrategy with spatial partitioning, as Model Garden's
`official/vision/train_spatial_partitioning.py` builds it: initialize the TPU system, build a
`DeviceAssignment` from its topology with the layout's computation shape and replica count, and hand it
to `TPUStrategy`; inside the replica step, tile the inputs over the replica's logical devices.

TensorFlow is imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from tpulaunch.engine.keras.tpu_layout import KerasTpuLayout, keras_layout

__all__ = ["KerasTpuLayout", "keras_layout", "device_assignment", "tpu_strategy", "split_inputs", "topology_for"]


def topology_for(tpu_type) -> Any:
    """A `tf.tpu.experimental.Topology` for a slice of this accelerator type, fabricated (no TPU needed):
    what `initialize_tpu_system` returns on the real slice (`tpulaunch.tpu.topology`)."""
    from tensorflow.python.tpu import topology as topology_lib

    from tpulaunch.tpu.topology import slice_topology

    layout = slice_topology(tpu_type)
    return topology_lib.Topology(mesh_shape=list(layout.mesh_shape),
                                 device_coordinates=[list(map(list, host)) for host in layout.device_coordinates])


def device_assignment(topology: Any, layout: KerasTpuLayout) -> Any:
    """TensorFlow's `DeviceAssignment.build` for the layout: `layout.replicas` blocks of `computation_shape`.

    Raises:
        ValueError: TensorFlow's own, when the block does not fit the topology or the replicas do not fit.
    """
    import tensorflow as tf

    return tf.tpu.experimental.DeviceAssignment.build(
        topology, computation_shape=list(layout.computation_shape), num_replicas=layout.replicas)


def tpu_strategy(resolver: Any, layout: Optional[KerasTpuLayout]) -> Any:
    """Connect to the TPU of `resolver`, initialize its system and return the TPUStrategy for `layout`.

    With one logical device per replica (or no layout) it is the plain `TPUStrategy(resolver)`; with more,
    it carries the device assignment that makes each replica a `computation_shape` block. SPMD
    partitioning stays off (TF's default): `split_inputs` then may also pin a tensor to logical device 0,
    which SPMD mode refuses.
    """
    import tensorflow as tf

    if resolver.master() not in ("", "local"):  # a TPU VM's own TPU needs no remote connection
        tf.config.experimental_connect_to_cluster(resolver)
    topology = tf.tpu.experimental.initialize_tpu_system(resolver)
    if layout is None or layout.logical_devices <= 1:
        return tf.distribute.TPUStrategy(resolver)
    return tf.distribute.TPUStrategy(resolver, experimental_device_assignment=device_assignment(topology, layout))


def split_inputs(strategy: Any, features: Any, labels: Any, feature_dims: Optional[Mapping],
                 label_dims: Optional[Mapping]) -> tuple:
    """(features, labels) with each tensor annotated for the replica's logical devices; call inside the
    replica step (`strategy.run`).

    `feature_dims`/`label_dims` follow the Plan's `feed_partition` (`plan.feed_partition.features` /
    `.labels`): per tensor name, None (left as it is: XLA's sharding propagation places it; the
    job's "replicated") or a dims list, batch axis first. A dims list splits the tensor with
    `experimental_split_to_logical_devices`; one whose product is 1 is TensorFlow's "logical device 0
    only" (`experimental_assign_to_logical_device(tensor, 0)`), as the job file's `[1]` means. A
    single tensor (not a dict) takes the dims of its only name. None for the whole mapping: nothing is
    annotated.

    Raises:
        ValueError: TensorFlow's own, for dims that do not fit a tensor (see `validate --tf`).
    """
    return _annotated(strategy, features, feature_dims), _annotated(strategy, labels, label_dims)


def _annotated(strategy: Any, tensors: Any, dims_by_name: Optional[Mapping]) -> Any:
    if tensors is None or not dims_by_name:
        return tensors
    if isinstance(tensors, Mapping):
        return {name: _one(strategy, tensor, dims_by_name.get(name)) for name, tensor in tensors.items()}
    if len(dims_by_name) != 1:
        raise ValueError(f"a single tensor, but dims for {sorted(dims_by_name)}: give one name's dims")
    return _one(strategy, tensors, next(iter(dims_by_name.values())))


def _one(strategy: Any, tensor: Any, dims) -> Any:
    if dims is None:
        return tensor
    product = 1
    for d in dims:
        product *= d
    if product == 1:
        return strategy.experimental_assign_to_logical_device(tensor, 0)
    return strategy.experimental_split_to_logical_devices(tensor, list(dims))
