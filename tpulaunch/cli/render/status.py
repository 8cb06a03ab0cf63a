"""What `tpulaunch status` shows, as text: the node as a table with its findings (on several slices, one row per
slice's node), then one line each for model_dir's lease, its last run and its remote run (the data is
`app/status.py`'s)."""

from __future__ import annotations


def render_status(console, node) -> None:
    """A table of the node, then each finding with its hint."""
    from rich.markup import escape
    from rich.table import Table

    def mark(ok: bool, text: str) -> str:
        return f"[green]{escape(text)}[/]" if ok else f"[bold red]{escape(text)}[/]"

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("TPU", escape(node.name))
    if node.zone or node.project:
        table.add_row("zone / project", escape(f"{node.zone} / {node.project}"))
    if node.state is not None:
        table.add_row("state", mark(node.state == "READY", node.state))
        table.add_row("health", mark(node.health == "HEALTHY", node.health or "not reported"))
    type_text = node.accelerator_type or "unknown"
    if node.expected_type:
        same = node.accelerator_type in (None, node.expected_type)
        type_text = mark(same, type_text) + escape(f" (job: {node.expected_type})")
    else:
        type_text = escape(type_text)
    table.add_row("type", type_text)
    table.add_row("devices / hosts", escape(f"{node.devices if node.devices is not None else '?'} / {node.hosts}"))
    versions = f"{node.runtime_version or 'unknown'} (installed TensorFlow: {node.installed_tf or 'none'})"
    table.add_row("runtime", escape(versions))
    table.add_row("endpoints", escape(", ".join(node.endpoints) or "none"))
    if node.waited_s >= 1:
        table.add_row("waited", f"{node.waited_s:.0f}s")
    console.print(table)
    _render_findings(console, node.findings)
    console.print(f"TPU node {escape(node.name)}: {_verdict(node.usable)}", highlight=False)


def render_slices(console, name: str, nodes: list) -> None:
    """The queued resource `name` of several slices: one row per slice's node (state, health, type, hosts,
    runtime), then each node's findings with their hints."""
    from rich.markup import escape
    from rich.table import Table

    first = nodes[0]
    console.print(escape(f"TPU: queued resource {name} of {len(nodes)} slices in {first.zone} / {first.project}"),
                  highlight=False, soft_wrap=True)
    table = Table(box=None, pad_edge=False)
    for column in ("slice", "node", "state", "health", "type", "hosts", "runtime"):
        table.add_column(column, style="bold" if column == "slice" else None)
    for index, node in enumerate(nodes):
        ready, healthy = node.state == "READY", node.health == "HEALTHY"
        table.add_row(str(index), escape(node.name),
                      f"[green]{escape(node.state)}[/]" if ready else f"[bold red]{escape(str(node.state))}[/]",
                      f"[green]{escape(node.health)}[/]" if healthy else
                      f"[bold red]{escape(node.health or ('-' if node.state == 'NOT_FOUND' else 'not reported'))}[/]",
                      escape(node.accelerator_type or "unknown"), str(node.hosts),
                      escape(node.runtime_version or "unknown"))
    console.print(table)
    if first.expected_type:
        console.print(escape(f"job: {first.expected_type} × {len(nodes)} (installed TensorFlow: "
                             f"{first.installed_tf or 'none'})"), highlight=False)
    _render_findings(console, [finding for node in nodes for finding in node.findings])
    usable = all(node.usable for node in nodes)
    console.print(f"queued resource {escape(name)} ({len(nodes)} slices): {_verdict(usable)}", highlight=False)


def _render_findings(console, findings: list) -> None:
    from rich.markup import escape

    for finding in findings:
        colour = "bold red" if finding.severity == "error" else "yellow"
        console.print(f"[{colour}]{finding.severity}:[/] {escape(finding.message)}", highlight=False, soft_wrap=True)
        if finding.hint:
            console.print(f"  [cyan]hint:[/] {escape(finding.hint)}", highlight=False, soft_wrap=True)


def _verdict(usable: bool) -> str:
    return "[green]usable[/]" if usable else "[bold red]not usable[/]"


def render_lease(console, lease: dict) -> None:
    where = f" ({lease['model_dir']})" if lease["model_dir"] else ""
    console.print(f"model_dir lease{where}: {lease['text']}", highlight=False, markup=False, soft_wrap=True)


def render_last_run(console, last_run: dict) -> None:
    console.print(f"last run: {last_run['text']}", highlight=False, markup=False, soft_wrap=True)


def render_remote_run(console, remote_run: dict) -> None:
    console.print(f"remote run: {remote_run['text']}", highlight=False, markup=False, soft_wrap=True)
