"""The CLI's fast path never imports TensorFlow, and the README's commands are the ones CI runs."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOD = os.path.join(ROOT, "tests", "jobs", "good", "tpu_ct.yaml")

PROBE = """
import sys
from tpulaunch.cli.app import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code or 0
loaded = sorted(m for m in ("tensorflow", "numpy", "tensorflow_estimator", "cloud_tpu_client") if m in sys.modules)
print("LOADED=" + ",".join(loaded))
sys.exit(code)
"""


@pytest.mark.parametrize("args", [
    ["--help"], ["validate", "--help"], ["train", "--help"], ["data", "--help"], ["status", "--help"],
    ["schema"], ["validate", "--static", GOOD], ["plan", "--no-memory", GOOD],
])
def test_no_tensorflow_on_the_fast_path(args):
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "LOADED="


def readme_block(title):
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text.split(f"## {title}\n", 1)[1]
    return re.search(r"```sh\n(.+?)\n```", section, re.S).group(1).strip()


def test_ci_runs_the_readme_test_command():
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    assert readme_block("Tests") in ci


def test_quickstart_names_files_that_exist():
    command = readme_block("Quickstart")
    assert "tpulaunch train configs/quickstart.yaml" in command
    assert os.path.exists(os.path.join(ROOT, "configs", "quickstart.yaml"))


@pytest.mark.parametrize("name", ["quickstart.yaml", "unet3d_ct.yaml", "retinanet_2560.yaml"])
def test_example_jobs_validate_clean(name):
    from tpulaunch.checks.validate import validate_job

    result = validate_job(os.path.join(ROOT, "configs", name), static=True)
    assert [(p.severity, p.code) for p in result.problems] == []
