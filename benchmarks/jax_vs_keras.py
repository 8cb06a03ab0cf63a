"""The jax engine against the keras engine: `tpulaunch train` of one Keras 3 model under each, steady steps/s.

Two jobs, each trained by fresh `tpulaunch train JOB --set run.engine=jax|keras` processes in one environment
(Keras 3 on JAX for the jax engine; Keras 3 on TensorFlow with tf.distribute for the keras engine), alternating
(the order flips every round), --rounds each, on this machine's CPU (one device each):

- quickstart: the quickstart CNN written with Keras 3 (benchmarks/keras3_vs_tf_keras.py's NETWORK) on
  `tpulaunch data synth --example quickstart` records, batch 64, Adam 0.003, a checkpoint every 100 steps;
- unet3d: a small UNet3D-style network written with Keras 3 (two 3-D conv stages down of 8 and 16 filters, 32 at
  the bottom, transposed convolutions and skip connections up, a per-voxel classifier of 3 classes) on
  `tpulaunch data synth --example unet3d --size 32` volumes (32x32x32x1, masks 32x32x32), batch 2, Adam 1e-3.

The rate is each run's own run record (`MODEL_DIR/tpulaunch-runs.jsonl`): `steady_examples_per_s` (the
training session's first step, with its start-up and XLA's compile, left out) over `batch_size`; also shown:
the process's wall time.

    PYTHONPATH=. .venv-keras/bin/python benchmarks/jax_vs_keras.py [--job quickstart|unet3d|both] [--rounds 2]
        [--steps 200] [--unet-steps 40]

No goal: this says how the two engines compare on this machine.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINES = ("jax", "keras")

# The quickstart CNN's one source text, read without importing its module (which loads TensorFlow).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "keras3_vs_tf_keras.py")) as _source:
    _text = _source.read()
NETWORK = _text[_text.index("NETWORK = '''") + len("NETWORK = '''"):_text.index("'''\nMODULES")]

UNET3D = '''
import keras


def build(num_classes=3, input_shape=(32, 32, 32, 1), filters=8):
    volume = keras.Input(shape=tuple(input_shape), name="image")
    x, skips = volume, []
    for width in (filters, 2 * filters):
        x = keras.layers.Conv3D(width, 3, padding="same", activation="relu")(x)
        x = keras.layers.Conv3D(width, 3, padding="same", activation="relu")(x)
        skips.append(x)
        x = keras.layers.MaxPooling3D(2)(x)
    x = keras.layers.Conv3D(4 * filters, 3, padding="same", activation="relu")(x)
    for width, skip in zip((2 * filters, filters), reversed(skips)):
        x = keras.layers.Conv3DTranspose(width, 2, strides=2, padding="same")(x)
        x = keras.layers.Concatenate()([x, skip])
        x = keras.layers.Conv3D(width, 3, padding="same", activation="relu")(x)
    return keras.Model(volume, keras.layers.Conv3D(num_classes, 1)(x))
'''


def unet3d_job(data: str, model_dir: str, steps: int) -> str:
    return f"""\
name: unet3d-style
model:
  builder: keras3_unet3d:build
  params: {{num_classes: 3}}
  loss: sparse_categorical_crossentropy
  optimizer: {{name: adam, learning_rate: 1.0e-3}}
data:
  train: {data}/train-*.tfrecord
  features:
    image: {{shape: [32, 32, 32, 1], dtype: float32, encoding: raw}}
  labels:
    mask: {{shape: [32, 32, 32], dtype: uint8, encoding: raw}}
train: {{batch_size: 2, steps: {steps}}}
run: {{model_dir: {model_dir}, save_checkpoints_steps: {max(steps // 2, 1)}}}
"""


def _env() -> dict:
    """The child's environment: Keras 3 chooses its backend per engine (the jax engine sets KERAS_BACKEND itself)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "KERAS_BACKEND", "XLA_FLAGS")}
    return dict(env, PYTHONPATH=ROOT, CI="1", PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")


def train(job: str, engine: str, model_dir: str) -> dict:
    """One `tpulaunch train` process; its run record, with the process's wall seconds added."""
    from tpulaunch.run.record import local_records

    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tpulaunch", "train", job, "--set", f"run.engine={engine}",
                           "--model-dir", model_dir], capture_output=True, text=True, env=_env(), cwd=ROOT)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{engine}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return dict(local_records(model_dir)[-1], process_s=wall)


def compare(name: str, job: str, rounds: int, tmp: str) -> None:
    runs = {engine: [] for engine in ENGINES}
    for round_ in range(rounds):
        for engine in (ENGINES if round_ % 2 == 0 else ENGINES[::-1]):
            record = train(job, engine, os.path.join(tmp, f"run-{name}-{engine}-{round_}"))
            runs[engine].append(record)
            print(f"{name} round {round_ + 1}: {engine:<5} steady {record['steady_examples_per_s'] / record['batch_size']:7.2f} "
                  f"steps/s  all steps {record['steps_per_s']:7.2f} steps/s  process {record['process_s']:5.1f} s",
                  flush=True)
    steady = {e: [r["steady_examples_per_s"] / r["batch_size"] for r in rs] for e, rs in runs.items()}
    for engine, rates in steady.items():
        walls = [r["process_s"] for r in runs[engine]]
        print(f"{name}: {engine:<5} steady steps/s best {max(rates):7.2f} median {statistics.median(rates):7.2f} "
              f"(all: {', '.join(f'{r:.2f}' for r in rates)}); process seconds median {statistics.median(walls):.1f}")
    ratios = [j / k for j, k in zip(steady["jax"], steady["keras"])]
    print(f"{name}: jax / keras steady steps/s: per round {', '.join(f'{r:.3f}' for r in ratios)}; "
          f"best/best {max(steady['jax']) / max(steady['keras']):.3f}; median {statistics.median(ratios):.3f}",
          flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", choices=("quickstart", "unet3d", "both"), default="both")
    parser.add_argument("--steps", type=int, default=200, help="the quickstart job's steps")
    parser.add_argument("--unet-steps", type=int, default=40, help="the unet3d job's steps")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPU cores; load average before: {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        synth = [sys.executable, "-m", "tpulaunch", "data", "synth"]
        if args.job in ("quickstart", "both"):
            data = os.path.join(tmp, "quickstart")
            subprocess.run([*synth, "--example", "quickstart", data, "--records", "1024"], check=True,
                           capture_output=True, env=_env(), cwd=ROOT)
            with open(os.path.join(tmp, "keras3_cnn.py"), "w") as handle:
                handle.write("import keras\n" + NETWORK)
            job = os.path.join(tmp, "quickstart.yaml")
            with open(job, "w") as handle:
                handle.write(cnn_job("jax-vs-keras", builder="keras3_cnn:build", data=data, model_dir=f"{tmp}/unused",
                                     steps=args.steps, run={"save_checkpoints_steps": 100}))
            compare("quickstart", job, args.rounds, tmp)
        if args.job in ("unet3d", "both"):
            data = os.path.join(tmp, "unet3d")
            subprocess.run([*synth, "--example", "unet3d", data, "--size", "32", "--records", "16"], check=True,
                           capture_output=True, env=_env(), cwd=ROOT)
            with open(os.path.join(tmp, "keras3_unet3d.py"), "w") as handle:
                handle.write(UNET3D)
            job = os.path.join(tmp, "unet3d.yaml")
            with open(job, "w") as handle:
                handle.write(unet3d_job(data, f"{tmp}/unused", args.unet_steps))
            compare("unet3d", job, args.rounds, tmp)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
