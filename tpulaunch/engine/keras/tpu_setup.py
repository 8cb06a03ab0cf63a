"""The keras engine's device assignment on a slice's topology, as Model Garden's
`official/vision/train_spatial_partitioning.py` builds it: `DeviceAssignment.build` with the layout's
computation shape and replica count, on the topology `initialize_tpu_system` returns (or, offline, on
one fabricated for the slice: `validate --tf`). The TPUStrategy itself and the split of the inputs
over the logical devices are in `standalone.py` (`make_strategy`, `annotate_for_logical_devices`),
which `explain` prints.

TensorFlow is imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

from typing import Any

from tpulaunch.plan.tpu_layout import StrategyLayout, strategy_layout

__all__ = ["StrategyLayout", "strategy_layout", "device_assignment", "topology_for"]


def topology_for(tpu_type) -> Any:
    """A `tf.tpu.experimental.Topology` for a slice of this accelerator type, fabricated (no TPU needed):
    what `initialize_tpu_system` returns on the real slice (`tpulaunch.tpu.topology`)."""
    from tensorflow.python.tpu import topology as topology_lib

    from tpulaunch.tpu.topology import slice_topology

    layout = slice_topology(tpu_type)
    return topology_lib.Topology(mesh_shape=list(layout.mesh_shape),
                                 device_coordinates=[list(map(list, host)) for host in layout.device_coordinates])


def device_assignment(topology: Any, layout: StrategyLayout) -> Any:
    """TensorFlow's `DeviceAssignment.build` for the layout: `layout.replicas` blocks of `computation_shape`.

    Raises:
        ValueError: TensorFlow's own, when the block does not fit the topology or the replicas do not fit.
    """
    import tensorflow as tf

    return tf.tpu.experimental.DeviceAssignment.build(
        topology, computation_shape=list(layout.computation_shape), num_replicas=layout.replicas)
