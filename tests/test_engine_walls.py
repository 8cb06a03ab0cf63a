"""The engines' walls: the keras engine and the estimator engine import nothing of each other; what both use
is in engine/core (the loop, model_dir, run records, build failures) or engine/ itself."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parent.parent / "tpulaunch" / "engine"

# Still in engine/estimator/ and used by the keras engine until they move to a shared home (in progress on main):
# the job's flags (estimator/flags.py) and the input pipeline's values (estimator/plain.py's data helpers).
NOT_YET_MOVED = {"tpulaunch.engine.estimator.flags", "tpulaunch.engine.estimator.plain"}


def imported(path: Path) -> set:
    """Every module `path` imports (at its top or inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def crossings(engine: str, other: str, allowed=frozenset()) -> dict:
    found = {}
    for path in sorted((ENGINE / engine).glob("*.py")):
        bad = sorted(name for name in imported(path)
                     if name.startswith(f"tpulaunch.engine.{other}")
                     and not any(name == a or name.startswith(a + ".") for a in allowed))
        if bad:
            found[path.name] = bad
    return found


def test_the_keras_engine_imports_nothing_of_the_estimator_engine():
    assert crossings("keras", "estimator", NOT_YET_MOVED) == {}


def test_the_estimator_engine_imports_nothing_of_the_keras_engine():
    assert crossings("estimator", "keras") == {}


def test_the_core_imports_neither_engine():
    assert crossings("core", "estimator") == {} and crossings("core", "keras") == {}
