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


# A command that needs more than this machine lets it have, run as a program of its own under a limit set in the child.
GREEDY = """
import os, sys
from tpulaunch.cli.base import command, pass_obj

@command()
@pass_obj
def greedy(obj):
    if sys.argv[1] == "files":
        kept = []
        while True:
            kept.append(open(os.devnull))
    bytearray(1 << 50)  # a petabyte

greedy([])
"""


def _greedy(what: str, limits: dict) -> "subprocess.CompletedProcess":
    import resource
    import subprocess
    import sys

    from paths import REPO

    def limit() -> None:
        for name, soft in limits.items():
            resource.setrlimit(name, (soft, resource.getrlimit(name)[1]))

    return subprocess.run([sys.executable, "-c", GREEDY, what], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, preexec_fn=limit)


def test_too_many_open_files_exits_1_naming_the_limit_and_the_fix():
    """A real EMFILE under `ulimit -n 64`: the limit as getrlimit reads it, and how to raise it; not exit 70."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    done = _greedy("files", {resource.RLIMIT_NOFILE: 64})
    assert done.returncode == ExitCode.PROBLEMS, done.stderr
    hard_text = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    more = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    assert done.stderr.splitlines() == [
        f"error: too many open files (this process may open 64 (ulimit -n 64; its hard limit is {hard_text})): "
        f"OSError: [Errno 24] Too many open files: '/dev/null'",
        f"  hint: raise the limit before running (ulimit -n {more}); "
        "or name fewer, larger data files"]


def test_a_memory_error_exits_1_naming_the_address_space_limit():
    """A real MemoryError under `ulimit -v 2000000`: the limit, in GiB and as ulimit writes it; not exit 70."""
    import resource

    done = _greedy("memory", {resource.RLIMIT_AS: 2000000 * 1024})
    assert done.returncode == ExitCode.PROBLEMS, done.stderr
    assert done.stderr.splitlines()[0] == ("error: out of memory under this process's address-space limit of 1.9 GiB "
                                           "(ulimit -v 2000000): MemoryError")


def _libtpu_without_a_tpu() -> str:
    """What libtpu itself says on a host with no TPU (this machine), from the suite's XLA environment (jax with
    libtpu: the `xla` session's, which every session that runs this makes first)."""
    import os
    import subprocess

    from paths import SUITE_XLA_PYTHON

    assert os.path.isfile(SUITE_XLA_PYTHON), f"XLA's TPU compiler is not installed at {SUITE_XLA_PYTHON}: `nox -s xla`"
    said = subprocess.run([SUITE_XLA_PYTHON, "-c", "import jax; jax.devices()"], capture_output=True, text=True,
                          env={"JAX_PLATFORMS": "tpu", "PATH": "/usr/bin:/bin"}, timeout=120)
    assert said.returncode != 0
    return [line for line in said.stderr.splitlines() if line.startswith("RuntimeError: ")][-1][len("RuntimeError: "):]


def _raising(message: str):
    @command()
    @pass_obj
    def failing(obj):
        raise RuntimeError(message)

    return failing


def test_a_host_whose_tpu_cannot_be_found_exits_3_which_run_recovers_from():
    """An infrastructure failure (the chips missing or held by another process), never exit 70: `run` recreates the
    VM, a JobSet restarts its pods (remote/causes.py)."""
    from tpulaunch.remote.causes import INFRASTRUCTURE, exit_cause

    message = _libtpu_without_a_tpu()
    assert "TPU initialization failed" in message
    result = CliRunner().invoke(_raising(message), [])
    assert result.exit_code == ExitCode.CLUSTER == 3
    assert result.stderr.startswith("error: this host's TPU cannot be used: Unable to initialize backend 'tpu'")
    assert exit_cause(result.exit_code) == INFRASTRUCTURE
    held = "TPU initialization failed: open(/dev/accel0): Device or resource busy; Couldn't open device: /dev/accel0"
    assert CliRunner().invoke(_raising(held), []).exit_code == 3
    assert CliRunner().invoke(_raising("Failed to open libtpu.so"), []).exit_code == 70  # not installed: not this
