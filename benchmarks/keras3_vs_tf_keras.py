"""`tpulaunch train` on the keras engine: a Keras 3 model vs the same network written with tf-keras, steps/s.

One job (benchmarks/keras_engine.py's: 32x32x3 synthetic TFRecords, batch 64, Adam 0.003, a checkpoint
every --save-every steps), two builders of one network, the quickstart CNN (three conv/pool stages of 32,
64 and 128 filters, global average pooling, a dense classifier of logits): one written with `import
keras` (Keras 3), one with `import tf_keras as keras`, from the same source text. Each is trained by
`tpulaunch.engine.keras.runner.train` in this process, alternating (the order flips every round), on
this machine's CPU; the engine's own step trains both, with its Keras's optimizer, loss and metrics.

The rate is benchmarks/keras_engine.py's steady one: (N - K) / (time of step N's end - time of step K's
end), K = --skip, N = --steps, step ends taken when the recorder emits each `StepsRun` event.

    PYTHONPATH=. .venv-keras/bin/python benchmarks/keras3_vs_tf_keras.py [--steps 200] [--rounds 3] [--skip 20]

It also prints each side's CPU ms per step (this process's CPU time over the same window: less moved by
other work on the machine than wall time).

Goal: Keras 3 steps/s >= 0.97 of tf-keras's (best of the rounds each).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from keras_engine import BATCH, steady, with_tpulaunch  # noqa: E402  (sets the environment TensorFlow needs)

import argparse  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402

import tensorflow as tf  # noqa: E402

# The network, once; the two modules differ only in the import line.
NETWORK = '''
def build(num_classes=10, input_shape=(32, 32, 3)):
    image = keras.Input(shape=tuple(input_shape), name="image")
    x = image
    for filters in (32, 64, 128):
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = keras.layers.MaxPooling2D(2, padding="same")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(image, keras.layers.Dense(num_classes)(x))
'''
MODULES = {"tf-keras": ("tf_keras_cnn", "import tf_keras as keras\n"), "keras 3": ("keras3_cnn", "import keras\n")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip", type=int, default=20, help="steps left out at the start (start-up)")
    parser.add_argument("--save-every", type=int, default=100, help="checkpoint cadence")
    args = parser.parse_args()
    tf.get_logger().setLevel("ERROR")
    import keras
    import tf_keras

    from tpulaunch.data.synth import write_example

    names = tuple(MODULES)
    rates = {name: [] for name in names}
    cpu = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = os.path.join(tmp, "data")
        write_example("quickstart", data_dir, records=1024)
        for module, import_line in MODULES.values():
            with open(os.path.join(tmp, f"{module}.py"), "w") as handle:
                handle.write(import_line + NETWORK)
        sys.path.insert(0, tmp)
        counts = {name: __import__(module).build().count_params() for name, (module, _) in MODULES.items()}
        assert len(set(counts.values())) == 1, f"not the same network: {counts}"
        for round_ in range(args.rounds):
            for name in (names if round_ % 2 == 0 else names[::-1]):
                model_dir = os.path.join(tmp, f"run-{round_}-{name.replace(' ', '')}")
                tf_keras.backend.clear_session()
                keras.backend.clear_session()
                ends, _ = with_tpulaunch(f"{MODULES[name][0]}:build", data_dir, model_dir, args.steps, args.save_every,
                                         tmp)
                rate, cpu_ms, _ = steady(ends, args.skip)
                rates[name].append(rate)
                cpu[name].append(cpu_ms)
                shutil.rmtree(model_dir, ignore_errors=True)
            print(f"round {round_ + 1}: " + "  ".join(
                f"{name} {rates[name][-1]:7.2f} steps/s ({cpu[name][-1]:6.2f} CPU ms/step)" for name in names) +
                f"  ratio {rates['keras 3'][-1] / rates['tf-keras'][-1]:.3f}", flush=True)
    best = {name: max(values) for name, values in rates.items()}
    print(f"quickstart CNN ({counts['keras 3']} parameters), batch {BATCH}, {os.cpu_count()} CPU cores; steps "
          f"{args.skip}-{args.steps}, a checkpoint every {args.save_every} steps; Keras {keras.__version__}, "
          f"tf-keras {tf_keras.__version__}, TensorFlow {tf.__version__}")
    for name in names:
        print(f"{name:<9} best {best[name]:7.2f} steps/s ({best[name] * BATCH:6.0f} examples/s; all: "
              f"{', '.join(f'{r:.2f}' for r in rates[name])}); CPU ms/step median {statistics.median(cpu[name]):.2f}")
    ratios = [k3 / k2 for k2, k3 in zip(rates["tf-keras"], rates["keras 3"])]
    ratio = best["keras 3"] / best["tf-keras"]
    print(f"ratio per round: {', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}")
    print(f"CPU per step, tf-keras / Keras 3 (medians over rounds): "
          f"{statistics.median(cpu['tf-keras']) / statistics.median(cpu['keras 3']):.3f}")
    print(f"Keras 3 best / tf-keras best = {ratio:.3f} (goal >= 0.97)")
    return 0 if ratio >= 0.97 else 1


if __name__ == "__main__":
    sys.exit(main())
