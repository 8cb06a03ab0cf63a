"""Which values of a job are secrets: known once, when the job is loaded, and read by everything that writes or
shows the job (model_dir's job copy and the record's hash through `job/document.py`, `run`'s stage, `explain`'s
program, problems and error messages).

A value is a secret by where it came from, or by its key's name:

- a `${VAR}` of the job file (filled from the environment), anywhere but where tpulaunch itself names the value in
  its output (`shown`: `tpu:`, the data and model_dir paths, `python_path`, the job's `name`);
- a `--set` value under a secret-looking key of a free-form mapping (`free_form`: the job's own keyword arguments
  and flags, where the key names are the user's);
- any value under a secret-looking key of a free-form mapping, however it was given.

Secret values are masked (`SECRET_MASK`) wherever tpulaunch writes or shows the job; only the job's own code gets
them (as the builder's arguments, or its flags).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from tpulaunch.job.yamlfile import SECRET_MASK, looks_secret, value_at

# Paths whose values are places: tpulaunch names them in its messages and `run` needs them on this machine.
PATH_KEYS = (("data", "train"), ("data", "eval"), ("run", "model_dir"), ("run", "warm_start", "from"), ("python_path",))


def place(path: tuple) -> bool:
    """Whether `path` is where the job runs, reads or writes (`tpu:` and PATH_KEYS)."""
    return path[:1] == ("tpu",) or any(path[:len(keys)] == tuple(keys) for keys in PATH_KEYS)


def shown(path: tuple) -> bool:
    """Whether a `${VAR}` at `path` is shown as it is: a place, or the job's name (every line about the run has it)."""
    return place(path) or tuple(path) == ("name",)


def free_form(path: tuple) -> bool:
    """Whether `path` is a mapping of the user's own keys (free keyword arguments, not schema fields): params, flags,
    and the arguments of a call (`model.model_fn.args`, `data.input_fn.train.args`, ...)."""
    return path in {("model", "params"), ("eval", "params"), ("model", "optimizer", "args"), ("flags",)} or (
        len(path) > 1 and path[-1] == "args" and path[0] in ("model", "data"))


def _secret_name(path: tuple) -> bool:
    """Whether `path` ends at a secret-looking key inside a free-form mapping."""
    return bool(path) and looks_secret(str(path[-1])) and any(free_form(path[:j]) for j in range(len(path)))


def _named(value: Any, path: tuple = ()) -> Iterable[tuple]:
    """The paths under secret-looking keys of free-form mappings in `value` (a job's data or document)."""
    if _secret_name(path):
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _named(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _named(item, path + (index,))


MIN_REDACTED = 4  # a shorter value (a number, a flag) is no secret worth masking in every message that has it


def _leaves(value: Any, numbers: bool = False) -> Iterable[str]:
    """The texts a value may be quoted as in a message, to be masked there: its strings (and with `numbers`, its
    numbers), and each line of a multi-line string (a message may show its first line only)."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item, numbers)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item, numbers)
    elif isinstance(value, str) or numbers and isinstance(value, (int, float)) and not isinstance(value, bool):
        text = str(value)
        for piece in (text, *(text.splitlines() if isinstance(value, str) else ())):
            if len(piece.strip()) >= MIN_REDACTED and piece != SECRET_MASK:
                yield piece


def _under(path: tuple, roots: Iterable[tuple]) -> bool:
    return any(path[:len(root)] == root for root in roots)


@dataclass(frozen=True)
class Secrets:
    """The secret values of one job: where they are (paths of the job's data) and their texts."""

    paths: frozenset = frozenset()  # each secret value's path (everything under it is secret too)
    from_command_line: frozenset = frozenset()  # those a --set gave (`run` cannot stage them: remote/stage.py)
    values: tuple = ()  # their texts, longest first (for `redact`)

    def covers(self, path: tuple) -> bool:
        """Whether the value at `path` is, or is part of, a secret."""
        return _under(tuple(path), self.paths)

    def mask(self, document: Any) -> Any:
        """A copy of a job's data or document (`job.document.job_document`) with every secret value SECRET_MASK:
        at the paths known when the job was loaded, and under secret-looking keys of free-form mappings."""
        return self._masked(document, ())

    def _masked(self, value: Any, path: tuple) -> Any:
        if path in self.paths or _secret_name(path):
            return SECRET_MASK
        if isinstance(value, dict):
            return {key: self._masked(item, path + (key,)) for key, item in value.items()}
        if isinstance(value, list):
            return [self._masked(item, path + (index,)) for index, item in enumerate(value)]
        return value

    def redact(self, text: str) -> str:
        """`text` with every secret value in it SECRET_MASK (a message, a line that may quote one)."""
        if not text:
            return text
        for value in self.values:
            text = text.replace(value, SECRET_MASK)
        return text

    def redact_value(self, value: Any) -> Any:
        """A copy of `value` (a job's data, or part of it) with every secret text in its strings masked, before it
        is quoted (cut short, a quoted secret would not be found by `redact`)."""
        if isinstance(value, dict):
            return {key: self.redact_value(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.redact_value(item) for item in value]
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and str(value) in self.values:
            return SECRET_MASK
        return value

    def __or__(self, other: "Secrets") -> "Secrets":
        return Secrets(self.paths | other.paths, self.from_command_line | other.from_command_line,
                       tuple(sorted(set(self.values) | set(other.values), key=len, reverse=True)))


NONE = Secrets()


def secrets_of(data: Any, marks) -> Secrets:
    """The secrets of a job's data (after its `--set`s) from where each value came from (`marks`: the file's
    `${VAR}`s, the paths a --set gave)."""
    set_paths = [tuple(path) for path, source in marks.sources.items() if source == "--set"]
    from_env = [tuple(path) for path in marks.env_refs if not shown(tuple(path)) and not _under(tuple(path), set_paths)]
    named = list(_named(data))
    # a --set of (or into) a value under a secret-looking key, or of a mapping that has one
    from_command_line = [path for path in named if _under(path, set_paths)] + [
        path for path in set_paths if any(_secret_name(path[:n]) for n in range(1, len(path) + 1))]
    paths = frozenset(from_env) | frozenset(named) | frozenset(from_command_line)
    texts = {text for path in paths for text in _leaves(value_at(data, path))}
    # Numbers only where the job file does not show them (a ${VAR}, a --set): a key's name alone makes `key_dim: 1024`
    # no number worth masking in every message. Each ${VAR}'s own text too: a message may quote it without the rest
    # of its string (`https://me:${PW}@host`); but not a VAR's text that fills a value tpulaunch shows (a folder).
    texts |= {text for path in [*from_env, *from_command_line] for text in _leaves(value_at(data, path), numbers=True)}
    texts |= {text for path in from_env for text in _leaves(marks.env_values.get(path, []))}
    texts -= {text for path, filled in marks.env_values.items() if shown(tuple(path)) for text in filled}
    return Secrets(paths, frozenset(from_command_line), tuple(sorted(texts, key=len, reverse=True)))


# ----------------------------------------------------------------------- this process's secrets

_known = [NONE]


def remember(secrets: Secrets) -> None:
    """Keep the secrets of a job this process loaded, so that its error messages can be redacted (`redact`)."""
    _known[0] = _known[0] | secrets


def redact(text: str) -> str:
    """`text` with the value of every secret of the jobs this process loaded masked."""
    return _known[0].redact(text)


def forget() -> None:
    """Forget the jobs' secrets this process kept: for a process that runs one job after another (a test worker),
    where one job's secret would mask the same words in the next one's messages."""
    _known[0] = NONE


# ----------------------------------------------------------------------- a secret given with --set

def set_text(text: str) -> str:
    """A `--set KEY=VALUE` as a message quotes it: VALUE masked under a secret-looking key (a --set that cannot be
    applied, or not read, is no part of the job's data, where `secrets_of` would find it)."""
    key, sep, _ = text.partition("=")
    return f"{key}={SECRET_MASK}" if sep and any(looks_secret(part) for part in key.split(".")) else text


def env_name(path: tuple) -> str:
    """The environment variable (and Secret Manager secret) a secret at `path` would be read from: its key, upper."""
    return "".join(ch if ch.isalnum() else "_" for ch in str(path[-1])).upper()


def set_secret_fix(path: tuple, how: str) -> str:
    """What to do instead of passing the secret at `path` with --set where a program or a VM must get it: a `${VAR}`
    in the job file (`how`: who reads it, and from where)."""
    return (f"write `{path[-1]}: \"${{{env_name(path)}}}\"` into the job file instead ({how}): then no file holds "
            "its value")
