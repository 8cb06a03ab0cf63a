"""Render problems for people (text), for tools (json) and for GitHub Actions (annotations)."""

from __future__ import annotations

import json
import os
from typing import Iterable, Optional, Sequence

from rich.console import Console
from rich.markup import escape

from tpulaunch.errors import Problem
from tpulaunch.job.yamlfile import DOCUMENT_PATH

FORMATS = ("text", "json", "github")


def _source_line(file: str, line: int, cache: dict) -> Optional[str]:
    if file not in cache:
        try:
            with open(file, encoding="utf-8", errors="replace") as handle:
                cache[file] = handle.read().splitlines()
        except OSError:
            cache[file] = []
    lines = cache[file]
    return lines[line - 1] if 0 < line <= len(lines) else None


def problem_line(p: Problem) -> str:
    """`FILE:LINE:COL: path: message`, with `warning:` before the message for warnings."""
    where = f"{p.file}:{p.line}:{p.column}"
    level = "" if p.is_error else ("note: " if p.severity == "info" else "warning: ")
    path = f"{p.path}: " if p.path and p.path != DOCUMENT_PATH else ""  # FILE:LINE:COL already names the file
    return f"{where}: {path}{level}{p.message}"


def render_text(console: Console, problems: Sequence[Problem], *, file: str, checked: Iterable[str] = (),
                snippets: bool = True, summary: bool = True) -> None:
    cache: dict = {}
    for p in problems:
        style = "bold red" if p.is_error else "yellow"
        console.print(f"[{style}]{escape(problem_line(p))}[/] [dim]\\[{p.code}][/]", highlight=False, soft_wrap=True)
        if snippets:
            source = _source_line(p.file, p.line, cache) if os.path.isfile(p.file) else None
            if source is not None and source.strip():
                console.print(f"  {p.line:>4} | {escape(source)}", highlight=False, soft_wrap=True)
                console.print(f"       | {' ' * (p.column - 1)}[{style}]^[/]", highlight=False)
        if p.hint:
            console.print(f"    [cyan]hint:[/] {escape(p.hint)}", highlight=False, soft_wrap=True)
    if not summary:
        return
    errors = sum(p.is_error for p in problems)
    warnings = sum(1 for p in problems if p.severity == "warning")
    what = f" (checked: {', '.join(checked)})" if checked else ""
    if errors:
        console.print(f"[bold red]{_count(errors, 'error')}[/], {_count(warnings, 'warning')} in {escape(file)}{what}",
                      highlight=False)
    else:
        tail = f", {_count(warnings, 'warning')}" if warnings else ""
        console.print(f"[bold green]OK[/] {escape(file)}{tail}{what}", highlight=False)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def to_json(problems: Sequence[Problem], *, file: str, extra: Optional[dict] = None) -> str:
    doc = {"ok": not any(p.is_error for p in problems), "file": file, "problems": [p.to_dict() for p in problems]}
    if extra:
        doc.update(extra)
    return json.dumps(doc, indent=2)


def _gh_escape(text: str, *, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def to_github(problems: Sequence[Problem]) -> str:
    """GitHub Actions workflow commands: one `::error`/`::warning` annotation per problem."""
    lines = []
    for p in problems:
        level = "error" if p.is_error else ("notice" if p.severity == "info" else "warning")
        message = f"{p.path}: {p.message}" if p.path and p.path != DOCUMENT_PATH else p.message
        if p.hint:
            message += f"\nhint: {p.hint}"
        lines.append(
            f"::{level} file={_gh_escape(p.file, prop=True)},line={p.line},col={p.column},"
            f"title={_gh_escape('tpulaunch ' + p.code, prop=True)}::{_gh_escape(message)}"
        )
    return "\n".join(lines)
