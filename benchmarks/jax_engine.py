"""`tpulaunch train` on the jax engine vs a hand-written Keras 3 JAX training loop: what the engine costs per step.

Both train the quickstart CNN written with Keras 3 (benchmarks/keras3_vs_tf_keras.py's NETWORK: three conv/pool
stages of 32, 64 and 128 filters, global average pooling, a dense classifier of logits) on the same synthetic
TFRecords with batch 64, Adam (learning rate 0.003) and a checkpoint every --save-every steps, on this machine's
CPU as one JAX device, in this process (Keras 3 on JAX), alternating (the order flips every round), --rounds each.

The hand-written side is the loop Keras's guide "Writing a training loop from scratch in JAX" leads to, without
tpulaunch: a tf.data pipeline that batches serialized records and parses each batch with `tf.io.parse_example`,
read as NumPy; one `jax.jit` step of `model.stateless_call`, `jax.value_and_grad` and
`optimizer.stateless_apply` on the state it is handed and returns (nothing read back but the loss at the window's
ends: JAX dispatches ahead); every --save-every steps the state is put back into the model and saved with Keras's
own `model.save_weights`.

The tpulaunch side is `tpulaunch.engine.jax.runner.train(job, plan, recorder=RunRecorder(...))` in this process,
on a job file with `run.engine: jax` (progress lines into a buffer, as the CLI would print them to a pipe).

The rate is the steady one, with one rule for both sides: (N - K) / (time of step N's end - time of step K's end),
K = --skip (start-up, XLA's compile, the input pipeline filling left out), N = --steps; the checkpoints saved
between K and N are inside the window on both sides, the final one on neither. The tpulaunch side's step ends are
the times its recorder emits each step (`StepsRun`: after the step's loss came back); the hand-written side's are
taken after each step call returns, and at K and N after its loss is ready.

    PYTHONPATH=. .venv-keras/bin/python benchmarks/jax_engine.py [--steps 200] [--rounds 3] [--skip 20]
        [--hand-sync window|step]

It also prints each side's CPU ms per step (this process's CPU time over the same window).

Goal: tpulaunch steps/s >= 0.97 of the hand-written loop's.
"""

from __future__ import annotations

import os
import sys

os.environ["KERAS_BACKEND"] = "jax"  # before TensorFlow or Keras loads: TensorFlow's import settles the backend
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from keras3_vs_tf_keras import NETWORK  # noqa: E402  (the quickstart CNN, its one source text)
from keras_engine import BATCH, LEARNING_RATE, steady, with_tpulaunch  # noqa: E402

import jax  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402


def hand_written(build, data_dir: str, model_dir: str, steps: int, save_every: int, skip: int,
                 sync: str = "window") -> list:
    """Train `steps` steps with the hand-written Keras 3 JAX loop; (wall, CPU) times as each step's call returned.
    `sync`: "window" waits for the loss only at the window's ends (JAX dispatches steps ahead), "step" after every
    step (as a loop that reads each step's loss does)."""
    spec = {"image": tf.io.FixedLenFeature([32, 32, 3], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64)}
    files = tf.data.Dataset.list_files(os.path.join(data_dir, "train-*.tfrecord"), shuffle=True).repeat()
    dataset = files.interleave(tf.data.TFRecordDataset, cycle_length=tf.data.AUTOTUNE,
                               num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    dataset = dataset.shuffle(1024).batch(BATCH, drop_remainder=True)
    dataset = dataset.map(lambda records: tf.io.parse_example(records, spec), num_parallel_calls=tf.data.AUTOTUNE)
    batches = dataset.map(lambda d: (d["image"], d["label"])).prefetch(tf.data.AUTOTUNE).as_numpy_iterator()

    model = build(num_classes=10)
    optimizer = keras.optimizers.Adam(learning_rate=LEARNING_RATE)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def compute_loss(trainable, non_trainable, x, y):
        y_pred, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
        return loss_fn(y, y_pred), non_trainable

    grad_fn = jax.value_and_grad(compute_loss, has_aux=True)

    @jax.jit
    def train_step(state, x, y):
        trainable, non_trainable, optimizer_variables = state
        (loss, non_trainable), grads = grad_fn(trainable, non_trainable, x, y)
        trainable, optimizer_variables = optimizer.stateless_apply(optimizer_variables, grads, trainable)
        return loss, (trainable, non_trainable, optimizer_variables)

    state = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
             [v.value for v in optimizer.variables])
    os.makedirs(model_dir, exist_ok=True)
    ends = []
    for step in range(1, steps + 1):
        x, y = next(batches)
        loss, state = train_step(state, x, y)
        if sync == "step" or step in (skip, steps):
            loss.block_until_ready()
        ends.append((time.perf_counter(), time.process_time()))
        if step % save_every == 0 or step == steps:
            for variables, values in zip((model.trainable_variables, model.non_trainable_variables,
                                          optimizer.variables), state):
                for variable, value in zip(variables, values):
                    variable.assign(value)
            model.save_weights(os.path.join(model_dir, f"ckpt-{step}.weights.h5"))
    return ends


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip", type=int, default=20, help="steps left out at the start (start-up, compile)")
    parser.add_argument("--save-every", type=int, default=100, help="checkpoint cadence, both sides")
    parser.add_argument("--hand-sync", choices=("window", "step"), default="window",
                        help="the hand-written loop waits for its loss at the window's ends only, or after every step")
    args = parser.parse_args()
    tf.get_logger().setLevel("ERROR")
    from tpulaunch.data.synth import write_example

    assert len(jax.devices()) == 1, "the hand-written loop runs on one device: leave XLA_FLAGS' device count out"
    names = ("hand-written jax", "tpulaunch jax")
    rates = {name: [] for name in names}
    cpu = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = os.path.join(tmp, "data")
        write_example("quickstart", data_dir, records=1024)
        with open(os.path.join(tmp, "keras3_cnn.py"), "w") as handle:
            handle.write("import keras\n" + NETWORK)
        sys.path.insert(0, tmp)
        import keras3_cnn

        for round_ in range(args.rounds):
            for name in (names if round_ % 2 == 0 else names[::-1]):
                model_dir = os.path.join(tmp, f"run-{round_}-{name.split()[0]}")
                keras.backend.clear_session()
                if name.startswith("hand"):
                    ends = hand_written(keras3_cnn.build, data_dir, model_dir, args.steps, args.save_every, args.skip,
                                        args.hand_sync)
                else:
                    ends, _ = with_tpulaunch("keras3_cnn:build", data_dir, model_dir, args.steps, args.save_every, tmp,
                                             engine="jax")
                rate, cpu_ms, _median = steady(ends, args.skip)
                rates[name].append(rate)
                cpu[name].append(cpu_ms)
                shutil.rmtree(model_dir, ignore_errors=True)
            hand, ours = rates[names[0]][-1], rates[names[1]][-1]
            print(f"round {round_ + 1}: hand-written {hand:7.2f} steps/s ({cpu[names[0]][-1]:6.2f} CPU ms/step)  "
                  f"tpulaunch {ours:7.2f} steps/s ({cpu[names[1]][-1]:6.2f} CPU ms/step)  ratio {ours / hand:.3f}",
                  flush=True)
    ratios = [ours / hand for hand, ours in zip(rates[names[0]], rates[names[1]])]
    best = {name: max(values) for name, values in rates.items()}
    print(f"quickstart CNN (Keras 3 on JAX, {jax.devices()[0].platform}, 1 device), batch {BATCH}, "
          f"{os.cpu_count()} CPU cores; steps {args.skip}-{args.steps}, a checkpoint every {args.save_every} steps; "
          f"hand-written loop waits for its loss: {'every step' if args.hand_sync == 'step' else 'at the window ends'}")
    for name in names:
        print(f"{name:<18} best {best[name]:7.2f} steps/s (all: {', '.join(f'{r:.2f}' for r in rates[name])}); "
              f"CPU ms/step median {statistics.median(cpu[name]):.2f}")
    ratio = best[names[1]] / best[names[0]]
    print(f"ratio per round: {', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}")
    print(f"tpulaunch best / hand-written best = {ratio:.3f} (goal >= 0.97)")
    return 0 if ratio >= 0.97 else 1


if __name__ == "__main__":
    sys.exit(main())
