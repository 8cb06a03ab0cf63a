"""The suite's own layout: no test module imports another. What test modules share (job texts, corpora, fixtures,
checks that several engines run) lives in the helper modules of tests/ itself, the one folder on pytest's path; a
test module that another imported would be collected twice, in environments it was not written for, and its
tests would run wherever its importer does."""

from __future__ import annotations

import ast
import tomllib

from paths import REPO

TESTS = REPO / "tests"


def imported_modules(path) -> set:
    """The top-level names of the modules `path` imports, at its top or inside a function; a relative import
    (`from . import x`, `from .x import y`) is named by what it imports from its own folder."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                names.add(node.module.split(".")[0])
            elif node.module:
                names.add(node.module.split(".")[0])
            else:
                names.update(alias.name for alias in node.names)
    return names


def test_no_test_module_is_imported_by_another():
    test_modules = {path.stem for path in TESTS.rglob("test_*.py")}
    imports = {str(path.relative_to(REPO)): sorted(imported_modules(path) & test_modules)
               for path in TESTS.rglob("*.py") if "programs" not in path.relative_to(TESTS).parts}
    assert {module: names for module, names in imports.items() if names} == {}, \
        "move what they share into a helper module of tests/ (not named test_*)"


def test_only_the_helpers_folder_is_on_pytests_path():
    """Every test folder on the path would let a test module import another by its bare name."""
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert options["pythonpath"] == ["tests"]
