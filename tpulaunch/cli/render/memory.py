"""Rich rendering of `tpulaunch plan`'s memory section (a `MemoryPlan.to_dict()`)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

VERDICT_TEXT = {
    "fits": "[green]fits[/]",
    "may-fit": "[yellow]may fit only with rematerialisation (slower)[/]",
    "does-not-fit": "[red]does not fit[/]",
}

_ROWS = (("weights", "weights (float32)"), ("gradients", "gradients"), ("optimizer", "optimizer slots"),
         ("bf16_weights", "bfloat16 weight copy"), ("activations", "activations kept for backward"),
         ("padding", "layout padding (8, 128)"))


def _gib(n) -> str:
    from tpulaunch.cli.render.units import human_bytes

    return human_bytes(n)


def _shape(values) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def render_memory(console: Console, memory: dict) -> None:
    """The per-core memory table, verdict and recommendation."""
    if memory.get("per_core_bytes") is None:
        console.print(f"memory: unknown ({escape(memory.get('reason') or 'no estimate')})", highlight=False)
        return
    tile = memory.get("tile") or []
    where = "per core" if memory.get("usable_bytes") else "per device (as a TPU core would need)"
    console.print(f"[bold]memory {where}[/]: {escape(str(memory.get('feature')))} tile {_shape(tile)}, "
                  f"{memory.get('precision')} ({escape(str(memory.get('method')))})", highlight=False)
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("part")
    table.add_column("bytes", justify="right")
    for key, label in _ROWS:
        value = memory["breakdown"].get(key)
        if value:
            if key == "optimizer":
                counted = memory.get("optimizer_source") in (None, "counted")
                label += f" ({memory.get('optimizer_slots')} per weight{'' if counted else ', assumed'})"
            table.add_row(label, _gib(value))
    table.add_row("[bold]total[/]", f"[bold]{_gib(memory['per_core_bytes'])}[/]")
    if memory.get("usable_bytes"):
        table.add_row("usable HBM per device", _gib(memory["usable_bytes"]))
    table.add_row("lower bound (rematerialised)", _gib(memory.get("lower_bound_bytes")))
    console.print(table)
    if memory["verdict"] in VERDICT_TEXT:
        by = " (XLA's TPU compiler)" if memory.get("answered_by") == "xla" else ""
        said = VERDICT_TEXT[memory["verdict"]]
        if by and memory["verdict"] == "may-fit":  # XLA compiled it, above its own usable line
            said = "[yellow]compiled, but above the usable HBM line[/]"
        console.print(f"memory: {said}{by}", highlight=False)
    else:
        console.print(f"memory: unknown ({escape(memory.get('reason') or '')})", highlight=False)
    from tpulaunch.plan.xla_words import lines as xla_lines

    for line in xla_lines(memory):
        console.print(f"    {escape(line)}", highlight=False, soft_wrap=True)
    if memory.get("optimizer_source") not in (None, "counted"):
        console.print(f"    optimizer slots {escape(memory['optimizer_source'])}", highlight=False, soft_wrap=True)
    if memory.get("auto_partition"):
        console.print("    partition: auto chose the dims shown above", highlight=False)
    rec = memory.get("recommendation")
    if rec and rec.get("source") == "xla":  # XLA's compiled batch: its words are in the lines above
        pass
    elif rec:
        whose = "the estimate's recommendation" if memory.get("answered_by") == "xla" else "recommendation"
        console.print(f"    [cyan]{whose}:[/] {escape(recommendation_text(rec))}", highlight=False, soft_wrap=True)
    xla = memory.get("xla")
    if xla:
        if "error" in xla:
            console.print(f"    [yellow]XLA cross-check failed:[/] {escape(xla['error'])}", highlight=False, soft_wrap=True)
        else:
            console.print(f"    XLA (CPU, float32, no TPU tiling) buffer assignment for one step at {_shape(xla['input_shape'])}: "
                          f"{_gib(xla['total_bytes'])} ({xla['seconds']} s); a cross-check, not a TPU figure",
                          highlight=False, soft_wrap=True)


def recommendation_text(rec: dict) -> str:
    """One sentence for a recommendation dict of `tpulaunch.plan.memory.plan_memory`."""
    if rec.get("action") == "partition":
        dims = ", ".join(f"{name}: {dims}" for name, dims in rec["dims"].items())
        cost = rec["cost"]
        return (f"tpu.cores_per_replica: {rec['cores_per_replica']} with partition {dims} "
                f"(~{_gib(rec['per_core_bytes'])} per core; per-replica batch {rec['per_replica_batch']}, "
                f"global batch {rec['global_batch']}); spatial partitioning runs at ~{cost['efficiency']:.0%} efficiency, "
                f"~{cost['core_time_per_example']}x the core time per example")
    if rec.get("action") == "reduce-batch":
        text = (f"reduce the batch: up to {rec['per_replica_batch']} examples per replica fit "
                f"(train.batch_size: {rec['global_batch']}, ~{_gib(rec['per_core_bytes'])} per core)")
        if rec.get("alternative"):
            text += "; or keep the batch with " + recommendation_text(rec["alternative"])
        return text
    if rec.get("action") == "batch":
        return (f"large headroom: up to {rec['per_replica_batch']} examples per replica fit "
                f"(train.batch_size: {rec['global_batch']}, ~{_gib(rec['per_core_bytes'])} per core)")
    return rec.get("reason", "")
