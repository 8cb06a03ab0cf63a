"""$TPULAUNCH_FREEZE_AT: a process stops itself (SIGSTOP) at the moment it names, and only there; a value that names
no moment is said once, never silently ignored. Real child processes, the kernel's word that each stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import tpulaunch
from tpulaunch.run.freeze_points import FREEZE_AT_ENV

# Passes the points a save of step 10, then one of step 20, would pass, printing where it is.
PASSES = """
from tpulaunch.run.freeze_points import LEASE_TAKEN, MID_SAVE, freeze_point
for moment, step in [(LEASE_TAKEN, None), (MID_SAVE, 10), (MID_SAVE, 20), (MID_SAVE, 20)]:
    freeze_point(moment, step)
    print("passed", moment, step, flush=True)
"""


def _start(value: str, *, prelude: str = "", **env: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(Path(tpulaunch.__file__).parents[1]), **{FREEZE_AT_ENV: value}, **env)
    return subprocess.Popen([sys.executable, "-c", prelude + "\n" + PASSES], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize("value, passed", [("lease-taken", 0), ("mid-save@20", 2), ("mid-save@020", 2)])
def test_the_process_stops_itself_at_the_named_moment_once_and_goes_on_when_thawed(value, passed):
    child = _start(value)
    try:
        assert child.stderr.readline().strip() == f"frozen | {value.replace('@0', '@')}"
        _, status = os.waitpid(child.pid, os.WUNTRACED)  # the kernel's word: stopped, not ended
        assert os.WIFSTOPPED(status) and os.WSTOPSIG(status) == signal.SIGSTOP
        assert [child.stdout.readline() for _ in range(passed)] == [f"passed {m}\n" for m in
                                                                   ["lease-taken None", "mid-save 10"][:passed]]
        child.send_signal(signal.SIGCONT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert out.splitlines() == ["passed lease-taken None", "passed mid-save 10", "passed mid-save 20",
                                "passed mid-save 20"][passed:]
    assert child.returncode == 0 and err == ""  # the second save of step 20 passed by: frozen once


@pytest.mark.parametrize("value", ["mid-save", "mid-save@twenty", "mid-save@\u0662\u0660", "lease_taken"])
def test_a_value_that_names_no_moment_is_said_once_and_freezes_nothing(value):
    out, err = _start(value).communicate(timeout=60)
    assert len(out.splitlines()) == 4
    assert err.splitlines() == [f"warning: {FREEZE_AT_ENV}={value} names no moment (lease-taken, or mid-save@STEP "
                                "with a whole step); nothing is frozen"]


def test_a_worker_that_is_not_the_chief_passes_every_point():
    """Under MultiWorkerMirroredStrategy only the chief holds the lease and saves into model_dir; worker 1 saves
    into a scratch folder of its own and never freezes."""
    worker = '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 1}}'
    out, err = _start("mid-save@20", TF_CONFIG=worker).communicate(timeout=60)
    assert len(out.splitlines()) == 4 and err == ""


def test_pid_1_says_it_cannot_freeze_and_goes_on():
    """A container's entrypoint is PID 1, which the kernel does not stop with a signal it sends itself: said, not a
    silent run past the moment. The process is told it is PID 1 (`os.getpid`), as in a PID namespace of its own: a
    namespace needs privileges or user namespaces a CI machine may not give, and what the kernel does with the
    signal is not tpulaunch's to test."""
    out, err = _start("lease-taken", prelude="import os; os.getpid = lambda: 1").communicate(timeout=60)
    assert len(out.splitlines()) == 4
    assert err.splitlines() == [f"warning: {FREEZE_AT_ENV}=lease-taken: this process is PID 1 (a container's "
                                "entrypoint), which cannot stop itself; nothing is frozen (run it under an init: "
                                "docker run --init)"]
