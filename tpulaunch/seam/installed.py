"""The libraries this machine has, read without importing them (the CLI's fast path uses this): which engine
runs a job follows from them (`seam/registry.py`)."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from typing import Optional, Tuple

from tpulaunch.seam.about import Framework


@functools.lru_cache(maxsize=None)
def installed_version(framework: Framework) -> Optional[Tuple[int, int]]:
    """(major, minor) of the installed `framework`, or None when there is none.

    Read from the `*.dist-info` folder beside its package, found without importing it: `importlib.metadata`
    alone costs more than the rest of `validate --static`'s imports together.
    """
    origin = _package_dir(framework.module)
    if origin is None:
        return None
    names = {name.replace("-", "_") for name in framework.distributions}
    for entry in sorted(os.listdir(os.path.dirname(origin))):
        match = _DIST_INFO.match(entry)
        if match and match.group(1).lower() in names:
            return int(match.group(2)), int(match.group(3))
    return None


_DIST_INFO = re.compile(r"^([A-Za-z0-9_.]+)-(\d+)\.(\d+)[^-]*\.dist-info$")


def _package_dir(name: str) -> Optional[str]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def installed_module(package: str) -> bool:
    return importlib.util.find_spec(package) is not None
