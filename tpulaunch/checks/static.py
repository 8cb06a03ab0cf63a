"""Rules that relate several sections of a job: the slice, partitioning, batches, cadences.

Pure Python and fast: no TensorFlow. Each rule looks only at sections that validated, so a schema
mistake in one section does not hide a partitioning mistake in another.
"""

from __future__ import annotations

import math
from typing import Optional

from tpulaunch.job.load import LoadedJob, did_you_mean
from tpulaunch.plan import partition as rules
from tpulaunch.plan.build import Plan, device_cores, layout_for, per_replica
from tpulaunch.tpu.types import UnknownTpuType, parse_tpu_type

# A per-core piece whose (8,128)-padded layout is this many times its real size, and at least this
# big once padded, is worth a warning (a 1 KiB label padded 32x costs nothing worth saying).
PADDING_WARN_FACTOR = 4.0
PADDING_WARN_BYTES = 1 << 20


def even_splits(loaded: LoadedJob) -> bool:
    """The job's engine splits inputs only evenly (its `EngineAbout.layout.even_splits`): uneven pieces are its own
    rules' errors, not padding to warn about, and `partition: auto` picks only even splits."""
    return loaded.engine_about.layout.even_splits


def known_slice(loaded: LoadedJob):
    """(the tpu: section, its TpuType) for the engines' slice rules; None without a tpu: section or with an
    unknown type (which `check_slice` reports)."""
    tpu = loaded.section("tpu")
    if tpu is None:
        return None
    try:
        return tpu, parse_tpu_type(tpu.type)
    except UnknownTpuType:
        return None


def check_slice(loaded: LoadedJob) -> list:
    """The TPU type is known (what cores_per_replica may be there is each engine's rule)."""
    tpu = loaded.section("tpu")
    if tpu is None:
        return []
    try:
        parse_tpu_type(tpu.type)
    except UnknownTpuType as exc:
        verdict = _engine_type_verdict(loaded, tpu.type)
        if verdict is not None:  # a generation the job's engine runs on that tpulaunch cannot create (TPU7x on JAX)
            return [loaded.problem(("tpu", "type"), f"tpu-stack-{verdict.code}", verdict.message, verdict.fix)]
        return [loaded.problem(("tpu", "type"), "unknown-tpu-type", str(exc), getattr(exc, "hint", None))]
    return []


def _engine_type_verdict(loaded: LoadedJob, name: str):
    """The job's engine's own verdict on a type name tpulaunch's TPU types do not list (its stack's
    `type_verdict`, by the name's family), or None."""
    about = loaded.engine_about
    if about is None or about.tpu_stack is None:
        return None
    judge = getattr(about.stack(), "type_verdict", None)
    return judge(str(name).strip().split("-")[0].lower()) if judge else None


def located(loaded: LoadedJob, path, finding, *, index_path: bool = False):
    if index_path and finding.index is not None:
        path = tuple(path) + (finding.index,)
    severity = "error" if finding.severity == "error" else "warning"
    return loaded.problem(path, finding.code, finding.message, finding.hint, severity=severity)


def layout_of(loaded: LoadedJob):
    """The slice layout, or None when the TPU section is absent or wrong."""
    return layout_for(loaded.section("tpu"))


def check_batches(loaded: LoadedJob) -> list:
    """Global batch sizes divide over the replicas (TF checks replicas, never hosts, in PER_HOST_V2)."""
    layout = layout_of(loaded)
    if layout is None:
        return []
    problems = []
    for section in ("train", "eval"):
        spec = loaded.section(section)
        if spec is None:
            continue
        for f in rules.check_batch(section, spec.batch_size, layout.replicas):
            problems.append(located(loaded, (section, "batch_size"), f))
    return problems


def per_replica_batch(loaded: LoadedJob, section: str = "train") -> Optional[int]:
    spec = loaded.section(section)
    return None if spec is None else per_replica(spec.batch_size, layout_of(loaded))


def check_partition(loaded: LoadedJob) -> list:
    """partition: mirrors data.features/labels, and each tensor's dims meet TF's rules."""
    part = loaded.section("partition")
    data = loaded.section("data")
    tpu = loaded.section("tpu")
    if not loaded.usable("partition", "data", "tpu") or data is None:
        return []
    problems = []
    if part is None:
        if tpu is not None and tpu.cores_per_replica > 1:
            problems.append(loaded.problem(("tpu", "cores_per_replica"), "partition-missing",
                                           f"cores_per_replica is {tpu.cores_per_replica} but no input is partitioned: "
                                           f"{tpu.cores_per_replica - 1} of every {tpu.cores_per_replica} cores get no input",
                                           "add a partition: section (see `tpulaunch plan`), or set cores_per_replica: 1",
                                           severity="warning"))
        return problems
    cores_from = "tpu.cores_per_replica"
    if tpu is None and not loaded.engine_about.layout.partition_on_devices:
        return [loaded.problem(("partition",), "partition-without-tpu",
                               "partition applies only on a TPU; this job runs locally, so it is ignored",
                               "add a tpu: section, or remove partition:", severity="warning")]
    if tpu is None:  # split over this machine's devices: a replica spans the largest product of the dims
        if part == "auto":
            return [loaded.problem(("partition",), "partition-auto-without-tpu",
                                   "partition: auto chooses dims for tpu.cores_per_replica; on this machine's devices "
                                   "a replica spans the product of the dims you give",
                                   "give each tensor's dims (e.g. features: {image: [1, 2, 2, 1]} for a 2x2 split)")]
        cpr, cores_from = device_cores(part), "a replica's devices (the largest product of partition:'s dims)"
    else:
        cpr = tpu.cores_per_replica if tpu.cores_per_replica in rules.VALID_CORES_PER_REPLICA else None
    batch = per_replica_batch(loaded, "train") or per_replica_batch(loaded, "eval") or 1
    if part == "auto":
        return _check_auto_partition(loaded, data, cpr, batch)
    any_partitioned = False
    for group in ("features", "labels"):
        declared = getattr(data, group)
        for name, dims in getattr(part, group).items():
            path = ("partition", group, name)
            if name not in declared:
                hint = did_you_mean(name, list(declared)) or f"data.{group} declares: {', '.join(declared) or 'nothing'}"
                problems.append(loaded.problem(path, "partition-unknown-tensor",
                                               f"'{name}' is not in data.{group}", hint, at_key=True))
                continue
            if dims is None:
                continue
            if cpr is None:
                continue
            shape = [batch] + list(declared[name].shape)
            findings = _engine_findings(loaded, rules.check_tensor_dims(name, shape, dims, cpr, cores_from))
            any_partitioned |= math.prod(dims) > 1
            for f in findings:
                problems.append(located(loaded, path, f, index_path=True))
    explicit = all(name in getattr(part, group) for group in ("features", "labels") for name in getattr(data, group))
    if cpr and cpr > 1 and not any_partitioned and not explicit and not any(p.is_error for p in problems):
        problems.append(loaded.problem(("partition",), "partition-missing",
                                       f"cores_per_replica is {cpr} but no tensor is split: "
                                       f"{cpr - 1} of every {cpr} cores get no input",
                                       "give the big input (image, volume) dims whose product is cores_per_replica",
                                       severity="warning"))
    return problems


def _check_auto_partition(loaded: LoadedJob, data, cpr: Optional[int], batch: int) -> list:
    """`partition: auto`: the dims it resolves to exist and meet TF's rules."""
    from tpulaunch.plan.auto import auto_partition

    if cpr is None:
        return []
    if cpr == 1:
        return [loaded.problem(("partition",), "partition-auto-one-core",
                               "partition: auto with cores_per_replica 1 splits nothing",
                               "set tpu.cores_per_replica (`tpulaunch plan` recommends one when the job does not fit), "
                               "or remove partition:", severity="warning")]
    if not all(spec.is_static for spec in data.features.values()):
        return []  # reported once by the static-shape rule
    even = even_splits(loaded)
    chosen = auto_partition(data.features, data.labels, cpr, batch, even=even)
    if chosen is None:
        enough = (f"divisible by 2 often enough (the {loaded.engine_about.display} splits only evenly)" if even
                  else "large enough")
        return [loaded.problem(("partition",), "partition-auto-impossible",
                               f"partition: auto cannot split the features over {cpr} cores: no spatial axis is {enough}",
                               "use fewer cores_per_replica, or give partition dims per tensor")]
    problems = []
    for group in ("features", "labels"):
        for name, dims in getattr(chosen, group).items():
            if dims is None:
                continue
            shape = [batch] + list(getattr(data, group)[name].shape)
            for f in _engine_findings(loaded, rules.check_tensor_dims(name, shape, dims, cpr)):
                problems.append(loaded.problem(("partition",), f.code, f"partition: auto chose {dims} for '{name}': {f.message}",
                                               f.hint, severity=f.severity))
    return problems


# Uneven pieces are padded by an engine that pads (a warning); an engine that splits only evenly refuses
# them in its own rules (an error there), so they are not warned about here too.
_PADDED_SPLIT_CODES = ("partition-uneven", "partition-empty-pieces")


def _engine_findings(loaded: LoadedJob, findings: list) -> list:
    if not even_splits(loaded):
        return findings
    return [f for f in findings if f.code not in _PADDED_SPLIT_CODES]


def layout_padding_problems(loaded: LoadedJob, plan: "Plan") -> list:
    """Per-core pieces that (8,128) layout tiles inflate by a factor and a size worth a warning, one per tensor
    (read from the job's Plan, once the rules above passed)."""
    job = loaded.job
    if not plan.on_tpu:
        return []
    problems = []
    for t in plan.tensors:
        if t.padding_factor < PADDING_WARN_FACTOR or t.piece_bytes_padded < PADDING_WARN_BYTES:
            continue
        path = ("partition", t.group, t.name) if t.dims and not isinstance(job.partition, str) else ("data", t.group, t.name)
        problems.append(loaded.problem(
            path, "layout-padding-waste",
            f"each core's piece of '{t.name}' {rules.shape_text(t.piece)} takes {t.padding_factor:.0f}x its size in TPU "
            "memory: the two minor dimensions are padded to (8, 128) layout tiles",
            "keep the last dims large (e.g. fold small channel counts into the spatial dims, or partition a major "
            "axis instead)", severity="warning"))
    return problems


def check_static_shapes(loaded: LoadedJob) -> list:
    """XLA compiles static shapes only: every declared dim must be known on a TPU."""
    data = loaded.section("data")
    if data is None or not loaded.usable("data", "tpu"):
        return []
    on_tpu = loaded.section("tpu") is not None
    problems = []
    for group in ("features", "labels"):
        for name, spec in getattr(data, group).items():
            unknown = [i for i, d in enumerate(spec.shape) if d is None]
            if not unknown:
                continue
            path = ("data", group, name, "shape", unknown[0])
            if on_tpu:
                problems.append(loaded.problem(path, "shape-not-static",
                                               f"dimension {unknown[0]} of '{name}' is unknown; XLA on a TPU needs every dimension",
                                               "declare the size (pad or resize the data to it)"))
            elif spec.stored_as not in ("png", "jpeg") and not data.input_fn:
                # tpulaunch's pipeline batches with Dataset.batch, which stops at the first batch of records of
                # different sizes (a job's own input_fn may pad: its output is checked against the declaration).
                problems.append(loaded.problem(path, "shape-not-static",
                                               f"dimension {unknown[0]} of '{name}' is unknown; tpulaunch's input "
                                               "pipeline batches records as they are, and records of different sizes "
                                               "cannot be batched",
                                               "declare the size (pad or resize the data to it), or batch them in "
                                               "your own data.input_fn (e.g. with padded_batch)"))
    return problems


def check_cadence(loaded: LoadedJob) -> list:
    """Steps, loops, checkpoints and eval cadence fit together."""
    tpu, train, ev, run, data = (loaded.section(n) for n in ("tpu", "train", "eval", "run", "data"))
    problems = []
    if train is not None and data is not None and not data.train and not data.input_fn:
        problems.append(loaded.problem(("data",), "train-data-missing", "train: is set but data.train names no files",
                                       "add data.train: gs://bucket/train-*.tfrecord (or a local glob for local runs)"))
    if ev is not None and data is not None and not data.eval and not data.input_fn:
        problems.append(loaded.problem(("eval",), "eval-data-missing", "eval: is set but data.eval names no files",
                                       "add data.eval, or remove the eval: section"))
    if ev is not None and train is not None and ev.every_steps and ev.every_steps >= train.steps:
        problems.append(loaded.problem(("eval", "every_steps"), "eval-after-training",
                                       f"every_steps {ev.every_steps} >= train.steps {train.steps}: evaluation runs only at the end",
                                       "lower every_steps, or leave it out to evaluate once at the end", severity="warning"))
    if tpu is None or not loaded.engine_about.on_tpu.loops:
        return problems
    loop = tpu.iterations_per_loop
    if train is not None and loop > train.steps:
        problems.append(loaded.problem(("tpu", "iterations_per_loop"), "loop-longer-than-training",
                                       f"iterations_per_loop {loop} > train.steps {train.steps}: the whole run is one TPU loop with no progress until it ends",
                                       f"set iterations_per_loop to at most {train.steps}", severity="warning"))
    if run is not None and run.save_checkpoints_steps % loop:
        effective = -(-run.save_checkpoints_steps // loop) * loop
        problems.append(loaded.problem(("run", "save_checkpoints_steps"), "checkpoint-between-loops",
                                       f"{run.save_checkpoints_steps} is not a multiple of iterations_per_loop {loop}: "
                                       f"a TPU checkpoints only between loops, so every {effective} steps",
                                       f"use a multiple of {loop}", severity="warning"))
    if ev is not None and ev.every_steps and ev.every_steps % loop:
        problems.append(loaded.problem(("eval", "every_steps"), "eval-between-loops",
                                       f"{ev.every_steps} is not a multiple of iterations_per_loop {loop}",
                                       f"use a multiple of {loop}: evaluation can start only between loops", severity="warning"))
    return problems


def check_fallback(loaded: LoadedJob) -> list:
    """tpu.zones (`tpulaunch run`'s capacity fallback) stay near the data. (A job whose tpu.name is 'local', as
    `run` trains it on the TPU VM, keeps its zones: they say where the VM was made.)"""
    tpu = loaded.section("tpu")
    if tpu is None or not tpu.zones:
        return []
    problems = []
    regions = sorted({zone.rsplit("-", 1)[0] for zone in tpu.zones or []})
    if len(regions) > 1:
        problems.append(loaded.problem(("tpu", "zones"), "zones-across-regions",
                                       f"tpu.zones spans regions {', '.join(regions)}: the TPU reads data and "
                                       "run.model_dir from the bucket's region, so a TPU in another region pays for "
                                       "every byte it reads and reads it slower",
                                       "keep tpu.zones in the bucket's region, or use a multi-region bucket",
                                       severity="warning"))
    return problems


STATIC_RULES = (check_slice, check_batches, check_partition, check_static_shapes, check_cadence, check_fallback)


def static_problems(loaded: LoadedJob) -> list:
    """Every rule that needs neither TensorFlow nor the network."""
    from tpulaunch.checks.heads import head_problems
    from tpulaunch.checks.paths import path_form_problems, python_path_problems

    from tpulaunch.checks.engine_rules import engine_problems
    from tpulaunch.checks.fits import fit_problems
    from tpulaunch.checks.stack import stack_problems

    problems = []
    for rule in STATIC_RULES:
        problems.extend(rule(loaded))
    problems.extend(engine_problems(loaded))
    problems.extend(fit_problems(loaded))
    if loaded.usable("tpu", "gke", "run"):
        from tpulaunch.checks.gke import gke_problems

        problems.extend(gke_problems(loaded))
    if loaded.usable("tpu", "run"):
        problems.extend(stack_problems(loaded))
    problems.extend(head_problems(loaded))
    if loaded.usable("data", "tpu", "run"):
        problems.extend(path_form_problems(loaded))
    problems.extend(python_path_problems(loaded))
    return problems
