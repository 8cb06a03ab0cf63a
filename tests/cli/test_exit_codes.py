"""Exit codes that tell a broken job from a broken tool: a job's problems exit 1, a fault of tpulaunch (or of a
library it called) exits 70 with one line, whatever command it happens in."""

from __future__ import annotations

from click.testing import CliRunner

from tpulaunch.cli.app import cli
from tpulaunch.cli.base import Context, command, pass_obj
from tpulaunch.errors import ExitCode


@command()
@pass_obj
def faulty(obj):
    """A command with a bug in it."""
    {}["missing"]


def test_an_internal_error_exits_70_with_one_line():
    result = CliRunner().invoke(faulty, [])
    assert result.exit_code == ExitCode.INTERNAL == 70
    assert result.stderr.splitlines() == [
        "error: unexpected KeyError: 'missing' (an internal error, exit code 70: rerun with --debug for the traceback "
        "and report it)"]


def test_debug_shows_an_internal_errors_traceback_then_its_line_and_exit_code():
    result = CliRunner().invoke(faulty, [], obj=Context(debug=True))
    assert result.exit_code == ExitCode.INTERNAL  # the traceback is the user's to report (a job's secrets masked)
    assert result.stderr.startswith("Traceback (most recent call last):") and "KeyError: 'missing'\n" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: unexpected KeyError: 'missing'")


def test_a_job_with_problems_exits_1_and_a_usage_error_2(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("name: x\nmodel: {builder: a:b}\n")
    assert CliRunner().invoke(cli, ["validate", "--static", str(job)]).exit_code == ExitCode.PROBLEMS == 1
    assert CliRunner().invoke(cli, ["validate", "--no-such-option", str(job)]).exit_code == ExitCode.USAGE == 2
