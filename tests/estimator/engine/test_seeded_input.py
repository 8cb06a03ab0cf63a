"""The job's input pipeline with `run.seed` (`portable.make_dataset_fn`, the same on every engine): every run reads
the same batches in the same order, its shuffles seeded (files and records, reshuffled each epoch) and its parallel
reads and parses in order; and a resumed run's pipeline (`skip_batches`, the step it resumed at) hands out exactly
the batches the uninterrupted one would have handed out from there. Real TFRecords, real tf.data."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tpulaunch.engine.pipeline import make_dataset_fn
from tpulaunch.job.load import load_job

JOB = textwrap.dedent("""\
    name: seeded-input
    model: {builder: "tpulaunch.models.cnn:build"}
    data:
      train: data/train-*.tfrecord
      features: {image: {shape: [4]}}
      labels: {label: {shape: [], dtype: int64}}
      shuffle_buffer: 16
    train: {batch_size: 4, steps: 1}
    run: {model_dir: runs/seeded, seed: 5}
    """)
BATCHES = 24  # 96 records a pass over the 3 files of 32: 3 epochs, each shuffled anew


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("seeded_input")
    (root / "data").mkdir()
    record = 0
    for shard in range(3):
        with tf.io.TFRecordWriter(str(root / "data" / f"train-{shard}.tfrecord")) as writer:
            for _ in range(32):  # each record's features hold its number: the order is read off the batches
                writer.write(tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(float_list=tf.train.FloatList(value=[float(record)] * 4)),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[record % 3]))})).SerializeToString())
                record += 1
    (root / "job.yaml").write_text(JOB)
    loaded = load_job(str(root / "job.yaml"))
    assert loaded.problems == []
    return loaded.job


def _order(job, batches: int, skip: int = 0) -> list:
    """The record numbers of the first `batches` batches the train pipeline hands out, after `skip` of them."""
    dataset = make_dataset_fn(job, "train", use_tpu=False)(4, skip_batches=skip)
    return [[int(v) for v in features[:, 0]] for features, _ in dataset.take(batches).as_numpy_iterator()]


def test_the_same_seed_reads_the_same_batches_in_the_same_order(job):
    first = _order(job, BATCHES)
    assert _order(job, BATCHES) == first
    read = sum(first, [])
    assert read != sorted(read)  # shuffled
    assert first[:8] != first[8:16]  # each epoch shuffled anew
    other = job.model_copy(update={"run": job.run.model_copy(update={"seed": 6})})
    assert _order(other, BATCHES) != first


def test_a_pipeline_resumed_at_step_k_hands_out_the_batches_from_k_on(job):
    whole = _order(job, BATCHES)
    for k in (3, 8, 13):  # within the first epoch, at its end, in the second
        assert _order(job, BATCHES - k, skip=k) == whole[k:]
