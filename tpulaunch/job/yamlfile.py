"""YAML loading that keeps a line/column mark for every node.

PyYAML's safe constructor builds plain Python data but forgets where each value came from. Here the
node tree from the safe composer is walked by hand: every mapping key and value gets a mark under its
path (a tuple of keys and list indices), duplicate keys are reported instead of silently winning, and
`${VAR}` / `${VAR:-default}` in plain scalars is filled from the environment before the scalar's type
is resolved (so `steps: ${STEPS}` gives an int). Only the safe tags are ever constructed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import yaml

from tpulaunch.errors import DOCUMENT_PATH, JobFileError, Problem

Path = tuple  # of str keys and int list indices

MAX_FILE_BYTES = 5 * 1024 * 1024  # a job file is a few KiB; anything this big is a mistake
MAX_DEPTH = 64
MAX_NODES = 200_000  # aliases can make a tiny file expand exponentially ("billion laughs")

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_SECRET_NAME = re.compile(r"(secret|token|password|passwd|key|credential)", re.IGNORECASE)


@dataclass(frozen=True)
class Mark:
    line: int  # 1-based
    column: int  # 1-based


@dataclass
class Marks:
    """Where each path of the document sits in its source."""

    file: str
    keys: dict = field(default_factory=dict)  # path -> Mark of the mapping key
    values: dict = field(default_factory=dict)  # path -> Mark of the value node
    sources: dict = field(default_factory=dict)  # path -> file label, when it differs from `file`
    env_refs: dict = field(default_factory=dict)  # path -> names of environment variables used
    env_texts: dict = field(default_factory=dict)  # path -> the scalar's text before its ${VAR}s were filled
    env_values: dict = field(default_factory=dict)  # path -> the texts its ${VAR}s were filled with

    def locate(self, path: Path, *, at_key: bool = False) -> tuple[str, Mark]:
        """The best mark for a path: the path itself, else its nearest ancestor."""
        path = tuple(path)
        while True:
            table = (self.keys, self.values) if at_key else (self.values, self.keys)
            for marks in table:
                if path in marks:
                    return self.sources.get(path, self.file), marks[path]
            if not path:
                return self.file, Mark(1, 1)
            path = path[:-1]


def _mark(node_mark) -> Mark:
    return Mark(node_mark.line + 1, node_mark.column + 1)


def dotted(path: Path) -> str:
    """('partition', 'features', 'image') -> 'partition.features.image'; list indices as [i].

    The empty path (the document itself) is DOCUMENT_PATH, so every problem names a path.
    """
    if not path:
        return DOCUMENT_PATH
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + (str(part) or '""')  # an empty key stays visible
    return out


SECRET_MASK = "***"
"""What a secret (`job/secrets.py`) is shown as, in every output and in the job copy."""


def looks_secret(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


_PLAIN_COLLECTION_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")


class _TooBig(Exception):
    def __init__(self, mark: "Mark"):
        self.mark = mark


class _Loader(yaml.SafeLoader):
    """SafeLoader whose constructors we call per scalar; composition is PyYAML's own."""


def _syntax_hint(text: str, line: int) -> str:
    lines = text.splitlines()
    source = lines[line - 1] if 0 < line <= len(lines) else ""
    if "\t" in source:
        return "YAML indents with spaces, never tabs"
    if "${" in source and "{" in source.split("${")[0]:
        return "inside {...} a value with ${VAR} must be quoted: key: \"gs://${BUCKET}/path\" (or use block style)"
    return "check the indentation and quoting around this place"


def _problem(file: str, mark: Mark, path: Path, code: str, message: str, hint=None) -> Problem:
    return Problem("error", file, mark.line, mark.column, dotted(path), code, message, hint)


class _Builder:
    def __init__(self, loader: _Loader, file: str, env: Mapping[str, str]):
        self.loader = loader
        self.marks = Marks(file)
        self.env = env
        self.problems: list[Problem] = []
        self.nodes_seen = 0

    def build(self, node, path: Path = (), depth: int = 0) -> Any:
        self.nodes_seen += 1
        if self.nodes_seen > MAX_NODES:
            raise _TooBig(_mark(node.start_mark))
        if depth > MAX_DEPTH:
            self.problems.append(
                _problem(self.marks.file, _mark(node.start_mark), path, "yaml-too-deep",
                         f"nesting deeper than {MAX_DEPTH} levels (or an alias that contains itself)", "a job file is a few levels deep; check the indentation")
            )
            return None
        self.marks.values.setdefault(path, _mark(node.start_mark))
        if not isinstance(node, yaml.ScalarNode) and node.tag not in _PLAIN_COLLECTION_TAGS:
            self.problems.append(
                _problem(self.marks.file, _mark(node.start_mark), path, "yaml-unsupported-tag",
                         f"cannot use the value tagged {node.tag!r}: job files hold plain data only",
                         "remove the tag; tpulaunch never constructs Python objects from YAML"))
            return None
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, depth)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, path + (i,), depth + 1) for i, item in enumerate(node.value)]
        return self._scalar(node, path)

    def _mapping(self, node, path: Path, depth: int) -> dict:
        try:
            self.loader.flatten_mapping(node)  # resolves `<<: *anchor` merge keys the safe way
        except yaml.constructor.ConstructorError:  # `<<:` given something that is not a mapping
            merge = next((k for k, _ in node.value if k.tag == "tag:yaml.org,2002:merge"), node)
            mark = _mark(merge.start_mark)
            self.problems.append(_problem(self.marks.file, mark, path, "yaml-bad-merge",
                                          "a merge key `<<:` must be given a mapping (or a list of mappings)",
                                          "point `<<: *name` at an anchored mapping, e.g. `base: &name {a: 1}`"))
            node.value = [(k, v) for k, v in node.value if k.tag != "tag:yaml.org,2002:merge"]
        out: dict = {}
        first_seen: dict = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                self.problems.append(_problem(self.marks.file, _mark(key_node.start_mark), path, "yaml-complex-key",
                                              "a mapping key must be a plain name", None))
                continue
            key = self._scalar(key_node, path)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                key = str(key)
            if isinstance(key, bool) or key is None:
                # `yes:`/`no:`/`null:` as keys are YAML 1.1 surprises; keep the text the user wrote
                key = key_node.value
            key_mark = _mark(key_node.start_mark)
            child = path + (key,)
            if key in first_seen:
                first = first_seen[key]
                self.problems.append(
                    _problem(self.marks.file, key_mark, child, "duplicate-key",
                             f"'{key}' is defined twice (first at line {first.line}); YAML would silently keep the last one",
                             "remove one of them")
                )
                continue
            first_seen[key] = key_mark
            self.marks.keys[child] = key_mark
            out[key] = self.build(value_node, child, depth + 1)
        return out

    def _scalar(self, node, path: Path) -> Any:
        value = node.value
        if node.tag == "tag:yaml.org,2002:str" and node.style is None and "${" in value:
            value = self._interpolate(value, node, path)
            resolved_tag = self.loader.resolve(yaml.ScalarNode, value, (True, False))
            node = yaml.ScalarNode(resolved_tag, value, node.start_mark, node.end_mark, node.style)
        elif node.style is not None and isinstance(value, str) and "${" in value:
            value = self._interpolate(value, node, path)
            node = yaml.ScalarNode(node.tag, value, node.start_mark, node.end_mark, node.style)
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            mark = _mark(getattr(exc, "problem_mark", None) or node.start_mark)
            self.problems.append(
                _problem(self.marks.file, mark, path, "yaml-unsupported-tag",
                         f"cannot use the value tagged {node.tag!r}: job files hold plain data only",
                         "remove the tag; tpulaunch never constructs Python objects from YAML")
            )
            return None
        except Exception:  # noqa: BLE001 - a safe tag whose text does not fit it (`!!timestamp 12x`, `!!int a`)
            self.problems.append(
                _problem(self.marks.file, _mark(node.start_mark), path, "yaml-bad-tagged-value",
                         f"{value[:60]!r} is not a valid {node.tag.rsplit(':', 1)[-1]}",
                         "remove the tag (plain values are read by their form), or fix the value"))
            return None

    def _interpolate(self, text: str, node, path: Path) -> str:
        self.marks.env_texts[path] = text

        def replace(match: re.Match) -> str:
            name, default = match.group(1), match.group(2)
            self.marks.env_refs.setdefault(path, []).append(name)
            if name in self.env or default is not None:
                filled = self.env[name] if name in self.env else default
                self.marks.env_values.setdefault(path, []).append(filled)
                return filled
            offset = match.start()
            mark = _mark(node.start_mark)
            column = mark.column + offset + (1 if node.style in ("'", '"') else 0)
            self.problems.append(
                _problem(self.marks.file, Mark(mark.line, column), path, "env-var-unset",
                         f"environment variable {name} is not set",
                         f"export {name}=..., or give a default: ${{{name}:-value}}")
            )
            return ""

        return _ENV_REF.sub(replace, text)


def env_parts(text: str) -> list:
    """A scalar's text as it is written, in pieces: plain text (str) and ${VAR} references ((name, default or
    None)), so that a program can fill them when it runs instead of holding their values."""
    parts: list = []
    start = 0
    for match in _ENV_REF.finditer(text):
        if match.start() > start:
            parts.append(text[start:match.start()])
        parts.append((match.group(1), match.group(2)))
        start = match.end()
    if start < len(text):
        parts.append(text[start:])
    return parts


def read_job_text(filename: str) -> str:
    """Read a job file, turning every way reading can fail into a located JobFileError."""
    def fail(code: str, message: str, hint: str) -> JobFileError:
        return JobFileError(message, hint=hint, problems=[Problem("error", filename, 1, 1, DOCUMENT_PATH, code, message, hint)])

    if not os.path.exists(filename):
        raise fail("file-not-found", f"no such file: {filename}", "check the path (relative paths are taken from the current directory)")
    if os.path.isdir(filename):
        raise fail("file-is-directory", f"{filename} is a directory, not a job file", "pass the .yaml file itself")
    try:
        size = os.path.getsize(filename)
        if size > MAX_FILE_BYTES:
            raise fail("file-too-large", f"{filename} is {size / 1e6:.1f} MB; a job file is a few KiB",
                       "is this the data or a log rather than the job file?")
        with open(filename, "rb") as handle:
            raw = handle.read()
    except PermissionError:
        raise fail("file-unreadable", f"permission denied reading {filename}", "check the file's permissions") from None
    except OSError as exc:
        raise fail("file-unreadable", f"cannot read {filename}: {exc.strerror or exc}", "check the path") from None
    if b"\x00" in raw:
        raise fail("file-binary", f"{filename} is a binary file, not YAML", "pass the job's .yaml file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        message = f"byte 0x{raw[exc.start]:02x} is not valid UTF-8"
        raise JobFileError(message, problems=[Problem("error", filename, line, column, DOCUMENT_PATH, "file-not-utf8", message,
                                                      "save the file as UTF-8")]) from None


def _reader_error(text: str, filename: str, exc: "yaml.reader.ReaderError") -> JobFileError:
    """A character YAML does not allow (a control character, say), located at its line and column."""
    position = max(0, min(exc.position, len(text)))
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    character = exc.character if isinstance(exc.character, str) else chr(exc.character)
    message = f"character {character!r} (U+{ord(character):04X}) is not allowed in YAML"
    return JobFileError(message, problems=[Problem("error", filename, line, column, DOCUMENT_PATH, "yaml-syntax", message,
                                                   "remove it (a stray control character from a copy-paste?)")])


def parse_yaml(text: str, filename: str, env: Optional[Mapping[str, str]] = None) -> tuple[Any, Marks, list[Problem]]:
    """Parse YAML text into plain data and marks.

    Returns the data, the marks, and the problems found while building (duplicate keys, unset
    environment variables, unsupported tags). Raises JobFileError when the text is not YAML at all.
    """
    env = os.environ if env is None else env
    try:
        loader = _Loader(text)  # the reader refuses control characters here, before any parsing
    except yaml.reader.ReaderError as exc:
        raise _reader_error(text, filename, exc) from None
    try:
        try:
            node = loader.get_single_node()
        except yaml.reader.ReaderError as exc:
            raise _reader_error(text, filename, exc) from None
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
            reason = (exc.problem or "invalid YAML").strip()
            hint = _syntax_hint(text, line)
            message = f"YAML syntax: {reason}"
            if exc.context:
                message += f" ({exc.context.strip()})"
            raise JobFileError(message, problems=[Problem("error", filename, line, column, DOCUMENT_PATH, "yaml-syntax", message, hint)]) from None
        except yaml.YAMLError as exc:
            message = f"YAML syntax: {exc}"
            raise JobFileError(message, problems=[Problem("error", filename, 1, 1, DOCUMENT_PATH, "yaml-syntax", message, None)]) from None
        except RecursionError:
            message = "YAML nesting is too deep to read"
            raise JobFileError(message, problems=[Problem("error", filename, 1, 1, DOCUMENT_PATH, "yaml-too-deep", message,
                                                          "a job file is a few levels deep")]) from None
        if node is None:
            return None, Marks(filename), []
        builder = _Builder(loader, filename, env)
        try:
            data = builder.build(node)
        except _TooBig as exc:
            message = f"the document expands to more than {MAX_NODES} values (aliases referring to aliases?)"
            raise JobFileError(message, problems=[Problem("error", filename, exc.mark.line, exc.mark.column, DOCUMENT_PATH,
                                                          "yaml-too-large", message, "a job file holds a few dozen values")]) from None
        except RecursionError:
            message = "YAML nesting (or alias expansion) is too deep to read"
            raise JobFileError(message, problems=[Problem("error", filename, 1, 1, DOCUMENT_PATH, "yaml-too-deep", message,
                                                          "a job file is a few levels deep")]) from None
        return data, builder.marks, builder.problems
    finally:
        loader.dispose()


def value_at(data: Any, keys) -> Any:
    """The value under `keys` in a job as plain data (mappings by key, lists by index); None where one is missing."""
    for key in keys:
        if isinstance(data, dict) and key in data:
            data = data[key]
        elif isinstance(data, list) and isinstance(key, int) and -len(data) <= key < len(data):
            data = data[key]
        else:
            return None
    return data
