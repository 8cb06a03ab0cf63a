"""How long `tpulaunch validate --tf` takes for the UNet3D example job on a v3-32, TensorFlow import included.

TensorFlow's own TPUEstimator builds the job's train and eval graphs (the 256^3 UNet3D, 16-way
partitioned) on this machine. Each command runs as a fresh process (best of --repeat runs), beside the
`import tensorflow` baseline measured in the same run. Goal: under 15 s on 2 CPU cores.

    .venv/bin/python benchmarks/tf_check_speed.py [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import sys

from cli_speed import run_once  # one fresh process, timed (this script's folder is on sys.path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "configs", "unet3d_ct.yaml")
GOAL_SECONDS = 15.0

BASELINE = ["-c", "import tensorflow"]  # run_once adds the interpreter
CHECK = ["-m", "tpulaunch", "validate", JOB, "--static", "--tf"]


def best_of(command: list, repeat: int) -> float:
    return min(run_once(command) for _ in range(repeat))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    baseline = best_of(BASELINE, args.repeat)
    check = best_of(CHECK, args.repeat)
    print(f"{'command':<62} {'seconds':>8} {'vs import':>9}")
    print(f"{'baseline: python -c import tensorflow':<62} {baseline:8.2f} {1.0:9.2f}")
    verdict = "ok" if check < GOAL_SECONDS else f"over the {GOAL_SECONDS:.0f} s goal"
    print(f"{'tpulaunch validate configs/unet3d_ct.yaml --static --tf':<62} {check:8.2f} {check / baseline:9.2f} {verdict}")
    return 0 if check < GOAL_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
