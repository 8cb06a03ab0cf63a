"""The estimator engine's own static rules: what TPUConfig accepts and what TPUEstimator's infeed cannot
carry. Pure Python (`validate --static` runs them)."""

from __future__ import annotations

from tpulaunch.checks.static import check_partition, known_slice, located
from tpulaunch.job.load import LoadedJob
from tpulaunch.plan import partition as rules


def problems(loaded: LoadedJob) -> list:
    found = slice_problems(loaded)
    part, data, tpu = loaded.section("partition"), loaded.section("data"), loaded.section("tpu")
    if (part is None or part == "auto" or data is None or tpu is None or not loaded.usable("partition", "data", "tpu")
            or tpu.cores_per_replica not in rules.VALID_CORES_PER_REPLICA or tpu.cores_per_replica == 1):
        return found
    if len(data.features) > 1:
        found += _packed_small_features(loaded, data)
    if not any(p.is_error for p in check_partition(loaded)):
        found += _labels_without_feature(loaded, data, part)
    return found


def slice_problems(loaded: LoadedJob) -> list:
    """cores_per_replica is one TPUConfig accepts, fits the slice and divides it."""
    known = known_slice(loaded)
    if known is None:
        return []
    tpu, tpu_type = known
    cpr = tpu.cores_per_replica
    if cpr not in rules.VALID_CORES_PER_REPLICA:
        allowed = ", ".join(map(str, rules.VALID_CORES_PER_REPLICA))
        return [loaded.problem(("tpu", "cores_per_replica"), "cores-per-replica-invalid",
                               f"{cpr} is not one of {allowed}", "TPUConfig accepts only these values")]
    layout = rules.slice_layout(tpu_type.devices, tpu_type.hosts, cpr)
    if isinstance(layout, list):  # findings: does not fit the slice
        return [located(loaded, ("tpu", "cores_per_replica"), f) for f in layout]
    return []


# tpu_estimator.py TensorPacker (:1218, constants :92-93): 5 or more [batch, 1] features of one dtype
# are concatenated before the infeed; with spatial partitioning the flattened dims then no longer
# match the tuple and _PartitionedInfeedQueue fails with a bare AssertionError (tpu_feed.py:859).
PACKED_FEATURES_MIN = 5


def _packed_small_features(loaded: LoadedJob, data) -> list:
    groups: dict = {}
    for name, spec in data.features.items():
        if len(spec.shape) == 1 and spec.shape[0] is not None and spec.shape[0] <= 1:
            groups.setdefault(spec.dtype, []).append(name)
    problems = []
    for dtype, names in groups.items():
        if len(names) >= PACKED_FEATURES_MIN:
            problems.append(loaded.problem(
                ("data", "features"), "partition-packed-small-features",
                f"{len(names)} features of shape [1] and dtype {dtype} ({', '.join(names)}): TPUEstimator packs 5 or more "
                f"such features into one tensor, and with spatial partitioning its infeed then fails (a bare AssertionError)",
                f"store them as one feature of shape [{len(names)}], or keep at most {PACKED_FEATURES_MIN - 1} per dtype"))
    return problems


def _labels_without_feature(loaded: LoadedJob, data, part) -> list:
    """TPUEstimator needs `input_partition_dims[0]` whenever it partitions anything (tpu_feed.py
    `_PartitionedInfeedQueue`): a single feature that is not partitioned cannot sit beside split labels."""
    if len(data.features) != 1:
        return []
    (name,) = data.features
    if part.features.get(name) is not None or not any(d is not None for d in part.labels.values()):
        return []
    path = ("partition", "features") if "features" in (loaded.data.get("partition") or {}) else ("partition",)
    rank = len(data.features[name].shape) + 1
    return [loaded.problem(path, "partition-labels-without-feature",
                           f"labels are partitioned but the only feature '{name}' is not: TPUEstimator needs the "
                           "feature's dims whenever labels are partitioned",
                           f"give partition.features.{name} its dims (all 1s, e.g. {[1] * rank}, keeps it on core 0)")]


