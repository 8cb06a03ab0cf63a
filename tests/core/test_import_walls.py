"""The house's walls, held: the import graph of tpulaunch/ as import-linter and grimp (the graph library it is
built on) read it, every import counted, at a module's top or inside a function.

- `.importlinter`'s contracts: the folders follow the flow, each importing only folders below it (no two import
  each other); an engine imports no other engine; what sits above the engines or beside them in engine/ imports
  no engine folder (they find engines by name, `seam/registry.py`);
- no circles: no module imports, directly or through others, a module that imports it;
- one Cloud Storage client: only the store (`tpulaunch/store/gcs.py`) imports google-cloud-storage (import-linter
  sees only the top of a namespace package, `google`, which the TPU API's client and protobuf share).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]  # the repository: tests/core/ is two folders down


def test_the_import_contracts_hold():
    # In a process of its own: import-linter's command line takes over the terminal's streams.
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--config", str(ROOT / ".importlinter"), "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Contracts: 5 kept, 0 broken." in proc.stdout, proc.stdout


def circles(graph) -> list:
    """The import graph's strongly connected components of more than one module (Tarjan)."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(module):
        index[module] = low[module] = counter[0]
        counter[0] += 1
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_through_others():
    graph = grimp.build_graph("tpulaunch", exclude_type_checking_imports=True)
    assert circles(graph) == []


def test_a_circle_is_found(tmp_path, monkeypatch):
    """The search above finds one where there is one (two modules that import each other)."""
    package = tmp_path / "walled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from walled import b\n")
    (package / "b.py").write_text("from walled import a\n")
    (package / "c.py").write_text("from walled import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert circles(grimp.build_graph("walled")) == [["walled.a", "walled.b"]]


def importers_of(package: Path, module: str) -> list:
    """The files under `package` that import `module` (or a module in it), at their top or inside a function."""
    parent, _, name = module.rpartition(".")
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
                     if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            if any(imported == module or imported.startswith(module + ".") for imported in names):
                found.append(path.relative_to(package.parent).as_posix())
                break
    return found


def test_only_the_store_imports_the_cloud_storage_client():
    assert importers_of(ROOT / "tpulaunch", "google.cloud.storage") == ["tpulaunch/store/gcs.py"]


def test_an_importer_is_found_however_it_imports(tmp_path):
    package = tmp_path / "walled"
    package.mkdir()
    (package / "a.py").write_text("def f():\n    from google.cloud import storage\n")
    (package / "b.py").write_text("import google.cloud.storage.retry\n")
    (package / "c.py").write_text("from google.cloud import tpu_v2\nfrom google.cloud.storage_ext import x\n")
    assert importers_of(package, "google.cloud.storage") == ["walled/a.py", "walled/b.py"]
