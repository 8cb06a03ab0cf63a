"""Running a reference program's job the way a user does: `python -m tpulaunch ...` (or the explained program)
in a process of its own, with PYTHONPATH unset so that the job file alone says where the program's code is.
absl flags are process-wide, and the reference programs define flags the others define too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping


def run(*command: str, cwd: Path, env: Mapping[str, str] = {}) -> subprocess.CompletedProcess:
    """`python COMMAND...` in `cwd`, with plain output at a wide terminal's width and `env` added."""
    environment = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **env}
    environment.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, *command], cwd=cwd, capture_output=True, text=True, env=environment)


def said(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr
