"""How fast the CLI's TensorFlow-free path answers, as a ratio of `import tensorflow`.

Each command is timed as a fresh process (best of --repeat runs), in the same run as the baseline, so
the ratios hold on any machine. Goal: <= 0.05 for `--help` and `validate --static`.

    .venv/bin/python benchmarks/cli_speed.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "configs", "unet3d_ct.yaml")
GOAL = 0.05

COMMANDS = {
    "baseline: python -c 'import tensorflow'": [sys.executable, "-c", "import tensorflow"],
    "tpulaunch --help": [sys.executable, "-m", "tpulaunch", "--help"],
    "tpulaunch validate --static configs/unet3d_ct.yaml": [sys.executable, "-m", "tpulaunch", "validate", "--static", JOB],
    "tpulaunch plan --no-memory configs/unet3d_ct.yaml": [sys.executable, "-m", "tpulaunch", "plan", "--no-memory", JOB],

}


def best_of(command: list, repeat: int) -> float:
    times = []
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    results = {name: best_of(command, args.repeat) for name, command in COMMANDS.items()}
    baseline = next(iter(results.values()))
    failed = False
    print(f"{'command':<55} {'seconds':>8} {'ratio':>7}")
    for name, seconds in results.items():
        ratio = seconds / baseline
        mark = ""
        if not name.startswith("baseline"):
            mark = "ok" if ratio <= GOAL else f"over the {GOAL} goal"
            failed |= ratio > GOAL
        print(f"{name:<55} {seconds:8.3f} {ratio:7.3f} {mark}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
