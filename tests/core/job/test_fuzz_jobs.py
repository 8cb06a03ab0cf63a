"""A fixed-seed slice of the job-file fuzzing (benchmarks/fuzz_jobs.py runs >= 10,000 cases).

Mutated valid jobs, textual and byte-level garbage and random `--set` strings: `validate --static`
never raises, every problem is located (file, line >= 1, a dotted path), and the CLI exits 0, 1 or 2
without a traceback in any output format.
"""

import os
import sys

from hypothesis import HealthCheck, Phase, given, settings

from paths import BENCHMARKS  # noqa: E402

sys.path.insert(0, str(BENCHMARKS))

import fuzz_jobs  # noqa: E402

from tpulaunch.errors import Problem  # noqa: E402
from tpulaunch.checks.validate import validate_job  # noqa: E402

SLICE = settings(deadline=None, database=None, derandomize=True, phases=[Phase.generate, Phase.shrink],
                 suppress_health_check=list(HealthCheck))


def _write(tmp_path_factory, raw: bytes) -> str:
    path = tmp_path_factory.mktemp("fuzz") / "job.yaml"
    path.write_bytes(raw)
    return str(path)


@settings(SLICE, max_examples=300)
@given(fuzz_jobs.job_cases())
def test_validate_never_raises_and_locates_every_problem(tmp_path_factory, case):
    kind, raw, sets = case
    path = _write(tmp_path_factory, raw)
    code, failures, _ = fuzz_jobs.check_in_process(path, sets)
    assert failures == []
    assert code in (0, 1)


@settings(SLICE, max_examples=30)
@given(fuzz_jobs.job_cases())
def test_cli_exits_cleanly_in_every_format(tmp_path_factory, case):
    kind, raw, sets = case
    path = _write(tmp_path_factory, raw)
    for fmt in ("text", "json", "github"):
        code, failures = fuzz_jobs.check_cli(path, sets, fmt)
        assert failures == [], fmt
        assert code in (0, 1, 2), fmt


def test_unchanged_bases_are_valid():
    """The fuzzing starts from valid jobs: otherwise every mutation would be tested against a broken one."""
    for name in fuzz_jobs.BASE_FILES:
        result = validate_job(name, static=True, env=fuzz_jobs.ENV)
        assert [p for p in result.problems if p.is_error] == [], name


def test_file_level_problems_carry_the_document_path(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: [unclosed\n")
    result = validate_job(str(path), static=True)
    assert [(p.code, p.path, p.line, p.column) for p in result.problems] == [("yaml-syntax", "(file)", 2, 1)]


def test_problem_checker_rejects_unlocated_problems():
    """The property itself can fail: a problem with no path or line 0 is reported."""
    good = Problem("error", "job.yaml", 3, 1, "train.steps", "out-of-range", "0 must be >= 1")
    no_path = Problem("error", "job.yaml", 3, 1, "", "out-of-range", "0 must be >= 1")
    line_zero = Problem("error", "job.yaml", 0, 1, "train", "out-of-range", "0 must be >= 1")
    assert fuzz_jobs.problem_failures([good]) == []
    assert len(fuzz_jobs.problem_failures([no_path, line_zero])) == 2
