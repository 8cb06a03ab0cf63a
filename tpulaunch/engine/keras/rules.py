"""The keras engine's own static rules. Pure Python (`validate --static` runs them).

The keras engine (Keras 2 + tf.distribute.TPUStrategy) differs from TPUEstimator where TensorFlow's code
differs: its input splits must be even (`experimental_split_to_logical_devices` refuses what
TPUEstimator pads) and a replica is a block of the slice's topology (`plan/tpu_layout.py`). The keys it does
not honour are declared in its about.py (`refused_keys`), TPUEstimator's own in the estimator's (`own_keys`).
"""

from __future__ import annotations

from tpulaunch.checks.static import known_slice, located
from tpulaunch.job.load import LoadedJob

def problems(loaded: LoadedJob) -> list:
    """The keras engine's rules: its slice layout, even splits (the keys it cannot honour are its about.py's)."""
    return slice_problems(loaded) + keras_split_problems(loaded)


def slice_problems(loaded: LoadedJob) -> list:
    """cores_per_replica (logical devices per replica) has a computation shape that fits the slice's topology."""
    from tpulaunch.plan.tpu_layout import layout_for_type

    known = known_slice(loaded)
    if known is None:
        return []
    tpu, tpu_type = known
    layout = layout_for_type(tpu_type, tpu.cores_per_replica)
    if not isinstance(layout, list):
        return []
    return [located(loaded, ("tpu", "cores_per_replica"), f) for f in layout]


def _first_per_axis(findings: list) -> list:
    seen, out = set(), []
    for f in findings:
        if f.index not in seen:
            seen.add(f.index)
            out.append(f)
    return out


def keras_split_problems(loaded: LoadedJob) -> list:
    """Every split axis divides evenly at the per-replica shape (batch axis included): TPUStrategy's rule.

    For `partition: auto` the dims it resolved to are checked, located at `partition`.
    """
    from tpulaunch.checks.static import layout_of, per_replica_batch
    from tpulaunch.plan.tpu_layout import split_findings
    from tpulaunch.plan.build import resolve_partition
    from tpulaunch.plan.partition import VALID_CORES_PER_REPLICA

    part, data, tpu = loaded.section("partition"), loaded.section("data"), loaded.section("tpu")
    if part is None or data is None or tpu is None or not loaded.usable("partition", "data", "tpu"):
        return []
    cores = tpu.cores_per_replica
    if cores not in VALID_CORES_PER_REPLICA or cores == 1:
        return []  # reported by the slice rule; with one core nothing is split
    # The batch axis is split at each mode's per-replica batch; the other axes are the same in both.
    batches = [(f"{section}.batch_size", per_replica_batch(loaded, section)) for section in ("train", "eval")
               if loaded.section(section) is not None] or [("train.batch_size", 1)]
    batch = batches[0][1]
    layout = layout_of(loaded)
    replicas = layout.replicas if layout else 1
    auto = part == "auto"
    if auto and not all(spec.is_static for spec in data.features.values()):
        return []  # reported once by the static-shape rule
    chosen = resolve_partition(part, data.features, data.labels, cores, batch, even=True)
    if chosen is None:
        return []  # partition-auto-impossible, from the partition rule
    problems = []
    for group in ("features", "labels"):
        declared = getattr(data, group)
        for name, dims in getattr(chosen, group).items():
            if dims is None or name not in declared or len(dims) != len(declared[name].shape) + 1:
                continue  # replicated, unknown or wrong rank: the partition rule reports those
            product = 1
            for d in dims:
                product *= d
            if product != cores:
                continue  # core 0 only (product 1) is not split; a wrong product is the partition rule's
            findings = []
            for batch_key, mode_batch in batches:
                shape = [mode_batch] + list(declared[name].shape)
                findings += [f for f in split_findings(name, shape, dims, replicas=replicas, batch_key=batch_key)
                             if f.index == 0 or batch_key == batches[0][0]]
            for f in _first_per_axis(findings):
                if auto:
                    problems.append(loaded.problem(("partition",), f.code, f"partition: auto chose {dims} for "
                                                   f"'{name}': {f.message}", f.hint))
                else:
                    problems.append(located(loaded, ("partition", group, name), f, index_path=True))
    return problems
