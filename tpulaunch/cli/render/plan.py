"""Rich rendering of a Plan, a data dry-run report and TensorFlow's own build report."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tpulaunch.plan.partition import shape_text
from tpulaunch.plan.build import Plan
from tpulaunch.cli.render.problems import problem_line
from tpulaunch.cli.render.units import human_bytes


def render_plan(console: Console, plan: Plan) -> None:
    from tpulaunch.seam.registry import about

    engine = about(plan.engine)
    console.print(f"[bold]{escape(plan.job)}[/]", highlight=False)
    text = engine.local_title if plan.slice is None else engine.title
    console.print(f"engine: {plan.engine}: {text}", highlight=False)
    s = plan.slice
    if s is None and plan.local_devices is not None:  # an engine that splits each batch over this machine's devices
        console.print(f"runs locally (no tpu: section): {plan.local_devices.describe()}", highlight=False)
    elif s is None and plan.cores_per_replica > 1:  # an engine that splits partition: over this machine's devices
        console.print(f"runs locally (no tpu: section): replicas of {plan.cores_per_replica} devices each, split as "
                      "partition: says, as many as this machine's devices hold (below: the global batch, before the "
                      "replicas split it)", highlight=False)
    elif s is None:
        console.print("runs locally (no tpu: section): CPU/GPU, one replica, no partitioning", highlight=False)
    elif plan.device_assignment is not None:
        k = plan.device_assignment
        console.print(
            f"slice: {s.tpu_type}: {s.devices} TPU devices ({s.chips} chips) on {s.hosts} host(s), {s.devices_per_host} "
            f"per host; mesh {shape_text(k.topology_shape)}; usable HBM {human_bytes(s.usable_bytes_per_device)} per device",
            highlight=False, soft_wrap=False)
        console.print(
            f"replicas: {k.replicas} x {k.logical_devices} logical device(s), computation shape "
            f"{shape_text(k.computation_shape)}; {k.input_pipelines} input pipeline(s) (hosts), "
            f"{k.replicas_per_pipeline} replica(s) each",
            highlight=False, soft_wrap=False)
    else:
        # One line, readable at any terminal width.
        replicas_per_host = (str(s.replicas_per_host) if s.replicas_per_host
                             else f"<1 (a replica spans {s.cores_per_replica // max(1, s.devices_per_host)} hosts)")
        console.print(
            f"slice: {s.tpu_type}: {s.devices} TPU devices ({s.chips} chips) on {s.hosts} host(s), {s.devices_per_host} per host; "
            f"{s.replicas} replica(s) of {s.cores_per_replica} core(s), {replicas_per_host} per host; "
            f"input_fn runs {s.input_fn_calls_per_host}x per feeding host; "
            f"usable HBM {human_bytes(s.usable_bytes_per_device)} per device",
            highlight=False, soft_wrap=False)
    if plan.batches:
        table = Table(title="batch", box=box.SIMPLE_HEAD, title_justify="left")
        columns = ("split", "global", "per replica", "per host", "params['batch_size']")
        if engine.layout.batches_per_replica:  # the dataset_fn batches per replica (InputContext.get_per_replica_batch_size)
            columns = ("split", "global", "per replica", "per input pipeline", "dataset batch")
        for col in columns:
            table.add_column(col, justify="right")
        for b in plan.batches:
            table.add_row(b.split, str(b.global_batch), str(b.per_replica), str(b.per_host), str(b.params_batch_size))
        console.print(table)
    if plan.tensors:
        table = Table(title="inputs, per replica -> per core", box=box.SIMPLE_HEAD, title_justify="left")
        for col, just in (("tensor", "left"), ("shape", "left"), ("dims", "left"), ("per-core piece", "left"),
                          ("even", "center"), ("piece", "right"), ("padded (8,128)", "right")):
            table.add_column(col, justify=just)
        for t in plan.tensors:
            dims = shape_text(t.dims) if t.dims else "replicated"
            if t.sharding == "core0":
                dims += " (core 0 only)"
            piece = shape_text(t.piece) if t.sharding == "tiled" else ("whole, on every core" if t.sharding == "replicated" else "whole, core 0")
            table.add_row(f"{t.group}.{t.name}", shape_text(t.shape), dims, piece, "yes" if t.even else "[yellow]no[/]",
                          human_bytes(t.piece_bytes), human_bytes(t.piece_bytes_padded))
        console.print(table)
    if plan.auto_partition and plan.feed_partition is not None:
        chosen = ", ".join(f"{group}.{name}: {shape_text(dims) if dims else 'replicated'}"
                           for group in ("features", "labels")
                           for name, dims in getattr(plan.feed_partition, group).items())
        console.print(f"partition: auto chose {escape(chosen)}", highlight=False)
    if plan.memory is not None:
        from tpulaunch.cli.render.memory import render_memory

        render_memory(console, plan.memory)
    for w in plan.warnings:
        console.print(f"[yellow]{escape(problem_line(w))}[/]", highlight=False, soft_wrap=True)
        if w.hint:
            console.print(f"    [cyan]hint:[/] {escape(w.hint)}", highlight=False, soft_wrap=True)


def render_data_report(console: Console, report) -> None:
    r = report if isinstance(report, dict) else report.__dict__
    parts = [f"{r.get('files', 0)} files"]
    if r.get("records_counted") is not None:
        parts.append(f"{r['records_counted']} records")
    elif r.get("records_estimated") is not None:
        parts.append(f"~{r['records_estimated']} records (estimated)")
    if r.get("steps_per_epoch") is not None:
        parts.append(f"{r['steps_per_epoch']} steps/epoch")
    console.print(f"data.{r.get('split')}: " + ", ".join(parts), highlight=False)


def render_tf_built(console: Console, built: dict) -> None:
    """What TensorFlow's own TPUEstimator built for the declared slice (validate --tf)."""
    for mode, info in built.items():
        verdict = "[green]accepted[/]" if info.get("accepted") else "[red]rejected[/]"
        if info.get("device_assignment"):
            console.print(f"TensorFlow {mode}: {verdict}  DeviceAssignment: {info.get('replicas')} replica(s) x "
                          f"{info.get('logical_devices')} logical device(s), computation shape "
                          f"{shape_text(info.get('computation_shape') or [])}, {info.get('core_coordinates', '?')} TPU "
                          f"devices, {info.get('input_pipelines', '?')} input pipeline(s); per-replica batch "
                          f"{info.get('per_replica_batch')}", highlight=False)
            _render_pieces(console, info)
            continue
        console.print(f"TensorFlow {mode}: {verdict}  replicas={info.get('replicas')} "
                      f"params['batch_size']={info.get('params_batch_size')} input_fn calls={info.get('input_fn_calls')}"
                      + ("  (model: a stand-in; the job's builder could not be built at the declared shapes)"
                         if info.get("model") == "stand-in" else ""),
                      highlight=False)
        _render_pieces(console, info)


def _render_pieces(console: Console, info: dict) -> None:
    pieces = info.get("piece_shapes") or {}
    if pieces:
        table = Table(box=box.SIMPLE_HEAD)
        table.add_column("tensor")
        table.add_column("sharding")
        table.add_column("pieces per core")
        for name, shapes in pieces.items():
            table.add_row(name, info.get("sharding", {}).get(name, "?"), _grouped_shapes(shapes))
        console.print(table)


def _grouped_shapes(shapes) -> str:
    """'16 x [1, 64, 128, 128, 1]' for identical pieces; runs of equal shapes grouped, in core order."""
    runs = []
    for shape in shapes:
        if runs and runs[-1][0] == list(shape):
            runs[-1][1] += 1
        else:
            runs.append([list(shape), 1])
    return ", ".join(shape_text(shape) if n == 1 else f"{n} x {shape_text(shape)}" for shape, n in runs)
