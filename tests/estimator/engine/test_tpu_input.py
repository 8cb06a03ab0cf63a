"""The job's real input pipeline on TensorFlow's TPU path: PER_HOST_V2 infeed on a fabricated v3-32.

TPUEstimator calls the input_fn once per host with its TPUContext, splits each batch over the cores of
a replica as the job's partition says, and builds the infeed; only the session (the TPU itself) is
missing. The pipeline reads real TFRecords written by TensorFlow.
"""

from __future__ import annotations

import dataclasses
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tpulaunch.job.load import load_job
from tpulaunch.engine.estimator.make import input_fn_for
from tpulaunch.engine.estimator.offline import run_case
from tpulaunch.engine.estimator.verdict import cases_for_job
from tpulaunch.plan.build import build_plan

JOB = textwrap.dedent("""\
    name: tpu-input
    model: {builder: "tpulaunch.models.cnn:build"}
    data:
      train: data/train-*.tfrecord
      features: {image: {shape: [16, 16, 1]}}
      labels: {label: {shape: [], dtype: int64}}
      skip_corrupt: SKIP
    tpu: {name: fake, type: v3-32, cores_per_replica: 4}
    partition:
      features: {image: [1, 2, 2, 1]}
      labels: {label: null}
    train: {batch_size: 16, steps: 1}
    run: {model_dir: gs://bucket/runs/tpu-input}
    """)


def _write_shard(path, count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for _ in range(count):
            example = tf.train.Example(features=tf.train.Features(feature={
                "image": tf.train.Feature(float_list=tf.train.FloatList(value=rng.normal(size=256).tolist())),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(rng.integers(2))]))}))
            writer.write(example.SerializeToString())


@pytest.mark.parametrize("skip_corrupt", [False, True])
def test_real_input_fn_through_tpu_infeed_on_a_v3_32(tmp_path, skip_corrupt):
    (tmp_path / "data").mkdir()
    for shard in range(2):  # fewer files than the slice's 4 hosts: each host reads every 4th record
        _write_shard(tmp_path / "data" / f"train-{shard}.tfrecord", 32, seed=shard)
    job_path = tmp_path / "job.yaml"
    job_path.write_text(JOB.replace("SKIP", "true" if skip_corrupt else "false"))
    loaded = load_job(str(job_path))
    assert loaded.problems == []
    job = loaded.job

    (case,) = cases_for_job(job, build_plan(job), job_model=False)  # the stand-in model: this is about the input side
    verdict = run_case(dataclasses.replace(case, input_fn=input_fn_for(job, "train", True, ())))

    assert (verdict.accepted, verdict.message) == (True, None)
    # 8 replicas of 4 cores on 4 hosts: one input_fn call per host, each batch for one replica.
    assert (verdict.replicas, verdict.input_fn_calls, verdict.params_batch_size) == (8, 4, 2)
    assert verdict.piece_shapes["image"] == [(2, 8, 8, 1)] * 4
    assert verdict.sharding == {"image": "tiled", "label": "replicated"}
