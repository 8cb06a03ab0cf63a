"""`tpulaunch plan` with XLA's answer, twice on one unchanged job: the first compiles, the second answers from the
cache (`plan/xla_tpu.py`). Prints each run's wall time and how many compiles it started.

    TPULAUNCH_XLA_PYTHON=.venv-xla/bin/python .venv/bin/python benchmarks/plan_cache.py [JOB.yaml] [--set K=V]...

Without a job: the quickstart CNN as a v3-8 job at train.batch_size 64 (8 examples per core). The cache is a fresh
folder of its own (TPULAUNCH_CACHE), removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART_ON_V3 = ["--set", "tpu={type: v3-8, name: t, zone: europe-west4-a, project: p}", "--set",
                    "data.train=gs://my-bucket/train-*.tfrecord", "--set", "data.eval=gs://my-bucket/eval-*.tfrecord",
                    "--set", "run.model_dir=gs://my-bucket/run"]


def main() -> None:
    args = sys.argv[1:] or [os.path.join(ROOT, "configs", "quickstart.yaml"), *QUICKSTART_ON_V3]
    real = os.environ.get("TPULAUNCH_XLA_PYTHON") or os.path.join(ROOT, ".venv-xla", "bin", "python")
    folder = tempfile.mkdtemp(prefix="tpulaunch-plan-cache-")
    log = os.path.join(folder, "starts.log")
    wrapper = os.path.join(folder, "xla-python")  # logs each start of the compiler's interpreter
    with open(wrapper, "w") as f:
        f.write(f'#!/bin/sh\necho "$@" >> {log}\nexec {real} "$@"\n')
    os.chmod(wrapper, 0o755)
    env = dict(os.environ, TPULAUNCH_XLA_PYTHON=wrapper, TPULAUNCH_CACHE=os.path.join(folder, "cache"))
    try:
        for run in ("first", "second"):
            before = _compiles(log)
            started = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "tpulaunch", "plan", *args], capture_output=True, text=True,
                                  env=env, cwd=ROOT)
            seconds = time.monotonic() - started
            if done.returncode:
                sys.exit(done.stdout[-2000:] + done.stderr[-2000:])
            print(f"{run} plan: {seconds:.1f} s, {_compiles(log) - before} compile(s) started", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _compiles(log: str) -> int:
    if not os.path.exists(log):
        return 0
    with open(log) as f:
        return sum("xla_compile import main" in line for line in f)


if __name__ == "__main__":
    main()
