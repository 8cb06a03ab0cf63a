"""What a resumed run's input costs before its first step: the job's training pipeline skipping the batches the
run already trained on (`skip_batches`: read again, shuffled, not parsed) against the same pipeline reading that
many batches through (parsed), both in this script on the same files, so the ratio holds on any machine.

Every engine's resume skips what the run trained on since its pipeline was made: the keras and jax engines since
step 0, the estimator engine since the start of its segment between evaluations (`standalone.read_on`). A run
resumed at step k so pays about k batches of reading before its first step; this says how long that is here.

    .venv/bin/python benchmarks/resume_skip.py [--batches 2000] [--rounds 3]

No goal: docs/performance.md holds what it measured.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tensorflow as tf  # noqa: E402

from data_pipeline import JOB, write_shards  # noqa: E402  (its 48 KiB records and job)
from tpulaunch.engine.pipeline import make_dataset_fn  # noqa: E402
from tpulaunch.job.load import load_job  # noqa: E402


def first_batch_after_skip(dataset_fn, batch: int, skip: int) -> float:
    """Seconds to the first batch of a pipeline that skips `skip` batches (what a resumed run waits)."""
    started = time.perf_counter()
    next(iter(dataset_fn(batch, skip_batches=skip)))
    return time.perf_counter() - started


def read_through(dataset_fn, batch: int, count: int) -> float:
    """Seconds to read `count` batches, parsed, and then one more (the same amount of input, trained on)."""
    started = time.perf_counter()
    for _ in dataset_fn(batch).take(count + 1):
        pass
    return time.perf_counter() - started


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=2000, help="batches a resumed run skips")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        pattern = write_shards(directory, shards=8, per_shard=256)
        job_file = os.path.join(directory, "job.yaml")
        with open(job_file, "w") as handle:
            handle.write(JOB.format(pattern=pattern))
        loaded = load_job(job_file, ["run.seed=7"])
        assert not loaded.problems, loaded.problems
        job = loaded.job
        dataset_fn = make_dataset_fn(job, "train", use_tpu=False)
        batch = job.train.batch_size
        read_through(dataset_fn, batch, 50)  # the files in the page cache, TensorFlow warmed up
        skipped, read = [], []
        for _ in range(args.rounds):
            skipped.append(first_batch_after_skip(dataset_fn, batch, args.batches))
            read.append(read_through(dataset_fn, batch, args.batches))
    record_bytes = 64 * 64 * 3 * 4 + 8 * 4 + 8
    skip_s, read_s = statistics.median(skipped), statistics.median(read)
    print(f"records of ~{record_bytes / 1024:.0f} KiB, batch {batch}, {args.batches} batches "
          f"({args.batches * batch} records, {args.batches * batch * record_bytes / 1e9:.2f} GB) skipped by a resume")
    print(f"skip to the first batch (s): {', '.join(f'{s:.2f}' for s in skipped)}; median {skip_s:.2f} "
          f"({args.batches / skip_s:.0f} batches/s, {args.batches * batch * record_bytes / skip_s / 1e6:.0f} MB/s)")
    print(f"read them through, parsed (s): {', '.join(f'{s:.2f}' for s in read)}; median {read_s:.2f}")
    print(f"skip / read through: {skip_s / read_s:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
