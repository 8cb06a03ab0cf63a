"""Two workers against one on this machine: `tpulaunch train` examples/s on the keras engine.

One job (the quickstart CNN, global batch 64, Adam, a checkpoint every 100 steps, synthetic TFRecords,
`run.engine: keras`) trained by one `tpulaunch train` process (TensorFlow's default strategy, one CPU
device) and by two processes with TF_CONFIG naming two workers on 127.0.0.1 (free ports):
MultiWorkerMirroredStrategy, each worker a replica with half the global batch, gradients all-reduced
over gRPC every step. Alternating (the order flips every round), --rounds each. The rate is the run
record's `steady_examples_per_s` (global batch; the training session's first step left out), the
chief's (worker 0) for two workers.

    PYTHONPATH=. .venv-keras/bin/python benchmarks/multi_worker.py [--steps 200] [--rounds 2]

No goal: on one machine both workers share its cores, so this measures what the all-reduce and the
second process cost, not a speed-up.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from tpulaunch.run.record import local_records  # noqa: E402
from cnn_job import cnn_job  # noqa: E402  (benchmarks/cnn_job.py: the job every training benchmark times)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    return dict(env, PYTHONPATH=ROOT, CI="1", PYTHONUNBUFFERED="1", TF_USE_LEGACY_KERAS="1",
                TF_CPP_MIN_LOG_LEVEL="2", **extra)


def _free_ports(n: int) -> list:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _record(model_dir: str) -> dict:
    return local_records(model_dir)[-1]


def train(python: str, job: str, model_dir: str, workers: int) -> dict:
    """`workers` `tpulaunch train` processes of one run; the chief's run record, with the wall seconds added."""
    command = [python, "-m", "tpulaunch", "train", job, "--model-dir", model_dir]
    started = time.perf_counter()
    if workers == 1:
        children = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=_env(), cwd=ROOT)]
    else:
        cluster = {"worker": [f"127.0.0.1:{port}" for port in _free_ports(workers)]}
        children = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                     env=_env(TF_CONFIG=json.dumps({"cluster": cluster,
                                                                    "task": {"type": "worker", "index": index}})))
                    for index in reversed(range(workers))]
    outputs = [child.communicate(timeout=1200) for child in children]
    wall = time.perf_counter() - started
    for child, (out, err) in zip(children, outputs):
        if child.returncode != 0:
            raise SystemExit(f"{workers} worker(s): exit {child.returncode}\n{out[-2000:]}\n{err[-3000:]}")
    return dict(_record(model_dir), process_s=wall)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="a Python with TensorFlow >= 2.16 and tf-keras")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    names = {1: "one process", 2: "two workers"}
    runs = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        subprocess.run([args.python, "-m", "tpulaunch", "data", "synth", "--example", "quickstart", data,
                        "--records", "1024"], check=True, capture_output=True, env=_env(), cwd=ROOT)
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as handle:
            handle.write(cnn_job("multi-worker-bench", data=data, model_dir=f"{tmp}/unused", steps=args.steps,
                                   run={"save_checkpoints_steps": 100, "engine": "keras"}))
        for round_ in range(args.rounds):
            for workers in ((1, 2) if round_ % 2 == 0 else (2, 1)):
                record = train(args.python, job, os.path.join(tmp, f"run-{workers}-{round_}"), workers)
                runs[workers].append(record)
                print(f"round {round_ + 1}: {names[workers]:<12} steady {record['steady_examples_per_s']:6.1f} "
                      f"examples/s  all steps {record['examples_per_s']:6.1f} examples/s  "
                      f"processes done in {record['process_s']:5.1f} s", flush=True)
    steady = {n: [r["steady_examples_per_s"] for r in rs] for n, rs in runs.items()}
    for workers, rates in steady.items():
        print(f"{names[workers]:<12} steady examples/s best {max(rates):6.1f} median {statistics.median(rates):6.1f} "
              f"(all: {', '.join(f'{r:.1f}' for r in rates)})")
    print(f"two workers / one process: {max(steady[2]) / max(steady[1]):.3f} (best/best), "
          f"{statistics.median(steady[2]) / statistics.median(steady[1]):.3f} (median/median); "
          f"{os.cpu_count()} CPU cores on this machine, shared by the workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
