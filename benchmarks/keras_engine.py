"""`tpulaunch train` on the keras engine vs a hand-written Keras + tf.distribute program: what the engine costs per step.

Both train the quickstart CNN (32x32x3 images, 10 classes) on the same synthetic TFRecords with batch
64, Adam (learning rate 0.003) and a checkpoint every --save-every steps, on this machine's CPU, in this
process, alternating (the order flips every round), best of --rounds each.

The hand-written side is the program the TensorFlow custom-training-loop tutorial leads to, written
here without tpulaunch: a tf.data pipeline that batches serialized records and parses each batch with
`tf.io.parse_example`, `strategy.distribute_datasets_from_function`, a `@tf.function` step calling
`strategy.run` with a GradientTape and `optimizer.apply_gradients`, `tf.nn.compute_average_loss`, and
a `tf.train.CheckpointManager` saving every --save-every steps and at the end. Its strategy is the one
tpulaunch picks on this machine (one CPU, no TF_CONFIG): TensorFlow's default strategy.

The tpulaunch side is `tpulaunch.engine.keras.runner.train(job, plan, recorder=RunRecorder(...))` in this
process, on a job file with `run.engine: keras` (progress lines into a buffer, as the CLI would print
them to a pipe). In-process, so both sides share one TensorFlow runtime and thread pools; each run starts
from `tf.keras.backend.clear_session()`.

The rate is the steady one, with one rule for both sides: (N - K) / (time of step N's end - time of step
K's end), K = --skip (start-up, tracing and the input pipeline filling left out), N = --steps; the
checkpoints saved between K and N are inside the window on both sides, the final one on neither. The
tpulaunch side's step ends are the times its recorder emits each step (`StepsRun` events); the
hand-written side's are taken after each step call returns.

    PYTHONPATH=. .venv-keras/bin/python benchmarks/keras_engine.py [--steps 200] [--rounds 3] [--skip 20]
        [--model cnn|corner] [--hand-loop python|function]

It also prints each side's CPU ms per step (this process's CPU time over the same window: less moved by
other work on the machine than wall time) and median single-step time. `--model corner` trains a dense
layer on a 4x4 corner of the image instead (a step of about 1.6 ms: a fixed per-step cost shows most).

Goal: tpulaunch steps/s >= 0.97 of the hand-written program's.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.keras is Keras 2 (tf-keras), as the keras engine needs
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import io  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import tensorflow as tf  # noqa: E402
from cnn_job import cnn_job  # noqa: E402  (benchmarks/cnn_job.py: the job every training benchmark times)

BATCH = 64
LEARNING_RATE = 0.003


# ------------------------------------------------------------------------------ the hand-written program

def hand_written_model(model: str, num_classes: int = 10) -> tf.keras.Model:
    """The benchmark's model, written out. "cnn": the quickstart CNN, three conv/pool stages (32, 64, 128
    filters), global average pooling, a dense classifier of logits. "corner": a dense layer on the image's
    4x4 corner (barely computes: what a step costs besides the model shows most)."""
    inputs = tf.keras.Input(shape=(32, 32, 3), name="image")
    x = inputs
    if model == "corner":
        x = tf.keras.layers.Flatten()(tf.keras.layers.Cropping2D(((0, 28), (0, 28)))(x))
    else:
        for filters in (32, 64, 128):
            x = tf.keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
            x = tf.keras.layers.MaxPooling2D(2, padding="same")(x)
        x = tf.keras.layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes, dtype="float32")(x))


CORNER_MODULE = '''
import tensorflow as tf

def build(num_classes=10, input_shape=(32, 32, 3), **unused):
    image = tf.keras.Input(shape=tuple(input_shape), name="image")
    corner = tf.keras.layers.Cropping2D(((0, input_shape[0] - 4), (0, input_shape[1] - 4)))(image)
    return tf.keras.Model(image, tf.keras.layers.Dense(num_classes)(tf.keras.layers.Flatten()(corner)))
'''
BUILDERS = {"cnn": "tpulaunch.models.cnn:build", "corner": "corner_model:build"}


def hand_written(model_kind: str, data_dir: str, model_dir: str, steps: int, save_every: int,
                 loop: str = "python") -> list:
    """Train `steps` steps with the hand-written Keras + tf.distribute program; (wall, CPU) times as each step's
    call returned. `loop`: "python" iterates the distributed dataset in Python and passes each batch to the
    step (the tutorial's main loop); "function" passes the iterator and calls next() inside the step (the
    tutorial's "iterating inside a tf.function", as tpulaunch does)."""
    strategy = tf.distribute.get_strategy()  # what tpulaunch picks for one CPU; MirroredStrategy() on several GPUs
    spec = {"image": tf.io.FixedLenFeature([32, 32, 3], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64)}

    def dataset_fn(context):
        batch = context.get_per_replica_batch_size(BATCH)
        files = tf.data.Dataset.list_files(os.path.join(data_dir, "train-*.tfrecord"), shuffle=True)
        files = files.shard(context.num_input_pipelines, context.input_pipeline_id).repeat()
        dataset = files.interleave(tf.data.TFRecordDataset, cycle_length=tf.data.AUTOTUNE,
                                   num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
        dataset = dataset.shuffle(1024).batch(batch, drop_remainder=True)
        dataset = dataset.map(lambda records: tf.io.parse_example(records, spec), num_parallel_calls=tf.data.AUTOTUNE)
        return dataset.map(lambda d: (d["image"], d["label"])).prefetch(tf.data.AUTOTUNE)

    dist_dataset = strategy.distribute_datasets_from_function(dataset_fn)

    with strategy.scope():
        model = hand_written_model(model_kind)
        optimizer = tf.keras.optimizers.Adam(learning_rate=LEARNING_RATE)
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, model_dir, max_to_keep=5)

    def step_fn(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.nn.compute_average_loss(loss_object(labels, logits), global_batch_size=BATCH)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def distributed_train_step(batch):
        per_replica_losses = strategy.run(step_fn, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    @tf.function
    def train_step_from(iterator):
        per_replica_losses = strategy.run(step_fn, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    ends, losses = [], []
    iterator = iter(dist_dataset)
    for step in range(1, steps + 1):
        loss = distributed_train_step(next(iterator)) if loop == "python" else train_step_from(iterator)
        ends.append((time.perf_counter(), time.process_time()))
        if step % 100 == 0:
            losses.append(float(loss))  # what the program would log
        if step % save_every == 0 or step == steps:
            manager.save(checkpoint_number=step)
    return ends


# ------------------------------------------------------------------------------ tpulaunch

def with_tpulaunch(builder: str, data_dir: str, model_dir: str, steps: int, save_every: int, job_dir: str,
                   engine: str = "keras") -> tuple:
    """Train the job of `builder` (module:function) with the engine's runner.train (the keras engine's, or the jax
    engine's); ((wall, CPU) times as each step's StepsRun event came, the recorder)."""
    import importlib

    from rich.console import Console

    from tpulaunch.job.load import load_job
    from tpulaunch.plan.build import build_plan
    from tpulaunch.run.events import RunRecorder, StepsRun
    from tpulaunch.cli.render.run_plain import PlainRenderer

    path = os.path.join(job_dir, "job.yaml")
    with open(path, "w") as handle:
        handle.write(cnn_job(f"{engine}-engine-bench", builder=builder, data=data_dir, model_dir=model_dir,
                             steps=steps, batch=BATCH, learning_rate=LEARNING_RATE,
                             run={"save_checkpoints_steps": save_every, "engine": engine}))
    job = load_job(path).job
    ends = {}

    def stamp(event) -> None:
        if type(event) is StepsRun:
            ends[event.step] = (time.perf_counter(), time.process_time())

    recorder = RunRecorder(total_steps=steps, batch_size=BATCH, log_every_steps=100, model_dir=model_dir)
    recorder.subscribe(stamp)
    recorder.subscribe(PlainRenderer(Console(file=io.StringIO())))
    runner = importlib.import_module(f"tpulaunch.engine.{engine}.runner")
    runner.train(job, build_plan(job, local=True), recorder=recorder, search_path=[job_dir])
    return [ends[s] for s in range(1, steps + 1)], recorder


def steady(ends: list, skip: int) -> tuple:
    """(steps/s, CPU ms per step, median wall ms of one step) from the end of step `skip` to the end of the last
    (ends[i]: step i + 1's end)."""
    (wall0, cpu0), (wall1, cpu1) = ends[skip - 1], ends[-1]
    durations = [1000 * (b[0] - a[0]) for a, b in zip(ends[skip - 1:], ends[skip:])]
    return (len(ends) - skip) / (wall1 - wall0), 1000 * (cpu1 - cpu0) / (len(ends) - skip), statistics.median(durations)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(BUILDERS), default="cnn",
                        help="cnn: the quickstart CNN (the goal's job); corner: a model that barely computes")
    parser.add_argument("--hand-loop", choices=("python", "function"), default="python",
                        help="the hand-written loop: batches iterated in Python (the tutorial's main loop) or next() "
                             "inside the tf.function")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip", type=int, default=20, help="steps left out at the start (start-up)")
    parser.add_argument("--save-every", type=int, default=100, help="checkpoint cadence, both sides")
    args = parser.parse_args()
    tf.get_logger().setLevel("ERROR")
    from tpulaunch.data.synth import write_example
    from tpulaunch.models import cnn

    if args.model == "cnn":
        same = hand_written_model("cnn").count_params() == cnn.build(num_classes=10).count_params()
        assert same, "the hand-written model is not the quickstart CNN"
    names = ("hand-written keras", "tpulaunch keras")
    rates = {name: [] for name in names}
    cpu = {name: [] for name in names}
    medians = {name: [] for name in names}
    recorded = []
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = os.path.join(tmp, "data")
        write_example("quickstart", data_dir, records=1024)
        with open(os.path.join(tmp, "corner_model.py"), "w") as handle:
            handle.write(CORNER_MODULE)
        for round_ in range(args.rounds):
            for name in (names if round_ % 2 == 0 else names[::-1]):
                model_dir = os.path.join(tmp, f"run-{round_}-{name.split()[0]}")
                tf.keras.backend.clear_session()
                if name.startswith("hand"):
                    ends = hand_written(args.model, data_dir, model_dir, args.steps, args.save_every, args.hand_loop)
                else:
                    ends, recorder = with_tpulaunch(BUILDERS[args.model], data_dir, model_dir, args.steps, args.save_every, tmp)
                    recorded.append(recorder.steady_steps_per_sec)
                rate, cpu_ms, median_ms = steady(ends, args.skip)
                rates[name].append(rate)
                cpu[name].append(cpu_ms)
                medians[name].append(median_ms)
                shutil.rmtree(model_dir, ignore_errors=True)
            hand, ours = rates[names[0]][-1], rates[names[1]][-1]
            print(f"round {round_ + 1}: hand-written {hand:7.2f} steps/s ({cpu[names[0]][-1]:6.2f} CPU ms/step, median "
                  f"step {medians[names[0]][-1]:6.2f} ms)  tpulaunch {ours:7.2f} steps/s ({cpu[names[1]][-1]:6.2f} CPU "
                  f"ms/step, median step {medians[names[1]][-1]:6.2f} ms)  ratio {ours / hand:.3f}", flush=True)
    ratios = [ours / hand for hand, ours in zip(rates[names[0]], rates[names[1]])]
    best = {name: max(values) for name, values in rates.items()}
    window = f"steps {args.skip}-{args.steps}"
    print(f"model {args.model}, batch {BATCH}, {os.cpu_count()} CPU cores; {window}, a checkpoint every "
          f"{args.save_every} steps; hand-written loop: {args.hand_loop}")
    for name in names:
        print(f"{name:<20} best {best[name]:7.2f} steps/s  ({best[name] * BATCH:6.0f} examples/s; all: "
              f"{', '.join(f'{r:.2f}' for r in rates[name])}); CPU ms/step best {min(cpu[name]):.2f} "
              f"median {statistics.median(cpu[name]):.2f}")
    print(f"(tpulaunch's own recorder, steady steps/s: {', '.join(f'{r:.2f}' for r in recorded)})")
    ratio = best[names[1]] / best[names[0]]
    print(f"ratio per round: {', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}")
    print(f"median step, hand-written / tpulaunch (medians over rounds): "
          f"{statistics.median(medians[names[0]]) / statistics.median(medians[names[1]]):.3f}")
    print(f"CPU per step, hand-written / tpulaunch (medians over rounds): "
          f"{statistics.median(cpu[names[0]]) / statistics.median(cpu[names[1]]):.3f}")
    print(f"tpulaunch best / hand-written best = {ratio:.3f} (goal >= 0.97)")
    return 0 if ratio >= 0.97 else 1


if __name__ == "__main__":
    sys.exit(main())
