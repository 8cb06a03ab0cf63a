"""How long a `tpulaunch train` process takes to exit after its last line, with and without the collector's walk
spared (`tf_env.skip_collection_at_exit`).

Each round runs the same short `tpulaunch train` twice, in fresh processes, the order flipping every round: as it
ships, and with that exit handler left unregistered (the flag it sets, set first), which is how every process
exited before. A round times the seconds from the `done` line on stdout to the process's end, and the whole process.
The job: the quickstart CNN (benchmarks/cnn_job.py) on `tpulaunch data synth --example quickstart` records, 4 steps,
on the engine --engine names, in the Python this runs under.

    PYTHONPATH=. .venv/bin/python benchmarks/exit_time.py [--rounds 3]                      # the estimator engine
    PYTHONPATH=. .venv-keras/bin/python benchmarks/exit_time.py --engine jax [--rounds 3]

No goal: docs/performance.md holds what it measured.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cnn_job import cnn_job  # noqa: E402  (the job every training benchmark times)
from jax_vs_keras import ROOT, _env  # noqa: E402  (the child's environment)

SHIPPED = ["-m", "tpulaunch"]
# The same CLI with the exit handler's flag set before main() runs, so it never registers, as before it existed; and
# the suite's own (a .pth line in the environments nox makes) taken back.
WALKED = ["-c", "import atexit, gc, sys, tpulaunch.tf_env as t; t._collection_skipped_at_exit = True; "
                "atexit.unregister(gc.freeze); from tpulaunch.cli.app import main; main(sys.argv[1:])"]


def one_exit(command: list, job: str, model_dir: str) -> tuple:
    """(seconds from the `done` line to the exit, the process's seconds) of one `tpulaunch train`."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, *command, "train", job, "--model-dir", model_dir],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env(), cwd=ROOT)
    done_at = None
    for line in child.stdout:
        if line.startswith("done |"):
            done_at = time.perf_counter()
    if child.wait() != 0 or done_at is None:
        raise SystemExit(f"train exited {child.returncode} without its done line")
    ended = time.perf_counter()
    return ended - done_at, ended - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine", default="estimator")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tpulaunch-exit-") as scratch:
        data = os.path.join(scratch, "data")
        subprocess.run([sys.executable, "-m", "tpulaunch", "data", "synth", "--example", "quickstart", data,
                        "--records", "256"], check=True, capture_output=True, env=_env(), cwd=ROOT)
        times = {"as shipped": [], "collector's walk": []}
        for round_ in range(args.rounds):
            order = [("as shipped", SHIPPED), ("collector's walk", WALKED)]
            for name, command in order if round_ % 2 == 0 else order[::-1]:
                model_dir = os.path.join(scratch, f"run-{round_}-{len(times[name])}-{name[0]}")
                job = os.path.join(scratch, f"job-{round_}-{name[0]}.yaml")
                with open(job, "w") as f:
                    f.write(cnn_job("exit", data=data, model_dir=model_dir, steps=4, batch=8,
                                    run={"engine": args.engine}))
                times[name].append(one_exit(command, job, model_dir))
        for name, rounds in times.items():
            exits, wholes = [r[0] for r in rounds], [r[1] for r in rounds]
            print(f"{name:16s} exit after the done line: median {statistics.median(exits):.2f} s "
                  f"({', '.join(f'{e:.2f}' for e in exits)}); whole process median {statistics.median(wholes):.2f} s")


if __name__ == "__main__":
    main()
