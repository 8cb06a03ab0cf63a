"""The keras engine's own static rules. Pure Python (`validate --static` runs them).

The keras engine (Keras 2 + tf.distribute.TPUStrategy) differs from TPUEstimator where TensorFlow's code
differs: its input splits must be even (`experimental_split_to_logical_devices` refuses what
TPUEstimator pads), a replica is a block of the slice's topology (`plan/tpu_layout.py`), and the
TPUEstimator-only keys (`model.model_fn`, `data.input_fn`) and the features it does not have yet
(`data.skip_corrupt`, `run.warm_start`) are refused at their keys.
"""

from __future__ import annotations

from tpulaunch.checks.engine_rules import ESTIMATOR_ONLY
from tpulaunch.checks.static import known_slice, located
from tpulaunch.job.load import LoadedJob

NOT_YET = "keras-engine-unsupported"


def problems(loaded: LoadedJob) -> list:
    """The keras engine's rules: its slice layout, the keys it cannot honour, even splits."""
    return slice_problems(loaded) + keras_key_problems(loaded) + keras_split_problems(loaded)


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


def keras_key_problems(loaded: LoadedJob) -> list:
    """Keys the keras engine cannot honour, each at its key with the fix."""
    model, data, run = loaded.section("model"), loaded.section("data"), loaded.section("run")
    problems = []
    if model is not None and model.model_fn:
        problems.append(loaded.problem(
            ("model", "model_fn"), ESTIMATOR_ONLY,
            "a TPUEstimator model_fn runs only on the estimator engine; this job runs on the keras engine",
            "set run.engine: estimator, or give model.builder (a function returning a tf.keras.Model)"))
    if model is not None and model.serving_input_fn:
        problems.append(loaded.problem(
            ("model", "serving_input_fn"), ESTIMATOR_ONLY,
            "a TPUEstimator serving_input_receiver_fn is used only by the estimator engine's export; the keras "
            "engine exports the model with a signature of data.features",
            "set run.engine: estimator, or remove model.serving_input_fn"))
    if data is not None and data.input_fn:
        problems.append(loaded.problem(
            ("data", "input_fn"), ESTIMATOR_ONLY,
            "data.input_fn is a TPUEstimator input_fn(params); the keras engine reads data.train/data.eval records "
            "with its own input pipeline (one per host, batched per replica)",
            "set run.engine: estimator, or remove data.input_fn and name the TFRecords in data.train/data.eval"))
    if data is not None and data.skip_corrupt:
        problems.append(loaded.problem(
            ("data", "skip_corrupt"), NOT_YET,
            "data.skip_corrupt is not supported by the keras engine yet: its input pipeline would stop at the first "
            "bad record",
            "set run.engine: estimator, or remove data.skip_corrupt (`tpulaunch validate --all-records` lists bad "
            "records to remove)"))
    if run is not None and run.warm_start is not None:
        problems.append(loaded.problem(
            ("run", "warm_start"), NOT_YET,
            "run.warm_start is not supported by the keras engine yet",
            "set run.engine: estimator, or remove run.warm_start (a builder can load weights itself with "
            "model.load_weights)"))
    return problems


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
