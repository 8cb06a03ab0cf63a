"""Which training records the estimator engine's segments read: the job's training pipeline made anew at each
segment between evaluations, seeded at the segment's first step (what `standalone.read_on` has TPUEstimator do),
read for the segment's steps, the records counted. The same records as one file and as several, so the numbers
show what sharding changes.

TPUEstimator calls `input_fn` afresh at each `train()`; each segment so reads from the head of the files its order
puts first, and with a few long files and short segments the records deep in them are never read.

    .venv/bin/python benchmarks/segment_coverage.py [--records 400] [--files 1 8] [--batch 4] [--steps 10]
        [--segments 20] [--shuffle-buffer 16]

No goal: docs/running.md holds what it measured.
"""

from __future__ import annotations

import argparse
import collections
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tpulaunch.engine.pipeline import make_dataset_fn  # noqa: E402
from tpulaunch.job.load import load_job  # noqa: E402

# Each record's number as its feature; the label is there because a job has one.
JOB = """\
name: coverage
model: {{builder: tpulaunch.models.cnn:build}}
data:
  train: {pattern}
  features:
    index: {{shape: [1], dtype: int64}}
  labels:
    label: {{shape: [], dtype: int64}}
  shuffle_buffer: {shuffle_buffer}
train: {{batch_size: {batch}, steps: {steps}}}
run: {{model_dir: runs/coverage, seed: 1}}
"""


def write_files(directory: str, records: int, files: int) -> str:
    """`records` records numbered 0.. in order, cut into `files` files whose lengths differ by one at most; their
    pattern."""
    for number, indices in enumerate(np.array_split(np.arange(records), files)):
        with tf.io.TFRecordWriter(os.path.join(directory, f"train-{number:05d}-of-{files:05d}.tfrecord")) as writer:
            for index in indices.tolist():
                feature = {"index": tf.train.Feature(int64_list=tf.train.Int64List(value=[index])),
                           "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[0]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return os.path.join(directory, "train-*.tfrecord")


def records_read(directory: str, pattern: str, batch: int, steps: int, segments: int,
                 shuffle_buffer: int) -> collections.Counter:
    """How often each record was read by `segments` segments of `steps` steps, each the job's pipeline seeded at
    its step."""
    job_file = os.path.join(directory, "job.yaml")
    with open(job_file, "w") as handle:
        handle.write(JOB.format(pattern=pattern, shuffle_buffer=shuffle_buffer, batch=batch, steps=steps))
    loaded = load_job(job_file)
    assert not loaded.problems, loaded.problems
    dataset_fn = make_dataset_fn(loaded.job, "train", use_tpu=False)
    tf.random.set_seed(loaded.job.run.seed)  # the graph's seed, as the estimator engine sets it: tf.data's draws follow
    seen = collections.Counter()
    for segment in range(segments):
        for features, _ in dataset_fn(batch, reseed=segment * steps).take(steps):  # one feature: a tensor
            seen.update(int(i) for i in np.ravel(features.numpy()))
    return seen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=400)
    parser.add_argument("--files", type=int, nargs="+", default=[1, 8], help="the same records cut into this many")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="steps a segment (eval.every_steps)")
    parser.add_argument("--segments", type=int, default=20)
    parser.add_argument("--shuffle-buffer", type=int, default=16)
    args = parser.parse_args(argv)
    reads = args.batch * args.steps * args.segments
    print(f"{args.segments} segments of {args.steps} steps, batches of {args.batch}, shuffle buffer "
          f"{args.shuffle_buffer}: {reads} records read ({reads / args.records:.1f} passes over {args.records})")
    for files in args.files:
        with tempfile.TemporaryDirectory() as directory:
            seen = records_read(directory, write_files(directory, args.records, files), args.batch, args.steps,
                                args.segments, args.shuffle_buffer)
        print(f"  {files:4d} file(s) of about {args.records / files:.0f}: {len(seen)} of {args.records} records "
              f"ever read, the most read {max(seen.values())} times")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
