"""`tpulaunch train` vs a hand-written TPUEstimator program: what the launcher costs per step.

Both train the quickstart CNN (tpulaunch.models.cnn) on the same synthetic TFRecords with the same
batch, optimizer, iterations_per_loop and checkpoint cadence, on this machine's CPU, in this process,
alternating, best of --rounds each. The hand-written side is the plain TPUEstimator program a user
would write (use_tpu=False): a tf.data pipeline parsing batches, the Keras model inside a model_fn,
TPUEstimatorSpec. The tpulaunch side is runner.train with its progress hooks (plain lines into a buffer) and
checkpoint checks.

    .venv/bin/python benchmarks/train_overhead.py [--steps 200] [--rounds 2]

Goal: tpulaunch steps/s >= 0.97 of the hand-written program's.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from rich.console import Console  # noqa: E402

from tpulaunch.engine.estimator import runner  # noqa: E402
from tpulaunch.job.load import load_job  # noqa: E402
from tpulaunch.plan.build import build_plan  # noqa: E402
from tpulaunch.models import cnn  # noqa: E402
from tpulaunch.run.events import RunRecorder  # noqa: E402
from tpulaunch.cli.render.run_plain import PlainRenderer  # noqa: E402
from tpulaunch.data.synth import write_example  # noqa: E402
from cnn_job import cnn_job  # noqa: E402  (benchmarks/cnn_job.py: the job every training benchmark times)

BATCH = 64


def hand_written(data_dir: str, model_dir: str, steps: int) -> float:
    """Seconds for `steps` steps of the plain TPUEstimator program."""
    spec = {"image": tf.io.FixedLenFeature([32, 32, 3], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64)}

    def input_fn(params):
        files = tf.data.Dataset.list_files(os.path.join(data_dir, "train-*.tfrecord"), shuffle=True).repeat()
        dataset = files.interleave(tf.data.TFRecordDataset, cycle_length=tf.data.AUTOTUNE,
                                   num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
        dataset = dataset.shuffle(1024).batch(params["batch_size"], drop_remainder=True)
        dataset = dataset.map(lambda r: tf.io.parse_example(r, spec), num_parallel_calls=tf.data.AUTOTUNE)
        return dataset.map(lambda d: (d["image"], d["label"])).prefetch(tf.data.AUTOTUNE)

    def model_fn(features, labels, mode, params):
        with tf.init_scope():
            model = cnn.build(num_classes=10, input_shape=(32, 32, 3))
        logits = model(features, training=True)
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        optimizer = tf.compat.v1.train.AdamOptimizer(0.003)
        with tf.control_dependencies(model.get_updates_for(None) + model.get_updates_for(features)):
            train_op = optimizer.minimize(loss, tf.compat.v1.train.get_or_create_global_step(),
                                          var_list=model.trainable_variables)
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

    config = tf.compat.v1.estimator.tpu.RunConfig(
        model_dir=model_dir, save_checkpoints_steps=steps,
        tpu_config=tf.compat.v1.estimator.tpu.TPUConfig(iterations_per_loop=100))
    estimator = tf.compat.v1.estimator.tpu.TPUEstimator(model_fn=model_fn, config=config, use_tpu=False,
                                                        train_batch_size=BATCH)
    started = time.perf_counter()
    estimator.train(input_fn, max_steps=steps)
    return time.perf_counter() - started


def with_tpulaunch(data_dir: str, model_dir: str, steps: int, job_dir: str) -> float:
    path = os.path.join(job_dir, "job.yaml")
    with open(path, "w") as handle:
        handle.write(cnn_job("overhead", data=data_dir, model_dir=model_dir, steps=steps, batch=BATCH,
                             run={"save_checkpoints_steps": steps}))
    job = load_job(path).job
    recorder = RunRecorder(total_steps=steps, batch_size=BATCH, log_every_steps=100, model_dir=model_dir)
    recorder.subscribe(PlainRenderer(Console(file=io.StringIO())))
    started = time.perf_counter()
    runner.train(job, build_plan(job, local=True), recorder=recorder)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    tf.get_logger().setLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = os.path.join(tmp, "data")
        write_example("quickstart", data_dir, records=1024)
        times = {"hand-written TPUEstimator": [], "tpulaunch train": []}
        for round_ in range(args.rounds):
            for name in times:
                model_dir = os.path.join(tmp, f"run-{name[:4]}-{round_}")
                if name.startswith("hand"):
                    times[name].append(hand_written(data_dir, model_dir, args.steps))
                else:
                    times[name].append(with_tpulaunch(data_dir, model_dir, args.steps, tmp))
                shutil.rmtree(model_dir, ignore_errors=True)
        best = {name: min(values) for name, values in times.items()}
        for name, seconds in best.items():
            print(f"{name:<28} {args.steps} steps in {seconds:6.2f} s  ({args.steps / seconds:5.2f} steps/s)")
        ratio = best["hand-written TPUEstimator"] / best["tpulaunch train"]
        print(f"tpulaunch steps/s / hand-written steps/s = {ratio:.3f} (goal >= 0.97; includes graph build and "
              f"session start on both sides)")
    return 0 if ratio >= 0.97 else 1


if __name__ == "__main__":
    sys.exit(main())
