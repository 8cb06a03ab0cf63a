"""Render problems for people (text), for tools (json) and for GitHub Actions (annotations).

Text goes to a rich console on a terminal. Into a pipe or a file (CI logs, editors, pre-commit) rich
adds nothing (no colour, no cursor), so those lines are written by `PlainText` without importing rich:
rich is a good part of what `validate --static` costs. Each line is built once, as styled pieces,
and both writers print the same characters.
"""

from __future__ import annotations

import builtins
import os
import re
import sys
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional, Sequence, Union

from tpulaunch.errors import DOCUMENT_PATH, Problem

if TYPE_CHECKING:
    from rich.console import Console

FORMATS = ("text", "json", "github")

# Width of output that goes to a file or a CI log (rich would assume 80 columns and cut tensor names).
PIPE_WIDTH = 120

Piece = Union[str, tuple]  # plain text, or (text, rich style)


class PlainText:
    """One output stream that rich would write as plain text, written here without rich.

    A line comes out as rich's console prints it there: as is (soft_wrap), or wrapped at the width as
    rich wraps. A line with anything rich would change (tabs, control or non-ASCII characters) is
    handed to the rich console.
    """

    def __init__(self, stderr: bool, width: int, console: Callable[[], "Console"]):
        self.stderr = stderr
        self.width = width
        self._console = console

    def line(self, pieces: Sequence[Piece], *, soft_wrap: bool = True) -> None:
        text = "".join(p if isinstance(p, str) else p[0] for p in pieces)
        if not (text.isascii() and text.isprintable()):
            write_line(self._console(), pieces, soft_wrap=soft_wrap)
            return
        lines = [text] if soft_wrap or len(text) <= self.width else wrapped(text, self.width)
        stream = sys.stderr if self.stderr else sys.stdout
        stream.write("\n".join(lines) + "\n")
        stream.flush()


_WORD = re.compile(r"\s*\S+\s*")  # a word and the blanks around it, as rich's wrap splits text


def wrapped(text: str, width: int) -> list:
    """Printable ASCII `text` cut into lines as rich's `Text.wrap` cuts it with its defaults: words
    fill a line greedily, a word wider than a line is folded, then each line loses the blanks past
    the width and is cropped to it. (tests/core/cli/test_cli_fast_path.py holds this to rich's own output.)"""
    breaks: list = []
    used = 0
    for word in _WORD.finditer(text):
        start, chars = word.start(), word.group()
        size = len(chars.rstrip())
        if width - used >= size:
            used += len(chars)
        elif size > width:
            chunks = [chars[i:i + width] for i in range(0, len(chars), width)]
            for chunk in chunks[:-1]:
                if start:
                    breaks.append(start)
                start += len(chunk)
            if start:
                breaks.append(start)
            used = len(chunks[-1])
        elif used and start:
            breaks.append(start)
            used = len(chars)
    lines = []
    for begin, end in zip([0, *breaks], [*breaks, len(text)]):
        line = text[begin:end]
        if len(line) > width:
            line = line[:len(line) - min(len(line) - len(line.rstrip()), len(line) - width)]
        lines.append(line[:width])
    return lines


def plain_text(stderr: bool, console: Callable[[], "Console"]) -> Optional[PlainText]:
    """A PlainText for stdout (or stderr) when rich would write it without colour, else None.

    Mirrors rich's `Console.is_terminal` and the width `cli.base.console` gives a console that is not
    a terminal; anything unusual (FORCE_COLOR, Jupyter, Windows, a COLUMNS that is not a number)
    keeps the rich console.
    """
    stream = sys.stderr if stderr else sys.stdout
    if os.name == "nt" or "get_ipython" in vars(builtins) or hasattr(stream, "rich_proxied_file"):
        return None
    if os.environ.get("FORCE_COLOR") or os.environ.get("TTY_COMPATIBLE") == "1":
        return None
    try:
        if stream is None or stream.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    columns = os.environ.get("COLUMNS")
    if not columns:
        return PlainText(stderr, PIPE_WIDTH, console)
    if columns.isdigit() and int(columns) > 0:
        return PlainText(stderr, int(columns), console)
    return None


def write_line(out: Union["Console", PlainText], pieces: Sequence[Piece], *, soft_wrap: bool = True) -> None:
    """One line of styled pieces to a rich console or a PlainText."""
    if isinstance(out, PlainText):
        out.line(pieces, soft_wrap=soft_wrap)
        return
    from rich.text import Text

    out.print(Text.assemble(*pieces), highlight=False, soft_wrap=soft_wrap)


def _source_line(file: str, line: int, cache: dict) -> Optional[str]:
    if file not in cache:
        try:
            with open(file, encoding="utf-8", errors="replace") as handle:
                cache[file] = handle.read().splitlines()
        except OSError:
            cache[file] = []
    lines = cache[file]
    return lines[line - 1] if 0 < line <= len(lines) else None


SNIPPET_WIDTH = 100  # at most this much of a source line is echoed (a generated line may be megabytes); with
# its "..." and the "  NNNN | " margin, the line and its caret stay within PIPE_WIDTH
_CUT = "..."


def around_column(source: str, column: int, width: int = SNIPPET_WIDTH) -> tuple:
    """(the part of `source` shown, the caret's column in it): the line as is when it fits `width`, else a
    window of `width` characters around `column`, "..." marking each side cut off."""
    if len(source) <= width:
        return source, column
    start = max(0, min(column - 1 - width // 2, len(source) - width))
    end = start + width
    shown = source[start:end]
    caret = column - start
    if start > 0:
        shown, caret = _CUT + shown, caret + len(_CUT)
    if end < len(source):
        shown += _CUT
    return shown, caret


def problem_line(p: Problem) -> str:
    """`FILE:LINE:COL: path: message`, with `warning:` before the message for warnings."""
    where = f"{p.file}:{p.line}:{p.column}"
    level = "" if p.is_error else ("note: " if p.severity == "info" else "warning: ")
    path = f"{p.path}: " if p.path and p.path != DOCUMENT_PATH else ""  # FILE:LINE:COL already names the file
    return f"{where}: {path}{level}{p.message}"


def report_lines(problems: Sequence[Problem], *, file: str, checked: Iterable[str] = (),
                 snippets: bool = True) -> Iterator[tuple]:
    """The text report, one (pieces, soft_wrap) per line: each problem with its source line, a caret
    under the column and its hint, then the count."""
    cache: dict = {}
    for p in problems:
        style = "bold red" if p.is_error else "yellow"
        yield [(problem_line(p), style), " ", (f"[{p.code}]", "dim")], True
        if snippets:
            source = _source_line(p.file, p.line, cache) if os.path.isfile(p.file) else None
            if source is not None and source.strip():
                shown, column = around_column(source, p.column)
                yield [f"  {p.line:>4} | {shown}"], True
                yield [f"       | {' ' * (column - 1)}", ("^", style)], False
        if p.hint:
            yield ["    ", ("hint:", "cyan"), f" {p.hint}"], True
    errors = sum(p.is_error for p in problems)
    warnings = sum(1 for p in problems if p.severity == "warning")
    what = f" (checked: {', '.join(checked)})" if checked else ""
    if errors:
        yield [(_count(errors, "error"), "bold red"), f", {_count(warnings, 'warning')} in {file}{what}"], False
    else:
        tail = f", {_count(warnings, 'warning')}" if warnings else ""
        yield [("OK", "bold green"), f" {file}{tail}{what}"], False


def render_text(out: Union["Console", PlainText], problems: Sequence[Problem], *, file: str,
                checked: Iterable[str] = (), snippets: bool = True) -> None:
    for pieces, soft_wrap in report_lines(problems, file=file, checked=checked, snippets=snippets):
        write_line(out, pieces, soft_wrap=soft_wrap)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def to_json(problems: Sequence[Problem], *, file: str, extra: Optional[dict] = None) -> str:
    import json

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
