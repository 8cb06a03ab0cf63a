"""How fast the CLI's TensorFlow-free path answers, as a ratio of `import tensorflow`.

Each command runs as a fresh process, round-robin with the baseline in the same run (so a machine
that gets busier or quieter part-way through moves both), and the best of --repeat runs counts: the
ratios hold on any machine. tpulaunch's modules are byte-compiled first, as `pip install` leaves them
(with PYTHONDONTWRITEBYTECODE set, every run would otherwise compile them from source). Goal: <= 0.05.

    .venv/bin/python benchmarks/cli_speed.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import compileall
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = "configs/unet3d_ct.yaml"
GOAL = 0.05
BASELINE = "python -c 'import tensorflow'"
# What `validate --static` cannot go below while it parses with click, reads YAML with PyYAML and
# validates with pydantic: importing them and building one model (pydantic loads most of itself then).
LIBRARIES = "import click, yaml, pydantic\nclass M(pydantic.BaseModel):\n    x: int = pydantic.Field(1, ge=1)"

COMMANDS = {
    BASELINE: ["-c", "import tensorflow"],
    "python -c pass (the interpreter alone)": ["-c", "pass"],
    "click + PyYAML + a one-field pydantic model": ["-c", LIBRARIES],
    "tpulaunch --help": ["-m", "tpulaunch", "--help"],
    f"tpulaunch validate --static {JOB}": ["-m", "tpulaunch", "validate", "--static", JOB],
    f"tpulaunch plan --no-memory {JOB}": ["-m", "tpulaunch", "plan", "--no-memory", JOB],
    "tpulaunch schema": ["-m", "tpulaunch", "schema"],
}


def run_once(args: list) -> float:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    started = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    compileall.compile_dir(os.path.join(ROOT, "tpulaunch"), quiet=1)
    times: dict = {name: [] for name in COMMANDS}
    for name, command in COMMANDS.items():
        run_once(command)  # warm the file cache
    for _ in range(args.repeat):
        for name, command in COMMANDS.items():
            times[name].append(run_once(command))
    best = {name: min(runs) for name, runs in times.items()}
    baseline = best[BASELINE]
    failed = False
    print(f"{'command':<55} {'seconds':>8} {'ratio':>7}")
    for name, seconds in best.items():
        ratio = seconds / baseline
        mark = ""
        if name.startswith("tpulaunch"):
            mark = "ok" if ratio <= GOAL else f"over the {GOAL} goal"
            failed |= ratio > GOAL
        print(f"{name:<55} {seconds:8.3f} {ratio:7.3f} {mark}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
