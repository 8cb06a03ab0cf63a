"""TensorFlow's own forms of input_partition_dims in `partition:`: the seed writes
`input_partition_dims=[[1, 4, 1, 1], None]`, i.e. a plain dims list for the only feature and None for the labels."""

import textwrap

import pytest

from tpulaunch.checks.validate import validate_job
from tpulaunch.job.load import load_job
from tpulaunch.plan.build import build_plan

SEED = textwrap.dedent("""\
    name: seed
    model: {builder: tpulaunch.models.cnn:build, loss: sparse_categorical_crossentropy}
    data:
      train: gs://bucket/train-*.tfrecord
      features: {image: {shape: [64, 64, 3]}}
      labels: {label: {shape: [], dtype: int64}}
    tpu: {name: t, zone: z, project: p, type: v3-8, cores_per_replica: 4}
    partition:
      features: [1, 4, 1, 1]
      labels: null
    train: {batch_size: 8, steps: 100}
    run: {model_dir: gs://bucket/run}
""")


def write(tmp_path, text):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


def test_the_seeds_form_validates_and_reaches_tpuconfig_as_written(tmp_path):
    path = write(tmp_path, SEED)
    assert validate_job(path, static=True).problems == []
    from tpulaunch.engine.estimator.make import run_config

    job = load_job(path).job
    config = run_config(job, build_plan(job))
    assert config.tpu_config.input_partition_dims == [[1, 4, 1, 1], None]


def test_a_wrong_dims_list_is_located_at_its_line(tmp_path):
    path = write(tmp_path, SEED.replace("features: [1, 4, 1, 1]", "features: [1, 3, 1, 1]"))
    (problem,) = validate_job(path, static=True).problems
    assert (problem.code, problem.path, problem.line, problem.column) == (
        "partition-product-mismatch", "partition.features.image", 9, 13)


def test_a_dims_list_for_several_features_asks_for_names(tmp_path):
    path = write(tmp_path, SEED.replace("features: {image: {shape: [64, 64, 3]}}",
                                        "features: {image: {shape: [64, 64, 3]}, extra: {shape: [3]}}"))
    (problem,) = validate_job(path, static=True).problems
    assert (problem.code, problem.path, problem.line) == ("wrong-type", "partition.features", 9)
    assert "a job with one feature may give its dims list alone" in problem.hint


@pytest.mark.parametrize("group", ["features", "labels"])
def test_null_replicates_the_whole_group(tmp_path, group):
    text = SEED.replace("features: [1, 4, 1, 1]", "features: null").replace("labels: null", "labels: [1, 4]") \
        if group == "features" else SEED
    job = load_job(write(tmp_path, text)).job
    assert getattr(job.partition, group) == {}
