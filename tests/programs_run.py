"""Running a reference program's job the way a user does: `python -m tpulaunch ...` (or the explained program)
in a process of its own, with PYTHONPATH unset so that the job file alone says where the program's code is.
absl flags are process-wide, and the reference programs define flags the others define too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Mapping, Optional

# A wrapper that runs a program as __main__ and fails if anything of tpulaunch was imported: an explained program
# runs with nothing of tpulaunch (the editable install would let `import tpulaunch` succeed even under `python -I`).
RUN_WITHOUT_TPULAUNCH = textwrap.dedent("""\
    import runpy, sys
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    leaked = sorted(m for m in sys.modules if m.split(".")[0] == "tpulaunch")
    if leaked:
        sys.exit(f"the program imported {leaked}")
    """)


def run(*command: str, cwd: Path, env: Mapping[str, str] = {}) -> subprocess.CompletedProcess:
    """`python COMMAND...` in `cwd`, with plain output at a wide terminal's width and `env` added."""
    environment = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **env}
    environment.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, *command], cwd=cwd, capture_output=True, text=True, env=environment)


def said(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def tpulaunch(*args: str, cwd: Path, env: Mapping[str, str] = {}) -> subprocess.CompletedProcess:
    return run("-m", "tpulaunch", *args, cwd=cwd, env=env)


def refused_alike(cwd: Path, says: str, *, train_args: tuple = (), env: Mapping[str, str] = {},
                  validated: Optional[subprocess.CompletedProcess] = None) -> None:
    """`validate` and `train` of cwd/job.yaml both refuse it (exit 1: the job's problem, not an internal error),
    both saying `says` (the key, or more), without a traceback. `validated`: a `tpulaunch validate` of that same
    job a module already ran (its output read by another test too), checked here instead of running it again."""
    if validated is None:
        validated = tpulaunch("validate", "job.yaml", cwd=cwd, env=env)
    for proc in (validated, tpulaunch("train", "job.yaml", *train_args, cwd=cwd, env=env)):
        assert proc.returncode == 1 and says in said(proc), said(proc)
        assert "Traceback" not in said(proc) and "error: unexpected" not in said(proc), said(proc)


def explained_evaluation(project: Path, env: Mapping[str, str] = {}) -> tuple:
    """(program text, the metrics dict it prints): `tpulaunch explain job.yaml -o program.py`, then
    `python program.py evaluate` on the job's model_dir."""
    import numpy as np

    explained = tpulaunch("explain", "job.yaml", "-o", "program.py", cwd=project, env=env)
    assert explained.returncode == 0, said(explained)
    ran = run("program.py", "evaluate", cwd=project, env=env)
    assert ran.returncode == 0, said(ran)
    return (project / "program.py").read_text(), eval(ran.stdout.strip().splitlines()[-1], {"np": np})


def metrics(line: str) -> dict:
    return {name: float(value) for name, value in re.findall(r"(\w+) ([0-9.]+)", line.split("|", 2)[2])}
