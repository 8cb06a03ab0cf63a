"""What `run.seed` costs: `tpulaunch train` of one Keras 3 model with and without a seed, per engine, steady steps/s.

With `run.seed` the input pipeline is deterministic (its shuffles seeded, its parallel reads and parses handing out
their results in order: `portable.make_dataset_fn`), so a seeded run may wait on a slow record where an unseeded one
takes whichever is ready. This times both, on the jax and the keras engine: the quickstart CNN written with Keras 3
(benchmarks/jax_vs_keras.py's) on `tpulaunch data synth --example quickstart` records, batch 64, shuffle buffer
1024, fresh `tpulaunch train` processes alternating (the order flips every round), --rounds each, on this machine's
CPU (one device). The rate is each run's record: `steady_examples_per_s` (the first step, with its start-up and
XLA's compile, left out) over `batch_size`. `--pipeline` times the input pipeline alone instead (`tpulaunch data
bench --local --seconds S`, examples/s, the same job, seeded and not, alternating): where the seed's cost comes
from, without the model's step beside it.

    PYTHONPATH=. .venv-keras/bin/python benchmarks/seeded_runs.py [--engines jax,keras] [--rounds 2] [--steps 200]
        [--pipeline [--seconds 10]]

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
from cnn_job import cnn_job  # noqa: E402  (benchmarks/cnn_job.py: the job every training benchmark times)
from jax_vs_keras import NETWORK, ROOT, _env  # noqa: E402  (the Keras 3 quickstart CNN; the child's environment)

SEED = 7


def train(job: str, engine: str, seeded: bool, model_dir: str) -> float:
    """One `tpulaunch train` process; its steady steps/s from its run record."""
    from tpulaunch.run.record import local_records

    sets = ["--set", f"run.engine={engine}", "--set", "data.shuffle_buffer=1024"]
    sets += ["--set", f"run.seed={SEED}"] if seeded else []
    done = subprocess.run([sys.executable, "-m", "tpulaunch", "train", job, *sets, "--model-dir", model_dir],
                          capture_output=True, text=True, env=_env(), cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{engine}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    record = local_records(model_dir)[-1]
    return record["steady_examples_per_s"] / record["batch_size"]


def pipeline_rate(job: str, seeded: bool, seconds: float) -> float:
    """One `tpulaunch data bench` process: the train pipeline's examples/s."""
    import json

    sets = ["--set", "data.shuffle_buffer=1024"] + (["--set", f"run.seed={SEED}"] if seeded else [])
    done = subprocess.run([sys.executable, "-m", "tpulaunch", "data", "bench", job, "--local", "--seconds",
                           str(seconds), "--format", "json", *sets], capture_output=True, text=True, env=_env(),
                          cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"data bench: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)["examples_per_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="jax,keras")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pipeline", action="store_true", help="time the input pipeline alone (data bench)")
    parser.add_argument("--seconds", type=float, default=10.0, help="each data bench's seconds")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPU cores; load average before: {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "quickstart")
        subprocess.run([sys.executable, "-m", "tpulaunch", "data", "synth", "--example", "quickstart", data,
                        "--records", "1024"], check=True, capture_output=True, env=_env(), cwd=ROOT)
        with open(os.path.join(tmp, "keras3_cnn.py"), "w") as handle:
            handle.write("import keras\n" + NETWORK)
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as handle:
            handle.write(cnn_job("seeded-runs", builder="keras3_cnn:build", data=data, model_dir=f"{tmp}/unused",
                                 steps=args.steps, run={"save_checkpoints_steps": 100}))
        if args.pipeline:
            rates = {False: [], True: []}
            for round_ in range(args.rounds):
                for seeded in ((False, True) if round_ % 2 == 0 else (True, False)):
                    rates[seeded].append(pipeline_rate(job, seeded, args.seconds))
                    print(f"pipeline round {round_ + 1}: {'seeded' if seeded else 'no seed':<8} "
                          f"{rates[seeded][-1]:9.0f} examples/s", flush=True)
            plain, seeded = statistics.median(rates[False]), statistics.median(rates[True])
            print(f"pipeline: median examples/s: no seed {plain:.0f}, seeded {seeded:.0f}: seeded / no seed "
                  f"{seeded / plain:.3f}", flush=True)
        for engine in ([] if args.pipeline else args.engines.split(",")):
            rates = {False: [], True: []}
            for round_ in range(args.rounds):
                for seeded in ((False, True) if round_ % 2 == 0 else (True, False)):
                    began = time.perf_counter()
                    rate = train(job, engine, seeded, os.path.join(tmp, f"run-{engine}-{seeded}-{round_}"))
                    rates[seeded].append(rate)
                    print(f"{engine} round {round_ + 1}: {'seeded' if seeded else 'no seed':<8} steady {rate:7.2f} "
                          f"steps/s (process {time.perf_counter() - began:.0f} s)", flush=True)
            plain, seeded = statistics.median(rates[False]), statistics.median(rates[True])
            print(f"{engine}: median steady steps/s: no seed {plain:.2f}, seeded {seeded:.2f}: seeded / no seed "
                  f"{seeded / plain:.3f}", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
