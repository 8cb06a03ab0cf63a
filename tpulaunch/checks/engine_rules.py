"""Which engine's rules a job is checked against, and the dispatch to them. Pure Python.

Each engine declares the job keys only it runs and those it does not honour (`EngineAbout.own_keys`,
`refused_keys`: one declaration, in its about.py), and its other rules (`EngineAbout.static_rules`, in its folder);
the rules every engine shares are in `checks/static.py`.
"""

from __future__ import annotations

from typing import Optional, Tuple

from tpulaunch.job.load import LoadedJob
from tpulaunch.seam.about import OwnKey
from tpulaunch.seam.registry import about, names


def only_key_code(owner: str) -> str:
    """The code of a refused key only engine `owner` runs ("estimator-only-key")."""
    return f"{owner}-only-key"


def unsupported_code(engine: str) -> str:
    """The code of a key engine `engine` does not honour ("keras-engine-unsupported")."""
    return f"{engine}-engine-unsupported"


def engine_problems(loaded: LoadedJob) -> list:
    """The rules of the job's engine (`loaded.engine`, worked out once) that `checks/static.py` does not hold:
    other engines' own keys, the keys it refuses, then its own rules."""
    engine = loaded.engine_about
    found = []
    for other in names():
        if other == engine.name:
            continue
        for own in about(other).own_keys:
            if _is_set(loaded, own.key):
                found.append(loaded.problem(
                    _path(own.key), only_key_code(other),
                    f"{own.what} runs only on the {other} engine; this job runs on the {engine.name} engine",
                    f"set run.engine: {other}, or {own.instead}"))
    for refused in engine.refused_keys:
        if _is_set(loaded, refused.key):
            found.append(loaded.problem(_path(refused.key), unsupported_code(engine.name), refused.message,
                                        refused.hint))
    return found + engine.rules()(loaded)


def owner_of(problem) -> Optional[Tuple[str, OwnKey]]:
    """The engine whose own key `problem` refuses on another engine, and its declaration (None: not such a
    refusal)."""
    for name in names():
        if problem.code == only_key_code(name):
            return next(((name, own) for own in about(name).own_keys if own.key == problem.path), None)
    return None


def _path(key: str) -> tuple:
    return tuple(key.split("."))


def _is_set(loaded: LoadedJob, key: str) -> bool:
    """The job gives `key` a value (its section read; a key left at its default, None or false, is not set)."""
    section, *fields = _path(key)
    value = loaded.section(section)
    for name in fields:
        value = getattr(value, name, None)
    return value is not None and value is not False
