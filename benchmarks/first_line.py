"""How soon `tpulaunch train` says something, and the longest silence before its first step, as CI sees it.

Runs `tpulaunch train JOB --local` as CI does (stdout a pipe, CI=1, no PYTHONUNBUFFERED), timestamps
each line as it arrives, and reports: the time from launch to the first line; to the line saying
TensorFlow is loading; to `train | start` (where the first line came before the phases were shown);
the longest gap between two lines before `train | start`; and, for scale, a bare `import tensorflow`.
Best (smallest) of --rounds fresh processes for each time.

    .venv/bin/python benchmarks/first_line.py [--rounds 3] [--steps 20]

Goal: the first line before TensorFlow is imported, well under a second after launch.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed_lines(command, env) -> list:
    """[(seconds since launch, line)] of the command's stdout, as the lines arrive."""
    launched = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    seen = [(time.perf_counter() - launched, line.rstrip("\n")) for line in child.stdout]
    if child.wait() != 0:
        raise SystemExit(f"{' '.join(command)} failed with exit code {child.returncode}")
    return seen


def one_round(job: str, model_dir: str, steps: int, env) -> dict:
    lines = timed_lines([sys.executable, "-m", "tpulaunch", "train", job, "--local", "--model-dir", model_dir,
                         "--set", f"train.steps={steps}", "--set", "eval=null"], env)
    start = next(i for i, (_, line) in enumerate(lines) if line.startswith("train | start"))
    gaps = [(lines[i][0] - lines[i - 1][0], lines[i - 1][1], lines[i][1]) for i in range(1, start + 1)]
    longest = max(gaps) if gaps else (lines[0][0], "(launch)", lines[0][1])
    loading = next(t for t, line in lines if line == "phase | load TensorFlow")
    return {"first": lines[0][0], "first_text": lines[0][1], "loading": loading, "start": lines[start][0],
            "silence": longest[0], "silence_between": (longest[1], longest[2])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env.update(CI="1", PYTHONPATH=os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")])))
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        subprocess.run([sys.executable, "-m", "tpulaunch", "data", "synth", "--example", "quickstart", data,
                        "--records", "512"], check=True, capture_output=True, env=env)
        job = os.path.join(tmp, "job.yaml")
        with open(os.path.join(ROOT, "configs", "quickstart.yaml")) as source, open(job, "w") as copy:
            copy.write(source.read().replace("../data/quickstart", data))
        rounds = [one_round(job, os.path.join(tmp, f"run{i}"), args.steps, env) for i in range(args.rounds)]
        imports = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import tensorflow"], check=True, capture_output=True, env=env)
            imports.append(time.perf_counter() - started)
    best = {key: min(r[key] for r in rounds) for key in ("first", "loading", "start", "silence")}
    worst_silence = max(rounds, key=lambda r: r["silence"])
    print(f"first line:                  {best['first']:.2f} s  ({rounds[0]['first_text']!r})")
    print(f"'phase | load TensorFlow':   {best['loading']:.2f} s")
    print(f"'train | start' (the first line before phases were shown): {best['start']:.2f} s")
    print(f"longest silence before the first step: {best['silence']:.2f} s (best round); "
          f"{worst_silence['silence']:.2f} s at worst, between {worst_silence['silence_between'][0]!r} and "
          f"{worst_silence['silence_between'][1]!r}")
    print(f"import tensorflow alone:     {min(imports):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
