"""`validate --tf` for the keras engine: ask TensorFlow's own TPUStrategy code whether it accepts the job's
layout and input splits for the declared slice. No TPU, no network, in this process (about a second).

Two questions, each answered by the code a real run calls:

* `tf.tpu.experimental.DeviceAssignment.build(topology, computation_shape, num_replicas)` on the slice's
  topology (fabricated as `initialize_tpu_system` would report it: `tpulaunch.tpu.topology`), with the
  layout's computation shape and replica count (`engine.keras.tpu_layout`);
* `TPUStrategy.experimental_split_to_logical_devices` (or `experimental_assign_to_logical_device` for
  dims whose product is 1) on a symbolic tensor of each input's per-replica shape, in a scratch graph.
  The method reads only `extended._tpu_devices.shape[1]` from its strategy (TF 2.21 `tpu_strategy.py`),
  so it is called unbound on a stand-in whose device array has the device assignment's shape
  [replicas, logical devices]; no TPU system is initialized.

A refusal is TensorFlow's ValueError text, located at the job key it is about; what TensorFlow built is
returned per mode in the same form as the estimator's verdict, for `render_tf_built`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Sequence

from tpulaunch.job.load import LoadedJob

if TYPE_CHECKING:
    from tpulaunch.plan.build import Plan

REJECTED = "tensorflow-rejected"
CHECK_FAILED = "tensorflow-check-failed"
NOT_ON_TPU = "tensorflow-not-on-tpu"

_AXIS = re.compile(r"partition_dimensions\[(\d+)\]")


def tf_problems(loaded: LoadedJob, plan: "Plan", search_path: Sequence[str] = ()) -> tuple:
    """TensorFlow's verdict on the job's TPU layout and input splits, as located problems, and what it built.

    Returns:
        (problems, built): `built` maps "train"/"eval" to {engine: "keras", accepted, replicas,
        logical_devices, computation_shape, core_coordinates (distinct TPU devices the assignment uses),
        input_pipelines (hosts feeding a replica's logical device 0), per_replica_batch, piece_shapes
        {name: [shape, ...]}, sharding {name: kind}, message}.
    """
    del search_path  # the layout and splits do not depend on the job's code
    from tpulaunch.plan.tpu_layout import computation_shape
    from tpulaunch.tpu.topology import slice_topology
    from tpulaunch.tpu.types import UnknownTpuType, parse_tpu_type

    job = loaded.job
    if job is None:
        return [], {}
    if job.tpu is None:
        return [loaded.problem(("name",), NOT_ON_TPU,
                               "no tpu: section, so there is no TPUStrategy layout to check; the job runs locally",
                               "add a tpu: section to have TensorFlow check the job for a slice",
                               severity="info")], {}
    try:
        tpu_type = parse_tpu_type(job.tpu.type)
    except UnknownTpuType as exc:
        return [loaded.problem(("tpu", "type"), CHECK_FAILED, str(exc), exc.hint)], {}
    logical = job.tpu.cores_per_replica
    shape = computation_shape(slice_topology(tpu_type).mesh_shape, logical)
    if shape is None:
        return [loaded.problem(("tpu", "cores_per_replica"), CHECK_FAILED,
                               f"{logical} logical devices per replica have no computation shape to ask TensorFlow about",
                               "use a power of two (see `tpulaunch validate --static`)")], {}
    replicas = max(1, tpu_type.devices // logical)

    import numpy as np
    import tensorflow as tf

    from tpulaunch.engine.keras.tpu_setup import topology_for

    problems = []
    facts = {"engine": "keras", "device_assignment": True, "logical_devices": logical, "computation_shape": list(shape), "replicas": replicas}
    try:
        assignment = tf.tpu.experimental.DeviceAssignment.build(
            topology_for(tpu_type), computation_shape=list(shape), num_replicas=replicas)
    except ValueError as exc:
        problems.append(loaded.problem(
            ("tpu", "cores_per_replica"), REJECTED,
            f"TensorFlow's DeviceAssignment.build refused {logical} logical devices per replica "
            f"(computation shape {list(shape)}, {replicas} replica(s)) on {tpu_type.name}: {exc}",
            f"use a cores_per_replica whose block fits the {tpu_type.name} mesh, or a larger slice"))
        facts["accepted_assignment"] = False
    else:
        coordinates = {tuple(assignment.coordinates(r, c)) for r in range(assignment.num_replicas)
                       for c in range(assignment.num_cores_per_replica)}
        facts.update(replicas=assignment.num_replicas, logical_devices=assignment.num_cores_per_replica,
                     core_coordinates=len(coordinates),
                     input_pipelines=len({assignment.host_device(r, logical_core=0) for r in range(assignment.num_replicas)}))
    stand_in = _StandIn(np.empty((facts["replicas"], facts["logical_devices"]), dtype=object))
    built = {}
    for mode in [m for m, section in (("train", job.train), ("eval", job.eval)) if section is not None]:
        batch = plan.batch(mode)
        split_problems, pieces, sharding = _split_checks(loaded, stand_in, batch.per_replica, plan.feed_partition, mode)
        problems.extend(split_problems)
        refused = ([p for p in problems if p.path == "tpu.cores_per_replica"] + split_problems)
        built[mode] = dict(facts, accepted=not refused, per_replica_batch=batch.per_replica,
                           params_batch_size=batch.per_replica, input_fn_calls=facts.get("input_pipelines"),
                           piece_shapes=pieces, sharding=sharding, model="job",
                           message=refused[0].message if refused else None, traceback=None)
    return _unique(problems), built


class _StandIn:
    """What TPUStrategy's split and assign methods read from their strategy: the [replica, logical device] array."""

    def __init__(self, tpu_devices):
        self.extended = type("Extended", (), {"_tpu_devices": tpu_devices, "_use_spmd_for_xla_partitioning": False})()


def _split_checks(loaded: LoadedJob, stand_in, per_replica_batch: int, feed, mode: str) -> tuple:
    """TF's split of each partitioned tensor at its per-replica shape: (problems, pieces, sharding kinds)."""
    import tensorflow as tf
    from tensorflow.compiler.xla import xla_data_pb2
    from tensorflow.python.compiler.xla.experimental import xla_sharding

    job = loaded.job
    problems, pieces, sharding = [], {}, {}
    if feed is None:
        return problems, pieces, sharding
    strategy_cls = tf.distribute.TPUStrategy
    for group in ("features", "labels"):
        declared = getattr(job.data, group)
        for name, dims in getattr(feed, group).items():
            if dims is None or name not in declared:
                continue
            shape = [per_replica_batch] + list(declared[name].shape)
            with tf.Graph().as_default():
                tensor = tf.compat.v1.placeholder(declared[name].dtype, shape, name=name)
                try:
                    if _product(dims) == 1:
                        annotated = strategy_cls.experimental_assign_to_logical_device(stand_in, tensor, 0)
                    else:
                        annotated = strategy_cls.experimental_split_to_logical_devices(stand_in, tensor, list(dims))
                except ValueError as exc:
                    problems.append(_split_problem(loaded, group, name, dims, shape, mode, exc))
                    continue
                proto = xla_data_pb2.OpSharding()
                proto.ParseFromString(xla_sharding.get_tensor_sharding(annotated))
            if proto.type == xla_data_pb2.OpSharding.MAXIMAL:
                sharding[name] = f"core{proto.tile_assignment_devices[0]}"
                pieces[name] = [list(shape)]
            else:
                tiles = list(proto.tile_assignment_dimensions)
                sharding[name] = "tiled"
                pieces[name] = [[size // ways for size, ways in zip(shape, tiles)]] * _product(tiles)
    return problems, pieces, sharding


def _split_problem(loaded: LoadedJob, group: str, name: str, dims, shape, mode: str, exc: ValueError):
    key = ("partition", group, name)
    written = loaded.job.partition
    if written == "auto":
        key = ("partition",)
    match = _AXIS.search(str(exc))
    if match and written != "auto":
        key += (int(match.group(1)),)
    return loaded.problem(
        key, REJECTED,
        f"TensorFlow's TPUStrategy.experimental_split_to_logical_devices refused dims {list(dims)} for '{name}' "
        f"at its per-replica {mode} shape {shape}: {exc}",
        "use dims that divide each axis (batch axis: the per-replica batch) and multiply to tpu.cores_per_replica")


def _product(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


def _unique(problems: list) -> list:
    """One problem per key and code: train's refusal, not eval's again at its own batch."""
    seen, out = set(), []
    for p in problems:
        key = (p.path, p.code)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


__all__ = ["tf_problems"]
