"""Every job in tests/jobs/bad/ is refused with exactly the problems its `# expect:` lines name.

Each bad job is one (or a few) realistic mistakes applied to tests/jobs/good/tpu_ct.yaml. The
expectations are whole: severity, code, dotted path, line and column, and nothing else reported.
"""

import glob
import json
import os
import subprocess
import sys

import pytest

from paths import TESTS
from tpulaunch.checks.validate import validate_job

HERE = str(TESTS)
BAD = sorted(glob.glob(os.path.join(HERE, "jobs", "bad", "*.yaml")))
GOOD = sorted(glob.glob(os.path.join(HERE, "jobs", "good", "*.yaml")))
ENV = {"BUCKET": "ct-bucket"}  # no GCP_PROJECT_FOR_TESTS: one job relies on it being unset


def expected(path):
    with open(path, encoding="utf-8", errors="replace") as handle:
        lines = [line[len("# expect: "):].split() for line in handle if line.startswith("# expect: ")]
    return [(sev, code, where, tuple(map(int, at.split(":")))) for sev, code, where, at in lines]


def test_corpus_is_substantial():
    assert len(BAD) >= 45
    assert all(expected(path) for path in BAD), "every bad job states what it expects"


@pytest.mark.parametrize("path", BAD, ids=os.path.basename)
def test_bad_job_problems(path):
    result = validate_job(path, static=True, env=ENV)
    found = [(p.severity, p.code, p.path, (p.line, p.column)) for p in result.problems]
    assert found == expected(path)
    assert result.ok == all(sev != "error" for sev, *_ in expected(path))
    assert all(p.file == path for p in result.problems)


@pytest.mark.parametrize("path", GOOD, ids=os.path.basename)
def test_good_job_is_clean(path):
    result = validate_job(path, static=True, env=ENV)
    assert [p for p in result.problems if p.is_error] == []
    assert result.ok


def test_cli_reports_all_at_once_with_places():
    path = os.path.join(HERE, "jobs", "bad", "46_several_mistakes.yaml")
    proc = subprocess.run([sys.executable, "-m", "tpulaunch", "validate", "--static", path],
                          capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"})
    assert proc.returncode == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    located = [line.split(": ")[0] for line in proc.stdout.splitlines() if line.startswith(path + ":")]
    assert located == [f"{path}:6:3", f"{path}:22:21", f"{path}:24:21", f"{path}:26:18"]


def test_cli_json_contract():
    path = os.path.join(HERE, "jobs", "bad", "21_train_batch.yaml")
    proc = subprocess.run([sys.executable, "-m", "tpulaunch", "validate", "--static", "--format", "json", path],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False and doc["file"] == path
    [problem] = doc["problems"]
    assert problem == {"severity": "error", "file": path, "line": 24, "column": 21, "path": "train.batch_size",
                       "code": "batch-not-divisible",
                       "message": "train batch size 6 must be divisible by the number of replicas 4",
                       "hint": "use 4 or 8 (a multiple of 4); batch_size is global, over all replicas"}


def test_cli_github_annotations():
    path = os.path.join(HERE, "jobs", "bad", "02_optimiser_typo.yaml")
    proc = subprocess.run([sys.executable, "-m", "tpulaunch", "validate", "--static", "--format", "github", path],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[0].startswith(f"::error file={path},line=6,col=3,")


def test_local_runs_skip_tpu_only_rules():
    """`train --local` checks the same file as a run on this machine: local paths and odd batches are fine."""
    path = os.path.join(HERE, "jobs", "bad", "46_several_mistakes.yaml")
    result = validate_job(path, static=True, env=ENV, local=True)
    assert [(p.code, p.path) for p in result.problems] == [("unknown-key", "model.optimiser")]
