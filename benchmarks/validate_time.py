"""How long a full `validate` takes, against `import tensorflow` measured in the same run.

For each job, in fresh processes (a user's `tpulaunch validate JOB` starts one): the wall time of
`python -c "import tensorflow"` (the baseline every TensorFlow check pays) and of `tpulaunch validate
JOB` (loading TensorFlow, the job's own code, the stopped train/evaluate builds, the data sample). The
ratio says what validate costs on top of loading TensorFlow. Medians of --runs runs.

    .venv/bin/python benchmarks/validate_time.py                      # quickstart and the own-program job
    .venv/bin/python benchmarks/validate_time.py --runs 5 job.yaml   # any job files
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def wall(command: list, cwd: Path) -> float:
    began = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"})
    seconds = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stdout}{proc.stderr}")
    return seconds


def default_jobs(scratch: Path) -> list:
    """The quickstart job on its synthesized data, and the own-program (model_fn + input_fn) job of the tests."""
    import test_own_program

    subprocess.run([sys.executable, "-m", "tpulaunch", "data", "synth", "--example", "quickstart",
                    str(ROOT / "data" / "quickstart")], check=True, capture_output=True)
    own = test_own_program.write_project(scratch / "own_program")
    return [ROOT / "configs" / "quickstart.yaml", own / "job.yaml"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jobs", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="validate-time-"))
    try:
        jobs = [job.resolve() for job in args.jobs] or default_jobs(scratch)
        print(f"{'job':<40} {'import tensorflow':>18} {'validate':>10} {'ratio':>7}")
        for job in jobs:
            baseline = statistics.median(wall([sys.executable, "-c", "import tensorflow"], job.parent)
                                         for _ in range(args.runs))
            validate = statistics.median(wall([sys.executable, "-m", "tpulaunch", "validate", str(job)], job.parent)
                                         for _ in range(args.runs))
            name = job.name if job.parent != ROOT / "configs" else f"configs/{job.name}"
            print(f"{name:<40} {baseline:>16.2f} s {validate:>8.2f} s {validate / baseline:>6.2f}x")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
