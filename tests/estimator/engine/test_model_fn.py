"""The portable model_fn under a real TPUEstimator on CPU, and the TPU RunConfig for partitioned jobs."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import tensorflow as tf

from records import write_examples

from tpulaunch.engine.estimator import runner
from tpulaunch.engine.estimator.make import input_fn_for, make_estimator, run_config
from tpulaunch.engine.estimator.plain import partition_dims
from tpulaunch.job.schema import Job
from tpulaunch.engine.estimator.offline import TensorDecl, TfCase, run_cases_in_subprocess
from tpulaunch.plan.build import build_plan

MODELS = textwrap.dedent('''
    import tensorflow as tf

    def classifier(num_classes=2, input_shape=(8, 8, 1)):
        image = tf.keras.Input(shape=tuple(input_shape), name="image")
        x = tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu")(image)
        x = tf.keras.layers.BatchNormalization()(x)
        x = tf.keras.layers.GlobalAveragePooling2D()(x)
        return tf.keras.Model(image, tf.keras.layers.Dense(num_classes)(x))

    def two_heads(input_shapes):
        image = tf.keras.Input(shape=input_shapes["image"], name="image")
        extra = tf.keras.Input(shape=input_shapes["extra"], name="extra")
        x = tf.keras.layers.GlobalAveragePooling2D()(tf.keras.layers.Conv2D(4, 3, padding="same")(image))
        x = tf.keras.layers.Concatenate()([x, extra])
        x = tf.keras.layers.Dense(8, activation="relu")(x)
        return tf.keras.Model({"image": image, "extra": extra},
                              {"kind": tf.keras.layers.Dense(2)(x), "parity": tf.keras.layers.Dense(2)(x)})
''')


def write_records(path, count: int, seed: int) -> str:
    """Images whose brightness gives `kind`, an `extra` vector whose sign gives `parity`."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        kind, parity = int(rng.integers(2)), int(rng.integers(2))
        image = rng.normal(size=(8, 8, 1)).astype(np.float32) * 0.5 + (2 * kind - 1)
        extra = rng.normal(size=3).astype(np.float32) * 0.3
        extra[0] += 2 * parity - 1
        rows.append({"image": image, "extra": extra, "kind": np.int64(kind), "parity": np.int64(parity)})
    return write_examples(path, rows)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("model_fn")
    (root / "model_fn_models.py").write_text(MODELS)
    write_records(root / "train.tfrecord", 256, seed=1)
    write_records(root / "eval.tfrecord", 64, seed=2)
    return root


def make_job(root, name: str, **sections) -> Job:
    document = {
        "name": name,
        "model": {"builder": "model_fn_models:classifier", "metrics": ["accuracy"],
                  "optimizer": {"name": "adam", "learning_rate": 0.05}},
        "data": {"train": str(root / "train.tfrecord"), "eval": str(root / "eval.tfrecord"),
                 "features": {"image": {"shape": [8, 8, 1]}}, "labels": {"kind": {"shape": [], "dtype": "int64"}},
                 "shuffle_buffer": 64},
        "train": {"batch_size": 16, "steps": 40},
        "eval": {"batch_size": 16, "steps": 4},
        "run": {"model_dir": str(root / name), "seed": 3},
    }
    for key, value in sections.items():
        document[key] = {**document.get(key, {}), **value}
    return Job.model_validate(document)


def train_and_score(job: Job, root, steps: list) -> list:
    """Train to each step in turn and evaluate after each; the eval results in order."""
    estimator = make_estimator(job, build_plan(job, local=True), search_path=[str(root)])
    results = []
    for step in steps:
        estimator.train(input_fn_for(job, "train", False, [str(root)]), max_steps=step)
        results.append(estimator.evaluate(input_fn_for(job, "eval", False, [str(root)]), steps=job.eval.steps))
    return results


def test_single_tensor_model_learns_and_reports_metrics(workdir):
    job = make_job(workdir, "single")
    first, last = train_and_score(job, workdir, [1, 40])

    assert set(last) == {"accuracy", "loss", "global_step"}
    assert last["global_step"] == 40
    assert last["loss"] < 0.5 * first["loss"]
    assert last["accuracy"] >= 0.9
    # Batch-norm statistics are update ops: they must reach the checkpoint, not stay at their start.
    checkpoint = tf.train.latest_checkpoint(job.run.model_dir)
    means = [n for n, _ in tf.train.list_variables(checkpoint) if n.endswith("moving_mean")]
    assert len(means) == 1
    assert np.abs(tf.train.load_variable(checkpoint, means[0])).max() > 0.01


@pytest.fixture(scope="module")
def dict_run(workdir):
    """A two-input, two-output model trained 40 steps: (job, eval after step 1, eval after step 40)."""
    job = make_job(
        workdir, "dict",
        model={"builder": "model_fn_models:two_heads"},
        data={"features": {"image": {"shape": [8, 8, 1]}, "extra": {"shape": [3]}},
              "labels": {"kind": {"shape": [], "dtype": "int64"}, "parity": {"shape": [], "dtype": "int64"}}})
    first, last = train_and_score(job, workdir, [1, 40])
    return job, first, last


def test_dict_features_and_dict_labels(dict_run):
    _, first, last = dict_run

    assert set(last) == {"kind/accuracy", "parity/accuracy", "loss", "global_step"}
    assert last["loss"] < 0.5 * first["loss"]
    assert last["kind/accuracy"] >= 0.9
    assert last["parity/accuracy"] >= 0.9


def test_export_of_dict_model_takes_features_by_name(workdir, dict_run):
    job = dict_run[0]
    path = runner.export(job, build_plan(job, local=True), str(workdir / "exported"), search_path=[str(workdir)])
    serve = tf.saved_model.load(path).signatures["serving_default"]

    assert {name: spec.shape.as_list() for name, spec in serve.structured_input_signature[1].items()} == {
        "image": [None, 8, 8, 1], "extra": [None, 3]}
    out = serve(image=tf.zeros([5, 8, 8, 1]), extra=tf.zeros([5, 3]))
    assert {k: v.shape.as_list() for k, v in out.items()} == {"kind": [5, 2], "parity": [5, 2]}


TPU = {"name": "my-tpu", "zone": "us-central1-a", "project": "p", "type": "v3-8", "cores_per_replica": 4,
       "iterations_per_loop": 50}


def test_run_config_for_a_partitioned_single_tensor_job(workdir):
    job = make_job(workdir, "tpu-single", tpu=TPU, partition={"features": {"image": [1, 2, 2, 1]}})
    config = run_config(job, build_plan(job))
    tpu = config.tpu_config

    assert tpu.num_cores_per_replica == 4
    assert tpu.input_partition_dims == [[1, 2, 2, 1], None]
    assert tpu.per_host_input_for_training == tf.compat.v1.estimator.tpu.InputPipelineConfig.PER_HOST_V2
    assert tpu.iterations_per_loop == 50
    assert config.model_dir == job.run.model_dir
    # The same job on CPU: no TPU settings at all.
    local = run_config(job, build_plan(job, local=True)).tpu_config
    assert (local.num_cores_per_replica, local.input_partition_dims) == (None, None)


def test_run_config_for_a_partitioned_dict_job_is_what_tensorflow_accepts(workdir):
    job = make_job(
        workdir, "tpu-dict", tpu=TPU,
        data={"features": {"image": {"shape": [8, 8, 1]}, "extra": {"shape": [3]}},
              "labels": {"mask": {"shape": [8, 8], "dtype": "int64"}}},
        partition={"features": {"image": [1, 2, 2, 1]}, "labels": {"mask": [1, 2, 2]}})
    single = make_job(workdir, "tpu-single", tpu=TPU, partition={"features": {"image": [1, 2, 2, 1]}})
    dims = run_config(job, build_plan(job)).tpu_config.input_partition_dims
    assert dims == [{"image": [1, 2, 2, 1], "extra": None}, [1, 2, 2]]

    features = (TensorDecl("image", (8, 8, 1)), TensorDecl("extra", (3,)))
    cases = [
        TfCase(devices=8, hosts=1, cores_per_replica=4, features=features,
               labels=(TensorDecl("mask", (8, 8), "int64"),), feature_dims=dims[0], label_dims=dims[1]),
        TfCase(devices=8, hosts=1, cores_per_replica=4, features=(TensorDecl("image", (8, 8, 1)),),
               labels=(TensorDecl("kind", (), "int64"),),
               feature_dims=partition_dims(single, build_plan(single))[0],
               label_dims=partition_dims(single, build_plan(single))[1]),
        # Control: leaving a feature out of the dict is refused by TensorFlow, so acceptance means something.
        TfCase(devices=8, hosts=1, cores_per_replica=4, features=features,
               labels=(TensorDecl("mask", (8, 8), "int64"),), feature_dims={"image": [1, 2, 2, 1]},
               label_dims=dims[1]),
    ]
    verdicts = run_cases_in_subprocess(cases)
    assert [(v.accepted, v.replicas) for v in verdicts[:2]] == [(True, 2), (True, 2)]
    assert verdicts[2].accepted is False
    assert verdicts[0].sharding == {"image": "tiled", "extra": "replicated", "mask": "tiled"}


def test_custom_loss_gets_whole_dicts_keyed_differently_from_labels():
    """RetinaNet-style: outputs {cls_logits, box_regression} against labels {cls_targets, box_targets}."""
    from tpulaunch.engine.portable import compute_loss
    from tpulaunch.models.retinanet import loss as retinanet_loss

    labels = {"cls_targets": tf.constant([[1, 0, -1, 0]], tf.int32), "box_targets": tf.zeros([1, 4, 4])}
    outputs = {"cls_logits": tf.zeros([1, 4, 3]), "box_regression": tf.zeros([1, 4, 4])}
    total = compute_loss("tpulaunch.models.retinanet:loss", labels, outputs, {}, custom_loss=retinanet_loss)
    assert float(total) == pytest.approx(float(retinanet_loss(labels, outputs)))
    assert float(total) > 0
