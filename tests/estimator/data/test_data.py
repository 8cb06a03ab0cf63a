"""tpulaunch.engine.pipeline: real TFRecords written by TensorFlow, parsed by the input_fn a job describes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from records import write_examples

from tpulaunch.engine.estimator.standalone import params_input_fn
from tpulaunch.engine.pipeline import make_dataset_fn, parse_example_fn
from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.schema import Job
from tpulaunch.data.synth import shard_name


def make_job(train=None, eval=None, features=None, labels=None, **data) -> Job:
    return Job.model_validate({
        "name": "t",
        "model": {"builder": "tpulaunch.models.cnn:build"},
        "data": {"train": train, "eval": eval, "features": features, "labels": labels or {}, **data},
        "run": {"model_dir": "/tmp/unused"},
    })


def batches(dataset, count=None):
    items = dataset if count is None else dataset.take(count)
    return [tf.nest.map_structure(lambda t: t.numpy() if t is not None else None, b) for b in items]


def spec_of(dataset):
    """The element spec as 'dtype[batch, dims]' strings in the dataset's structure."""
    def describe(spec):
        return f"{spec.dtype.name}{spec.shape.as_list()}" if isinstance(spec, tf.TensorSpec) else None

    return tf.nest.map_structure(describe, dataset.element_spec)


@pytest.fixture
def digits(tmp_path):
    """10 records: image [2, 3] float, label scalar int."""
    records = [{"image": np.full((2, 3), i, np.float32), "label": [i]} for i in range(10)]
    return write_examples(tmp_path / "digits.tfrecord", records)


def test_list_encodings_single_tensors_in_file_order_for_eval(digits):
    job = make_job(eval=digits, features={"image": {"shape": [2, 3]}}, labels={"label": {"shape": [], "dtype": "int64"}})
    dataset = make_dataset_fn(job, "eval", use_tpu=False)(4)
    assert spec_of(dataset) == ("float32[4, 2, 3]", "int64[4]")
    got = batches(dataset)
    assert [b[1].tolist() for b in got] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # remainder of 2 dropped
    np.testing.assert_array_equal(got[1][0], np.stack([np.full((2, 3), i, np.float32) for i in range(4, 8)]))


def test_training_repeats_and_shuffles_with_static_batches(digits):
    job = make_job(train=digits, features={"image": {"shape": [2, 3]}}, labels={"label": {"shape": [], "dtype": "int64"}},
                   shuffle_buffer=16)
    dataset = make_dataset_fn(job, "train", use_tpu=False)(4)
    assert spec_of(dataset) == ("float32[4, 2, 3]", "int64[4]")
    labels = np.concatenate([b[1] for b in batches(dataset, 10)])  # 40 labels from 10 records
    assert sorted(set(labels.tolist())) == list(range(10))
    assert labels[:10].tolist() != list(range(10))


def test_no_labels_gives_none(digits):
    job = make_job(eval=digits, features={"image": {"shape": [2, 3]}})
    dataset = make_dataset_fn(job, "eval", use_tpu=False)(5)
    assert spec_of(dataset) == ("float32[5, 2, 3]", None)
    features, labels = next(iter(dataset))
    assert labels is None
    assert features.shape == (5, 2, 3)


def test_raw_encodings_in_every_dtype_and_dict_structure(tmp_path):
    image = np.arange(6, dtype=np.float32).reshape(2, 3, 1)
    mask = np.array([[0, 1, 2], [2, 1, 0]], np.uint8)
    half = np.array([0.5, -2.0], np.float16)
    ints = np.array([7, -9], np.int32)
    record = {"image": image.tobytes(), "mask": mask.tobytes(), "half": half.tobytes(),
              # bfloat16 1.5 and -3.0: the high halves of their float32 bit patterns, little-endian.
              "bf16": np.array([0x3FC0, 0xC040], "<u2").tobytes(), "ints": ints.tobytes(), "flag": [1, 0, 1]}
    path = write_examples(tmp_path / "raw.tfrecord", [record] * 2)
    job = make_job(eval=path,
                   features={"image": {"shape": [2, 3, 1], "encoding": "raw"},
                             "half": {"shape": [2], "dtype": "float16", "encoding": "raw"},
                             "bf16": {"shape": [2], "dtype": "bfloat16", "encoding": "raw"},
                             "ints": {"shape": [2], "dtype": "int32", "encoding": "raw"}},
                   labels={"mask": {"shape": [2, 3], "dtype": "uint8", "encoding": "raw"},
                           "flag": {"shape": [3], "dtype": "bool"}})
    dataset = make_dataset_fn(job, "eval", use_tpu=False)(2)
    assert spec_of(dataset) == (
        {"image": "float32[2, 2, 3, 1]", "half": "float16[2, 2]", "bf16": "bfloat16[2, 2]",
         "ints": "int32[2, 2]"},
        {"mask": "uint8[2, 2, 3]", "flag": "bool[2, 3]"})
    features, labels = next(iter(dataset))
    np.testing.assert_array_equal(features["image"][0], image)
    np.testing.assert_array_equal(features["half"][0], half)
    assert tf.cast(features["bf16"][0], tf.float32).numpy().tolist() == [1.5, -3.0]
    np.testing.assert_array_equal(features["ints"][0], ints)
    np.testing.assert_array_equal(labels["mask"][1], mask)
    assert labels["flag"][0].numpy().tolist() == [True, False, True]


def test_float_list_bfloat16_is_cast_and_key_can_differ_from_name(tmp_path):
    path = write_examples(tmp_path / "k.tfrecord", [{"pixels/raw": np.array([1.25, 2.5], np.float32), "y": [3]}])
    job = make_job(eval=path, features={"x": {"shape": [2], "dtype": "bfloat16", "key": "pixels/raw"}},
                   labels={"y": {"shape": [1], "dtype": "int32"}})
    features, labels = parse_example_fn(job)(tf.data.TFRecordDataset(path).get_single_element())
    assert features.dtype == tf.bfloat16 and tf.cast(features, tf.float32).numpy().tolist() == [1.25, 2.5]
    assert labels.dtype == tf.int32 and labels.numpy().tolist() == [3]


def _png(array) -> bytes:
    return tf.io.encode_png(array).numpy()


def test_png_and_jpeg_decode_to_declared_shape(tmp_path):
    rng = np.random.default_rng(0)
    picture = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, (4, 5, 1), dtype=np.uint8)
    records = [{"rgb": _png(picture), "photo": tf.io.encode_jpeg(picture).numpy(), "gray": _png(gray)}] * 3
    path = write_examples(tmp_path / "img.tfrecord", records)
    job = make_job(eval=path, features={"rgb": {"shape": [4, 5, 3], "dtype": "uint8", "encoding": "png"},
                                        "photo": {"shape": [4, 5, 3], "dtype": "uint8", "encoding": "jpeg"},
                                        "gray": {"shape": [4, 5, 1], "dtype": "uint8", "encoding": "png"}})
    dataset = make_dataset_fn(job, "eval", use_tpu=False)(3)
    assert spec_of(dataset)[0] == {"rgb": "uint8[3, 4, 5, 3]", "photo": "uint8[3, 4, 5, 3]",
                                   "gray": "uint8[3, 4, 5, 1]"}
    features, _ = next(iter(dataset))
    np.testing.assert_array_equal(features["rgb"][2], picture)  # png is lossless
    np.testing.assert_array_equal(features["gray"][0], gray)


def test_png_of_the_wrong_size_fails_at_read_time(tmp_path):
    path = write_examples(tmp_path / "img.tfrecord", [{"image": _png(np.zeros((6, 5, 3), np.uint8))}])
    job = make_job(eval=path, features={"image": {"shape": [4, 5, 3], "dtype": "uint8", "encoding": "png"}})
    with pytest.raises(tf.errors.InvalidArgumentError):
        next(iter(make_dataset_fn(job, "eval", use_tpu=False)(1)))


def _sharded(tmp_path, files=4, per_file=3):
    paths = []
    for f in range(files):
        records = [{"x": [f * 100 + r]} for r in range(per_file)]
        paths.append(write_examples(tmp_path / shard_name("train", f, files), records))
    return str(tmp_path / "train-*.tfrecord"), paths


def test_per_host_shards_split_files_between_input_pipelines(tmp_path):
    pattern, _ = _sharded(tmp_path)
    job = make_job(eval=pattern, features={"x": {"shape": [], "dtype": "int64"}})
    seen = []
    for host in range(2):
        dataset = make_dataset_fn(job, "eval", use_tpu=False)(1, shard_index=host, shard_count=2)
        seen.append(sorted(int(b[0][0]) for b in batches(dataset)))
    assert seen == [[0, 1, 2, 200, 201, 202], [100, 101, 102, 300, 301, 302]]


def test_fewer_files_than_hosts_splits_records(tmp_path):
    pattern, _ = _sharded(tmp_path, files=1, per_file=6)
    job = make_job(eval=pattern, features={"x": {"shape": [], "dtype": "int64"}})
    seen = []
    for host in range(3):
        dataset = make_dataset_fn(job, "eval", use_tpu=False)(1, shard_index=host, shard_count=3)
        seen.append([int(b[0][0]) for b in batches(dataset)])
    assert seen == [[0, 3], [1, 4], [2, 5]]


def test_tpuestimators_input_fn_reads_its_hosts_share_by_the_tpu_context(tmp_path):
    pattern, _ = _sharded(tmp_path)
    job = make_job(eval=pattern, features={"x": {"shape": [], "dtype": "int64"}})

    class DeploymentOnly:  # the one method TPUEstimator's TPUContext offers input_fn for this
        def current_input_fn_deployment(self):
            return "/job:worker/task:1/device:CPU:0", 1, 2, 8

    input_fn = params_input_fn(make_dataset_fn(job, "eval", use_tpu=False))
    second_host = input_fn({"batch_size": 1, "context": DeploymentOnly()})
    assert sorted(int(b[0][0]) for b in batches(second_host)) == [100, 101, 102, 300, 301, 302]
    assert len(batches(input_fn({"batch_size": 1}))) == 12  # no context (an Estimator on CPU): every record


def test_a_training_input_fn_reads_on_after_the_batches_its_restored_global_step_trained_on(tmp_path):
    """TPUEstimator calls the input_fn afresh at each `train` (a resumed run, each segment between evaluations): the
    training pipeline starts after the batches of the steps the global step counts, read when the pipeline starts
    (after the restore), one batch a step for each replica it feeds (an Estimator on CPU: one); a run that trains
    in segments between evaluations (every 2 steps) skips only what its current segment trained on (the segment's
    pipeline is seeded at its first step: tests/estimator/engine/test_oracle_estimator.py). Evaluation's pipeline
    starts at its first batch."""
    path = write_examples(tmp_path / "t.tfrecord", [{"x": [i], "y": [i % 2]} for i in range(64)])
    job = make_job(train=path, eval=path, features={"x": {"shape": [], "dtype": "int64"}},
                   labels={"y": {"shape": [], "dtype": "int64"}}, shuffle_buffer=0)
    job = job.model_copy(update={"run": job.run.model_copy(update={"seed": 1})})  # its reads and parses in order

    class FeedsFour:  # a TPU host whose pipeline feeds 4 replicas
        def current_input_fn_deployment(self):
            return "/job:worker/task:0/device:CPU:0", 0, 1, 4

    batch = 2
    training = params_input_fn(make_dataset_fn(job, "train", use_tpu=False), training=True)
    segments = params_input_fn(make_dataset_fn(job, "train", use_tpu=False), training=True, segment_steps=2)
    evaluation = params_input_fn(make_dataset_fn(job, "eval", use_tpu=False))
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        global_step = tf.compat.v1.train.create_global_step()
        pipelines = {  # name: (the input_fn's dataset, the batches to skip at each restored step)
            "cpu": (training({"batch_size": batch}), lambda step: step),
            "tpu host": (training({"batch_size": batch, "context": FeedsFour()}), lambda step: step * 4),
            "segments of 2": (segments({"batch_size": batch}), lambda step: step % 2),
            "eval": (evaluation({"batch_size": batch}), lambda step: 0)}
        iterators = {name: tf.compat.v1.data.make_initializable_iterator(dataset)
                     for name, (dataset, _) in pipelines.items()}
        firsts = {name: iterator.get_next()[0] for name, iterator in iterators.items()}
        session.run(tf.compat.v1.global_variables_initializer())
        for restored in (0, 3):
            session.run(global_step.assign(restored))
            for name, (_, skips) in pipelines.items():
                session.run(iterators[name].initializer)
                skipped = skips(restored)
                assert session.run(firsts[name]).tolist() == [skipped * batch + i for i in range(batch)], name


def test_gzip_records(tmp_path):
    path = write_examples(tmp_path / "z.tfrecord.gz", [{"x": [i]} for i in range(4)], compression="GZIP")
    job = make_job(eval=path, features={"x": {"shape": [], "dtype": "int64"}}, compression="GZIP")
    dataset = make_dataset_fn(job, "eval", use_tpu=False)(4)
    assert batches(dataset)[0][0].tolist() == [0, 1, 2, 3]


def test_lists_of_globs_are_expanded_sorted_and_deduplicated(tmp_path):
    pattern, paths = _sharded(tmp_path, files=2, per_file=1)
    job = make_job(eval=[paths[1], pattern], features={"x": {"shape": [], "dtype": "int64"}})
    dataset = make_dataset_fn(job, "eval", use_tpu=False)(1)
    assert [int(b[0][0]) for b in batches(dataset)] == [100, 0]


def test_empty_glob_names_the_pattern(tmp_path):
    pattern = str(tmp_path / "missing-*.tfrecord")
    job = make_job(train=pattern, features={"x": {"shape": []}})
    with pytest.raises(TpuLaunchError) as info:
        make_dataset_fn(job, "train", use_tpu=False)
    assert info.value.message == f"data.train: no files match {pattern!r}"


def test_mode_without_files_and_unknown_mode(digits):
    job = make_job(train=digits, features={"image": {"shape": [2, 3]}})
    with pytest.raises(TpuLaunchError) as info:
        make_dataset_fn(job, "eval", use_tpu=False)
    assert info.value.message == "data.eval: no eval files in the job"
    with pytest.raises(TpuLaunchError) as info:
        make_dataset_fn(job, "predict", use_tpu=False)
    assert info.value.message == "unknown input mode 'predict'; use one of train, eval"


def test_skip_corrupt_drops_unparseable_records(tmp_path):
    good = [{"x": [1.0, 2.0]}] * 3
    bad = [{"x": [1.0]}]  # wrong length for shape [2]
    path = write_examples(tmp_path / "mixed.tfrecord", good[:2] + bad + good[2:])
    features = {"x": {"shape": [2]}}
    strict = make_dataset_fn(make_job(eval=path, features=features), "eval", use_tpu=False)(1)
    with pytest.raises(tf.errors.InvalidArgumentError):
        batches(strict)
    lenient = make_dataset_fn(make_job(eval=path, features=features, skip_corrupt=True), "eval", use_tpu=False)
    assert len(batches(lenient(1))) == 3


def test_cache_keeps_training_repeating(digits):
    job = make_job(train=digits, features={"image": {"shape": [2, 3]}}, labels={"label": {"shape": [], "dtype": "int64"}},
                   cache=True, shuffle_buffer=0)
    labels = np.concatenate([b[1] for b in batches(make_dataset_fn(job, "train", use_tpu=False)(5), 4)])
    assert sorted(labels.tolist()) == sorted(list(range(10)) * 2)


def test_tpu_eval_repeats_and_needs_static_shapes(digits):
    job = make_job(eval=digits, features={"image": {"shape": [2, 3]}})
    dataset = make_dataset_fn(job, "eval", use_tpu=True)(4)
    assert len(batches(dataset, 5)) == 5  # 20 examples from 10 records: no end of data mid-loop
    dynamic = make_job(eval=digits, features={"image": {"shape": [None, 3]}})
    with pytest.raises(TpuLaunchError) as info:
        make_dataset_fn(dynamic, "eval", use_tpu=True)
    assert info.value.message == "data.features.image: shape [None, 3] has unknown dims; a TPU needs static shapes"
    # On CPU one unknown dim is read as a variable-length list.
    features, _ = next(iter(make_dataset_fn(dynamic, "eval", use_tpu=False)(2)))
    assert features.shape == (2, 2, 3)


def test_a_job_with_its_own_input_fn_is_never_read_by_the_pipeline(digits):
    job = make_job(train=digits, features={"image": {"shape": [2, 3]}}, input_fn="tpulaunch.data.synth:shard_name")
    with pytest.raises(TpuLaunchError) as info:
        make_dataset_fn(job, "train", use_tpu=True)
    assert info.value.message.startswith("data.input_fn: the job reads its data with its own input_fn")
