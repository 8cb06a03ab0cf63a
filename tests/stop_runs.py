"""Helpers for the tests of a stop that a step cannot wait for, and of the machine's limits (all three engines): a
data file that becomes a FIFO nobody writes, a wait for the run's input to block on it, a child under an
address-space limit, and what a run that ended leaves in model_dir."""

from __future__ import annotations

import glob
import json
import os
import resource
import time
from pathlib import Path

from lease_runs import Run
from tpulaunch.run import lease as leases
from tpulaunch.run.record import RECORD_FILE

# The reason a run stopped where it was gives, in its record and on stderr (the grace the tests set: 2 s).
GRACE_S = "2"
STUCK = "the step did not return within 2 s of SIGINT (waiting on its input, a store or a collective?)"


def become_fifo(path: Path) -> None:
    """Put a FIFO nobody writes where the regular file `path` was (the run's next open of it blocks)."""
    fifo = path.with_name(path.name + ".fifo")
    os.mkfifo(fifo)
    os.replace(fifo, path)


def wait_blocked_opening_a_fifo(run: Run, limit_s: float = 300) -> None:
    """Until one of the run's threads sleeps in the kernel opening a FIFO for want of a writer (its wchan).

    Polled every 10 ms: the event is the thread's state, which no file or line announces."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert run.process.poll() is None, "exited before its input blocked:\n" + run.text()
        for wchan in glob.glob(f"/proc/{run.pid}/task/*/wchan"):
            try:
                with open(wchan) as handle:
                    if handle.read().strip() in ("wait_for_partner", "fifo_open"):
                        return
            except OSError:  # the thread ended as it was read
                pass
        time.sleep(0.01)
    raise AssertionError("the run's input never blocked on the FIFO:\n" + run.text())


def address_space_limit(kib: int):
    """A preexec_fn: the child runs under `ulimit -v KIB`."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (kib * 1024, resource.RLIM_INFINITY))

    return limit


def records(model_dir: Path) -> list:
    return [json.loads(line) for line in (model_dir / RECORD_FILE).read_text().splitlines()]


def assert_ended_whole(run: Run, model_dir: Path, outcome: str) -> None:
    """The run's last record line says `outcome` (under its lease's run id) and its lease is released."""
    lease = leases.read_lease(str(model_dir))
    assert (lease["state"], lease["pid"]) == ("released", run.pid), lease
    last = records(model_dir)[-1]
    assert (last["run_id"], last["outcome"]) == (lease["run_id"], outcome), last
