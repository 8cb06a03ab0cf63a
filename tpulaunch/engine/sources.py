"""The text of an engine's standalone modules, as `tpulaunch explain` prints them, read without importing them.

An engine's program is `engine/portable.py` (the pipeline, precision, heads and losses every engine
run) followed by the engine's own standalone module, both verbatim, except for the one statement
that imports portable's names into the engine's module: in the program those names are defined just
above it. Pure Python: importing either module would load TensorFlow.
"""

from __future__ import annotations

import importlib.util
import re

PORTABLE = "tpulaunch.engine.portable"

# The engine module's `from tpulaunch.engine.portable import (...)` statement, with its comment.
_PORTABLE_IMPORT = re.compile(r"^from tpulaunch\.engine\.portable import \([^)]*\)\n", re.MULTILINE)


def module_source(module: str) -> str:
    with open(importlib.util.find_spec(module).origin, encoding="utf-8") as handle:
        return handle.read()


def engine_module_body(module: str) -> str:
    """The engine module's text without its import of portable's names (exactly one is expected)."""
    text, count = _PORTABLE_IMPORT.subn("", module_source(module))
    if count != 1:
        raise RuntimeError(f"{module} must import portable's names in exactly one statement, found {count}")
    return text


def program_source(module: str) -> str:
    """portable.py, then the engine module (`engine_module_body`), as one program's middle."""
    banner = "# " + "-" * 98
    return "\n".join([
        module_source(PORTABLE).rstrip("\n"), "", "",
        banner, f"# {module.replace('.', '/')}.py, verbatim but for its import of portable.py's names (above)", banner,
        "", engine_module_body(module).rstrip("\n"),
    ]) + "\n"
