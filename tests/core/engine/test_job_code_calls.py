"""Each engine's declaration of where its standalone.py calls the job's code (`JobCodeCalls`, in its locate.py)
holds against that file: a renamed function or a changed line there would otherwise move a build failure silently
from its job key (model.loss, model.optimizer, ...) to model.builder. No framework is imported: the files are read."""

import ast
import importlib
import importlib.util

import pytest

from tpulaunch.seam.registry import names


def _functions(path) -> dict:
    """Every function the file defines (nested ones too), by name: the source of each (several share a name)."""
    text = open(path, encoding="utf-8").read()
    found: dict = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.setdefault(node.name, []).append(ast.get_source_segment(text, node))
    return found


LOCATING = [name for name in names() if importlib.util.find_spec(f"tpulaunch.engine.{name}.locate")]


def test_every_engine_locates_its_build_failures():
    assert LOCATING == list(names())


@pytest.mark.parametrize("engine", LOCATING)
def test_each_engine_declares_functions_and_lines_its_code_has(engine):
    calls = importlib.import_module(f"tpulaunch.engine.{engine}.locate").CALLS
    functions = _functions(calls.file)
    assert calls.callers or calls.by_function, f"{engine}: locates no failure"
    missing = [name for name in (*calls.by_function, *calls.callers) if name not in functions]
    assert missing == [], f"{engine}'s {calls.file} has no function {missing}"
    callers_source = "\n".join(source for name in calls.callers for source in functions[name])
    unmatched = [text for text, _key in calls.by_line if text not in callers_source]
    assert unmatched == [], f"no line of {engine}'s callers {calls.callers} holds {unmatched}"
    for name in calls.callers:  # a caller none of whose lines is declared locates nothing
        assert any(text in source for text, _key in calls.by_line for source in functions[name]), name
