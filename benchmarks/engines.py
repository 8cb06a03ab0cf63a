"""The keras engine against the estimator engine: `tpulaunch train` of one job under each, steady steps/s.

One job (the quickstart CNN, batch 64, Adam, a checkpoint every 100 steps, synthetic TFRecords), trained
by fresh `tpulaunch train JOB --set run.engine=...` processes: the estimator engine (TPUEstimator) under
TensorFlow 2.15's venv, the keras engine (tf-keras + tf.distribute) under TensorFlow 2.21's, alternating
(the order flips every round), --rounds each. The rate is each run's own run record
(`MODEL_DIR/tpulaunch-runs.jsonl`): `steady_examples_per_s` (the training session's first step, with its
start-up, left out) over `batch_size`; also shown: `steps_per_s` (every step) and the process's wall time.

    PYTHONPATH=. .venv-keras/bin/python benchmarks/engines.py \\
        [--estimator-python .venv/bin/python] [--keras-python .venv-keras/bin/python] [--steps 300] [--rounds 3]

No goal: the two engines run different TensorFlow versions and different programs (graph sessions vs
tf.function); this says how they compare on this machine.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from tpulaunch.run.record import local_records  # noqa: E402
from cnn_job import cnn_job  # noqa: E402  (benchmarks/cnn_job.py: the job every training benchmark times)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(engine: str = "keras") -> dict:
    """The child's environment: TF_USE_LEGACY_KERAS only for the keras engine (TensorFlow 2.15's tf.keras is Keras 2
    already; with the variable set it looks for the tf_keras package, which its venv need not have)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TF_USE_LEGACY_KERAS")}
    env = dict(env, PYTHONPATH=ROOT, CI="1", PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
    if engine == "keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    return env


def train(python: str, job: str, engine: str, model_dir: str) -> dict:
    """One `tpulaunch train` process; its run record, with the process's wall seconds added."""
    started = time.perf_counter()
    done = subprocess.run([python, "-m", "tpulaunch", "train", job, "--set", f"run.engine={engine}",
                           "--model-dir", model_dir], capture_output=True, text=True, env=_env(engine), cwd=ROOT)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{engine}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    record = local_records(model_dir)[-1]
    return dict(record, process_s=wall)


def _default(venv: str) -> str:
    path = os.path.join(ROOT, venv, "bin", "python")
    return path if os.path.exists(path) else sys.executable


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--estimator-python", default=_default(".venv"), help="a Python with TensorFlow 2.15")
    parser.add_argument("--keras-python", default=_default(".venv-keras"), help="a Python with TensorFlow >= 2.16")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    pythons = {"estimator": args.estimator_python, "keras": args.keras_python}
    runs = {engine: [] for engine in pythons}
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        subprocess.run([args.keras_python, "-m", "tpulaunch", "data", "synth", "--example", "quickstart", data,
                        "--records", "1024"], check=True, capture_output=True, env=_env(), cwd=ROOT)
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as handle:
            handle.write(cnn_job("engines-bench", data=data, model_dir=f"{tmp}/unused", steps=args.steps,
                                   run={"save_checkpoints_steps": 100, "engine": "keras"}))
        for round_ in range(args.rounds):
            order = list(pythons) if round_ % 2 == 0 else list(pythons)[::-1]
            for engine in order:
                record = train(pythons[engine], job, engine, os.path.join(tmp, f"run-{engine}-{round_}"))
                runs[engine].append(record)
                print(f"round {round_ + 1}: {engine:<9} TF {record['versions']['tensorflow']:<7} steady "
                      f"{record['steady_examples_per_s'] / record['batch_size']:6.2f} steps/s  all steps "
                      f"{record['steps_per_s']:6.2f} steps/s  process {record['process_s']:5.1f} s", flush=True)
    steady = {e: [r["steady_examples_per_s"] / r["batch_size"] for r in rs] for e, rs in runs.items()}
    for engine, rates in steady.items():
        walls = [r["process_s"] for r in runs[engine]]
        print(f"{engine:<9} steady steps/s best {max(rates):6.2f} median {statistics.median(rates):6.2f} "
              f"(all: {', '.join(f'{r:.2f}' for r in rates)}); process seconds median {statistics.median(walls):.1f}")
    ratios = [k / e for k, e in zip(steady["keras"], steady["estimator"])]
    print(f"keras / estimator steady steps/s: per round {', '.join(f'{r:.3f}' for r in ratios)}; "
          f"best/best {max(steady['keras']) / max(steady['estimator']):.3f}; median {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
