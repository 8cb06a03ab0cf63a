"""How long a full `validate` takes, against `import tensorflow` and against `train`'s own start, in one run.

For each job, in fresh processes (a user's `tpulaunch validate JOB` starts one), taken in turn so that a drift
of the machine's speed hits all three alike: the wall time of `python -c "import tensorflow"` (the baseline every
TensorFlow check pays), of `tpulaunch validate JOB --local` (loading TensorFlow, the job's own code, the stopped
train/evaluate builds, the data sample) and of `tpulaunch train JOB --local` up to its first step (the process
started until its first `train | step` line, in a new model_dir; the process is then killed). The goal: a
pre-flight costs no more than train's own start (validate / first step <= 1). Medians of --runs runs.

    .venv/bin/python benchmarks/validate_time.py                      # quickstart, mnist_tpu, ResNet, TAPAS
    .venv/bin/python benchmarks/validate_time.py --runs 5 job.yaml   # any job files
"""

from __future__ import annotations

import argparse
import os
import signal
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "estimator" / "engine")]  # the reference programs' test modules


def wall(command: list, cwd: Path, env: dict) -> float:
    began = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1", **env})
    seconds = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stdout}{proc.stderr}")
    return seconds


def first_step(command: list, cwd: Path, env: dict) -> float:
    """Seconds from the process's start to its first `train | step` line; the process is then killed."""
    began = time.perf_counter()
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "NO_COLOR": "1", "CI": "1", "PYTHONUNBUFFERED": "1", **env},
                            start_new_session=True)
    for line in proc.stdout:
        if line.startswith("train | step "):
            seconds = time.perf_counter() - began
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return seconds
    proc.wait()
    raise SystemExit(f"{' '.join(command)} never reached a step (exit {proc.returncode}):\n{proc.stderr.read()}")


# TAPAS's protobuf modules need the pure-Python protobuf (tests/estimator/engine/test_reference_programs.py): its baseline too.
PURE_PYTHON_PROTOBUF = {"PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}


def default_jobs(scratch: Path) -> list:
    """(job, environment): the quickstart job on its synthesized data, tensorflow/tpu's mnist_tpu.py and ResNet
    (the originals in tests/programs/tensorflow_tpu), and google-research/tapas's pre-training
    (tests/programs/requirements.txt), each as its test writes it."""
    import own_programs
    import test_reference_programs
    import test_reference_resnet

    subprocess.run([sys.executable, "-m", "tpulaunch", "data", "synth", "--example", "quickstart",
                    str(ROOT / "data" / "quickstart")], check=True, capture_output=True)
    (scratch / "own_program").mkdir()
    own = own_programs.write_project(scratch / "own_program")
    (scratch / "resnet").mkdir()
    resnet = test_reference_resnet.write_project(scratch / "resnet")
    (scratch / "tapas").mkdir()
    tapas = test_reference_programs.write_project(scratch / "tapas")
    return [(ROOT / "configs" / "quickstart.yaml", {}), (own / "job.yaml", {}), (resnet / "job.yaml", {}),
            (tapas / "job.yaml", PURE_PYTHON_PROTOBUF)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jobs", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="validate-time-"))
    try:
        jobs = [(job.resolve(), {}) for job in args.jobs] or default_jobs(scratch)
        print(f"{'job':<40} {'import tensorflow':>18} {'validate':>10} {'train: 1st step':>16} "
              f"{'validate/import':>16} {'validate/1st step':>18}")
        for job, env in jobs:
            imports, validates, starts = [], [], []
            for run in range(args.runs):
                imports.append(wall([sys.executable, "-c", "import tensorflow"], job.parent, env))
                validates.append(wall([sys.executable, "-m", "tpulaunch", "validate", str(job), "--local"],
                                      job.parent, env))
                starts.append(first_step([sys.executable, "-m", "tpulaunch", "train", str(job), "--local",
                                          "--model-dir", str(scratch / "runs" / f"{job.parent.name}-{run}")],
                                         job.parent, env))
            baseline, validate, start = (statistics.median(x) for x in (imports, validates, starts))
            name = f"{job.parent.name}/{job.name}"
            print(f"{name:<40} {baseline:>16.2f} s {validate:>8.2f} s {start:>14.2f} s {validate / baseline:>15.2f}x "
                  f"{validate / start:>17.2f}x", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
