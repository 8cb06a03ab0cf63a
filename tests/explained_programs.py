"""The program `tpulaunch explain` writes for a job, and that program run as a user runs it: in a fresh
interpreter in which nothing of tpulaunch can be imported (`explain`, `run`), with what its evaluation printed
read back (`evaluation_of`); the same for the keras engine's program (`explain_keras`, `run_keras_program`,
`keras_evaluations`)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from programs_run import RUN_WITHOUT_TPULAUNCH
from tpulaunch.cli.app import cli


def explain(job: Path, *overrides: str) -> str:
    """The program `tpulaunch explain` writes for `job` (with `--set` overrides), as a file beside the job."""
    program = job.parent / f"program-{len(list(job.parent.glob('program-*.py')))}.py"
    result = CliRunner().invoke(cli, ["explain", str(job), "-o", str(program),
                                      *(arg for override in overrides for arg in ("--set", override))])
    assert result.exit_code == 0, result.output
    return str(program)


def run(program: str, *args: str) -> str:
    """Run the program from / with no tpulaunch importable; its stdout."""
    runner = Path(program).parent / "run_without_tpulaunch.py"
    runner.write_text(RUN_WITHOUT_TPULAUNCH)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "TF_CPP_MIN_LOG_LEVEL": "2"}
    child = subprocess.run([sys.executable, "-I", str(runner), program, *args], cwd="/", env=env,
                           capture_output=True, text=True, timeout=300, check=False)
    assert child.returncode == 0, child.stderr[-3000:]
    return child.stdout


def evaluation_of(stdout: str) -> tuple:
    """(accuracy, loss, global_step) from the dict TPUEstimator.evaluate returns, as the script prints it."""
    found = re.search(r"\{'accuracy': ([0-9.e-]+), 'loss': ([0-9.e-]+), 'global_step': (\d+)\}", stdout)
    assert found is not None, stdout[-2000:]
    return float(found[1]), float(found[2]), int(found[3])


def explain_keras(job: Path, *args: str) -> str:
    result = CliRunner().invoke(cli, ["explain", str(job), "--engine", "keras", *args])
    assert result.exit_code == 0, result.output
    return result.output


def run_keras_program(program: Path, *args: str) -> str:
    """Run the program from / in a fresh interpreter with nothing of tpulaunch importable; its stdout."""
    wrapper = program.parent / "run_without_tpulaunch.py"
    wrapper.write_text(RUN_WITHOUT_TPULAUNCH)
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TF_CONFIG", "TF_USE_LEGACY_KERAS")},
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    child = subprocess.run([sys.executable, "-I", str(wrapper), str(program), *args], cwd="/", env=env,
                           capture_output=True, text=True, timeout=300, check=False)
    assert child.returncode == 0, child.stderr[-3000:]
    return child.stdout


def keras_evaluations(stdout: str) -> list:
    """The dicts KerasTraining.evaluate returned, as the program prints them."""
    return [ast.literal_eval(line) for line in stdout.splitlines() if line.startswith("{'loss': ")]
