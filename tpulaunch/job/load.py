"""Read a job file into a validated `Job`, with every problem located in the file.

YAML text -> plain data with marks (`yamlfile`) -> `--set` overrides -> pydantic validation. Schema
errors become `Problem`s at the line and column of the key or value at fault, with a did-you-mean
for misspelled keys and enum values. Sections that validate on their own are kept even when others
fail, so the cross-section checks can still report everything they can.
"""

from __future__ import annotations

import functools
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from tpulaunch.errors import JobFileError, Problem
from tpulaunch.job.schema import SECTIONS, Job, search_path_of
from tpulaunch.job.secrets import NONE, PATH_KEYS, Secrets, free_form, remember, secrets_of, set_text
from tpulaunch.job.yamlfile import (DOCUMENT_PATH, SECRET_MASK, Mark, Marks, dotted, env_parts, parse_yaml,
                                    read_job_text)


@dataclass
class LoadedJob:
    """A job file as far as it could be understood."""

    file: str
    data: Any
    marks: Marks
    job: Optional[Job]  # None when any schema problem was found
    sections: dict = field(default_factory=dict)  # section name -> validated object (or None when absent)
    invalid: set = field(default_factory=set)  # sections that failed validation
    problems: list = field(default_factory=list)
    local: bool = False  # checked for a run on this machine (`--local`): tpu: and partition: do not apply
    secrets: Secrets = NONE  # which of its values are secrets (`job/secrets.py`), read by everything that shows them

    def section(self, name: str):
        """The validated section, or None (absent or invalid: see `usable`; tpu/partition when local, partition kept
        for an engine that splits inputs over this machine's devices)."""
        if self.local and (name == "tpu" or name == "partition" and not self.engine_about.layout.partition_on_devices):
            return None
        return self.sections.get(name)

    @property
    def search_path(self) -> list:
        """Where the job's import paths are looked up before PYTHONPATH: the job file's directory, then
        python_path (even when another section of the job is invalid)."""
        return search_path_of(os.path.dirname(os.path.abspath(self.file)), self.section("python_path") or [])

    def usable(self, *names: str) -> bool:
        return not any(n in self.invalid for n in names)

    @functools.cached_property
    def engine(self) -> str:
        """The engine that runs this job, worked out once (read when loading is done): `run.engine`, else the one
        this machine's framework runs; a `run:` section with a mistake elsewhere still names it (as written)."""
        from tpulaunch.seam import registry

        run = self.section("run")
        if run is None and isinstance(self.data, dict) and isinstance(self.data.get("run"), dict):
            written = self.data["run"].get("engine")
            if written in registry.names():
                return written
        return registry.engine_name(run)

    @property
    def engine_about(self):
        """What the job's engine is and can do (`seam.about.EngineAbout`): every rule asks it."""
        from tpulaunch.seam import registry

        return registry.about(self.engine)

    def problem(self, path: Sequence, code: str, message: str, hint: Optional[str] = None, *,
                severity: str = "error", at_key: bool = False) -> Problem:
        """A problem located at `path` of this job file (or where a --set put it)."""
        file, mark = self.marks.locate(tuple(path), at_key=at_key)
        return Problem(severity, file, mark.line, mark.column, dotted(tuple(path)), code, message, hint)


# ----------------------------------------------------------------------------------------- overrides

@dataclass(frozen=True)
class Override:
    text: str
    path: tuple
    value: Any


def parse_override(text: str, index: int) -> Override:
    """'train.steps=20' -> Override(path=('train','steps'), value=20). The value is read as YAML."""
    where = f"--set #{index}"
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise _override_error(where, index, key, "override-form", f"--set {set_text(text)!r} is not of the form key.path=value",
                              "e.g. --set train.steps=20")
    parts = key.split(".")
    if any(not p for p in parts):
        raise _override_error(where, index, key, "override-form", f"--set {set_text(text)!r}: empty name in the key path", "e.g. --set train.steps=20")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise _override_error(where, index, key, "override-value", f"--set {set_text(text)!r}: the value is not YAML ({getattr(exc, 'problem', exc)})",
                              "quote strings that contain ':' or '#'") from None
    path = tuple(int(p) if p.isdigit() else p for p in parts)
    return Override(text, path, value)


def _override_error(file, index, key, code, message, hint) -> JobFileError:
    return JobFileError(message, hint=hint, problems=[Problem("error", "--set", index, 1, key or DOCUMENT_PATH, code, message, hint)])


def _keys_of(model: type) -> dict:
    """The keys a pydantic model takes in a job file (a field's alias when it has one: `from`) -> field info."""
    return {info.alias or name: info for name, info in model.model_fields.items()}


def _schema_fields(path: tuple) -> Optional[set]:
    """The field names allowed at `path` when it is a pydantic model, else None."""
    annotation: Any = Job
    for part in path:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if part not in _keys_of(annotation):
                return None
            annotation = _keys_of(annotation)[part].annotation
        else:
            args = typing.get_args(annotation)
            if typing.get_origin(annotation) is dict and len(args) == 2:
                annotation = args[1]
            else:
                return None
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return set(_keys_of(annotation))
    return None


def _unwrap(annotation):
    """Optional[X] -> X; Annotated[X, ...] -> X; a union of one model (or mapping form) and plain values
    (partition: auto | dims, data.input_fn: path | by mode) -> the model."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) is typing.Union:
        forms = [_unwrap(a) for a in typing.get_args(annotation) if a is not type(None)]
        models = [a for a in forms if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(forms) == 1:
            return forms[0]
        if len(models) == 1:
            return models[0]
    return annotation


def apply_overrides(data: Any, marks: Marks, overrides: Sequence[Override]) -> tuple[Any, list[Problem]]:
    """Apply `--set` overrides in order. Unknown paths are problems naming the override."""
    problems: list[Problem] = []
    if not isinstance(data, dict):
        data = {}
    for index, ov in enumerate(overrides, start=1):
        key, _, raw = ov.text.partition("=")
        refs = [part[0] for part in env_parts(raw) if not isinstance(part, str)]
        if refs:  # else the job would silently get the text `${VAR}`
            message = (f"the variable {refs[0]} would not be filled: a --set value is given to the job as written, not "
                       "read from the environment")
            problems.append(Problem(
                "error", "--set", index, 1, key.strip(), "override-env-ref", message,
                f"let the shell fill it: --set {key.strip()}=\"${refs[0]}\" (or, for a secret, write it into the job "
                "file as a ${VAR}: then no file holds its value)"))
        node = data
        ok = True
        for depth, part in enumerate(ov.path[:-1]):
            prefix = ov.path[: depth + 1]
            if isinstance(node, dict) and part in node and isinstance(node[part], (dict, list)):
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                node = node[part]
            elif isinstance(node, dict) and part not in node and _schema_fields(prefix[:-1]) and part in _schema_fields(prefix[:-1]) \
                    and _schema_fields(prefix) is not None:
                node[part] = {}  # an optional section the file leaves out, e.g. --set tpu.type=v3-8
                node = node[part]
                marks.values[prefix] = marks.keys[prefix] = Mark(index, 1)
                marks.sources[prefix] = "--set"
            else:
                problems.append(_unknown_override(index, ov, prefix, data))
                ok = False
                break
        if not ok:
            continue
        last = ov.path[-1]
        parent = ov.path[:-1]
        if isinstance(node, list):
            if not (isinstance(last, int) and last < len(node)):
                problems.append(_unknown_override(index, ov, ov.path, data))
                continue
        elif isinstance(node, dict):
            allowed = _schema_fields(parent)
            if last not in node and not free_form(parent) and not (allowed and last in allowed):
                problems.append(_unknown_override(index, ov, ov.path, data))
                continue
        else:
            problems.append(_unknown_override(index, ov, ov.path, data))
            continue
        node[last] = ov.value
        marks.values[ov.path] = Mark(index, 1)
        marks.keys[ov.path] = Mark(index, 1)
        marks.sources[ov.path] = "--set"
        # Marks under the replaced value now describe nothing: drop them so problems point at the override.
        for table in (marks.keys, marks.values):
            for path in [p for p in table if len(p) > len(ov.path) and p[: len(ov.path)] == ov.path]:
                del table[path]
    return data, problems


def _unknown_override(index: int, ov: Override, at: tuple, data: Any) -> Problem:
    parent = at[:-1]
    choices = list(_schema_fields(parent) or [])
    node = data
    for part in parent:
        node = node.get(part, {}) if isinstance(node, dict) else {}
    if isinstance(node, dict):
        choices += [k for k in node if isinstance(k, str)]
    hint = did_you_mean(str(at[-1]), choices) or (f"known keys here: {', '.join(sorted(set(choices)))}" if choices else None)
    return Problem("error", "--set", index, 1, dotted(ov.path), "override-unknown-path",
                   f"--set {set_text(ov.text)}: the job has no '{dotted(at)}'", hint)


# ----------------------------------------------------------------------------------- schema problems

_TYPE_WORDS = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "a whole number",
    "float_type": "a number", "float_parsing": "a number", "string_type": "a string", "bool_type": "true or false",
    "bool_parsing": "true or false", "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping",
    "model_attributes_type": "a mapping", "none_required": "null",
}
_RANGE = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def did_you_mean(word: str, choices: Sequence[str]) -> Optional[str]:
    """"did you mean 'x'?" for the closest choice, or None."""
    import difflib  # only a job with a mistake needs it

    close = difflib.get_close_matches(word, [c for c in choices if isinstance(c, str)], n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else None


def _real_path(loc: tuple, data: Any) -> tuple:
    """Drop the parts of a pydantic `loc` that name union members rather than keys in the data."""
    path: list = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            path.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            path.append(part)
            node = node[part]
        elif isinstance(part, str) and (part in ("str", "int", "float", "none", "bool") or "[" in part or "-" in part):
            continue
        else:
            path.append(part)  # a missing key or an unknown one
            node = None
    return tuple(path)




def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def schema_problems(exc: ValidationError, loaded: LoadedJob, prefix: tuple = ()) -> list[Problem]:
    problems: list[Problem] = []
    seen: set = set()
    for err in exc.errors(include_url=False):
        kind = err["type"]
        path = _real_path(prefix + tuple(err["loc"]), loaded.data)
        key = (path, kind)
        if key in seen or (path, "*") in seen:
            continue
        seen.add(key)
        name = str(path[-1]) if path else ""
        secret = loaded.secrets.covers(path)
        shown = SECRET_MASK if secret else _short(loaded.secrets.redact_value(err.get("input")))
        if kind == "extra_forbidden":
            allowed = sorted(_schema_fields(path[:-1]) or [])
            hint = did_you_mean(name, allowed) or (f"known keys here: {', '.join(allowed)}" if allowed else None)
            problems.append(loaded.problem(path, "unknown-key", f"unknown key '{name}'", hint, at_key=True))
        elif kind == "missing":
            problems.append(loaded.problem(path, "missing-key", f"required key '{name}' is missing",
                                           _field_description(path), at_key=True))
        elif kind in ("literal_error", "enum"):
            expected = err.get("ctx", {}).get("expected", "")
            options = [o.strip().strip("'\"") for o in expected.replace(" or ", ",").split(",") if o.strip()]
            hint = did_you_mean(str(err.get("input")), options) or f"expected one of: {', '.join(options)}"
            problems.append(loaded.problem(path, "invalid-value", f"{shown} is not allowed here", hint))
        elif kind in _TYPE_WORDS:
            seen.add((path, "*"))
            problems.append(loaded.problem(path, "wrong-type", f"expected {_TYPE_WORDS[kind]}, got {shown}",
                                           _field_description(path)))
        elif kind in _RANGE:
            bound = list(err.get("ctx", {}).values())[0]
            problems.append(loaded.problem(path, "out-of-range", f"{shown} must be {_RANGE[kind]} {bound}",
                                           _field_description(path)))
        elif kind == "string_pattern_mismatch":
            problems.append(loaded.problem(path, "invalid-value", f"{shown} does not have the required form",
                                           "use letters, digits, '-', '_' and '.', starting with a letter or digit"))
        else:
            message = err["msg"]
            for lead in ("Value error, ", "Assertion failed, "):
                message = message.replace(lead, "")
            hint = None
            if "unknown loss" in message or "unknown metric" in message:
                from tpulaunch.job.schema import LOSSES, METRICS
                options = LOSSES if "loss" in message else METRICS
                word = str(err.get("input"))
                if isinstance(err.get("input"), list):
                    word = next((m for m in err["input"] if m not in options and ":" not in str(m)), "")
                hint = did_you_mean(str(word), options) or f"one of {', '.join(options)}, or an import path 'pkg.mod:fn'"
            if secret and str(err.get("input")) in message:
                message = message.replace(repr(err.get("input")), SECRET_MASK).replace(str(err.get("input")), SECRET_MASK)
            problems.append(loaded.problem(path, "invalid-value", message, hint, at_key=isinstance(err.get("input"), dict)))
    return problems


def _field_description(path: tuple) -> Optional[str]:
    while path and isinstance(path[-1], int):  # a list item: describe the list
        path = path[:-1]
    if not path:
        return None
    annotation: Any = Job
    info = None
    for part in path:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and part in _keys_of(annotation):
            info = _keys_of(annotation)[part]
            annotation = info.annotation
        elif typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
            info = None
        else:
            return None
    return info.description if info is not None else None


# ------------------------------------------------------------------------------------------- loading

def _is_remote(path: str) -> bool:
    return "://" in path


def _anchor_relative_paths(data: dict, marks: Marks, job_dir: str) -> None:
    """Relative local paths in the file are relative to the file; those from --set, to the current directory."""
    for keys in PATH_KEYS:
        node = data
        for part in keys[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        key = keys[-1]
        if not isinstance(node, dict) or key not in node or not isinstance(node[key], (str, list)):
            continue
        value = node[key]
        entries = value if isinstance(value, list) else [value]
        fixed = []
        for i, entry in enumerate(entries):
            path = (*keys, i) if isinstance(value, list) else keys
            if isinstance(entry, str) and entry.strip() and not _is_remote(entry) and not os.path.isabs(os.path.expanduser(entry)):
                from_override = marks.locate(path)[0] == "--set"
                base = os.getcwd() if from_override else job_dir
                entry = os.path.normpath(os.path.join(base, os.path.expanduser(entry)))
            elif isinstance(entry, str) and entry.startswith("~"):
                entry = os.path.expanduser(entry)
            fixed.append(entry)
        node[key] = fixed if isinstance(value, list) else fixed[0]

def _tensorflow_partition_forms(data: dict, marks: Marks) -> None:
    """TensorFlow's own forms of `input_partition_dims`, as tpulaunch's: a plain dims list for a job's only
    feature (or only label) becomes `{name: dims}`, and `null` for a group replicates all of it (`{}`).

    The list's marks are copied to the named path, so problems with its entries stay located.
    """
    part, declared = data.get("partition"), data.get("data")
    if not isinstance(part, dict) or not isinstance(declared, dict):
        return
    for group in ("features", "labels"):
        if group in part and part[group] is None:
            part[group] = {}
            continue
        tensors = declared.get(group)
        if not isinstance(part.get(group), list) or not isinstance(tensors, dict) or len(tensors) != 1:
            continue  # several tensors: the schema asks for dims by name
        (name,) = tensors
        part[group] = {name: part[group]}
        prefix = ("partition", group)
        for table in (marks.keys, marks.values, marks.sources):
            for path in [p for p in table if p[:2] == prefix and len(p) > 2]:
                table[prefix + (name,) + path[2:]] = table[path]
        for table in (marks.values, marks.sources):
            if prefix in table:
                table.setdefault(prefix + (name,), table[prefix])


def load_job(filename: str, overrides: Sequence[str] = (), env: Optional[Mapping[str, str]] = None) -> LoadedJob:
    """Read, interpolate, override and validate a job file.

    Raises JobFileError when the file cannot be read or is not YAML (nothing else can be checked);
    otherwise returns a LoadedJob whose `problems` lists every schema problem found.
    """
    parsed = [parse_override(text, i) for i, text in enumerate(overrides, start=1)]
    text = read_job_text(filename)
    data, marks, problems = parse_yaml(text, filename, env)
    loaded = LoadedJob(filename, data, marks, None)
    if data is None:
        loaded.problems.append(Problem("error", filename, 1, 1, DOCUMENT_PATH, "file-empty", "the job file is empty",
                                       "start from `tpulaunch init`"))
        if not parsed:
            return loaded
        data = {}
    if not isinstance(data, dict):
        loaded.problems.append(loaded.problem((), "wrong-type", f"a job file is a mapping of sections, not {type(data).__name__}",
                                              "start from `tpulaunch init`"))
        loaded.invalid = set(SECTIONS)
        return loaded
    data, override_problems = apply_overrides(data, marks, parsed)
    _anchor_relative_paths(data, marks, os.path.dirname(os.path.abspath(filename)))
    _tensorflow_partition_forms(data, marks)
    loaded.data = data
    loaded.secrets = secrets_of(data, marks)
    remember(loaded.secrets)
    problems += override_problems
    try:
        loaded.job = Job.model_validate(data).located_at(os.path.dirname(os.path.abspath(filename))).keeping(
            loaded.secrets)
    except ValidationError as exc:
        # A value emptied by an unset ${VAR} or a refused tag was reported already; a type error would repeat it.
        env_paths = {p.path for p in problems if p.code in ("env-var-unset", "yaml-unsupported-tag", "yaml-bad-tagged-value")}
        problems += [p for p in schema_problems(exc, loaded) if p.path not in env_paths]
    if problems:
        loaded.job = None if any(p.is_error for p in problems) else loaded.job
    loaded.problems.extend(problems)
    for name, annotation in SECTIONS.items():
        if loaded.job is not None:
            loaded.sections[name] = getattr(loaded.job, name)
            continue
        if name not in data or data[name] is None:
            loaded.sections[name] = None
            continue
        try:
            loaded.sections[name] = TypeAdapter(annotation).validate_python(data[name])
        except ValidationError:
            loaded.sections[name] = None
            loaded.invalid.add(name)
    failed_paths = {p.path.split(".")[0].split("[")[0] for p in problems
                    if p.is_error and p.path != DOCUMENT_PATH and p.code != "duplicate-key"}
    loaded.invalid |= failed_paths & set(SECTIONS)
    return loaded
