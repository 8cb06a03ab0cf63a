"""`validate --tf`: TensorFlow's own TPUEstimator verdict on a job, located in the job file."""

from __future__ import annotations

import textwrap

from tpulaunch.job.load import load_job
from tpulaunch.engine.estimator.verdict import tf_problems
from tpulaunch.plan.build import build_plan


def verdict(loaded, **kwargs):
    """TensorFlow's verdict on the job's TPU Plan, as `validate --tf` asks for it."""
    return tf_problems(loaded, build_plan(loaded.job) if loaded.job is not None else None, **kwargs)


MODELS = textwrap.dedent('''
    import tensorflow as tf

    def segmenter(input_shape, num_classes=2):
        image = tf.keras.Input(shape=tuple(input_shape), name="image")
        x = tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu")(image)
        return tf.keras.Model(image, tf.keras.layers.Conv2D(num_classes, 1)(x))

    def needs_rgb(input_shape):
        if input_shape[-1] != 3:
            raise ValueError(f"needs 3 channels, got {input_shape[-1]}")
        return segmenter(input_shape)
''')


def _job(tmp_path, *, builder="segmenter", image="[8, 8, 1]", mask="[8, 8]", image_dims="[1, 2, 2, 1]",
         mask_dims="[1, 2, 2]", tpu_type="v3-8", batch=4):
    (tmp_path / "seg_models.py").write_text(MODELS)
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: seg
        model:
          builder: seg_models:{builder}
          loss: sparse_categorical_crossentropy
        data:
          train: gs://bucket/train-*.tfrecord
          eval: gs://bucket/eval-*.tfrecord
          features:
            image: {{shape: {image}}}
          labels:
            mask: {{shape: {mask}, dtype: int64}}
        tpu:
          name: my-tpu
          type: {tpu_type}
          cores_per_replica: 4
          iterations_per_loop: 10
        partition:
          features: {{image: {image_dims}}}
          labels: {{mask: {mask_dims}}}
        train: {{batch_size: {batch}, steps: 100}}
        eval: {{batch_size: {batch}, steps: 2}}
        run: {{model_dir: gs://bucket/run, save_checkpoints_steps: 100}}
        """))
    return load_job(str(path))


def _summary(problems):
    return [(p.severity, p.path, p.line, p.code, p.message) for p in problems]


def test_accepted_job_reports_what_tensorflow_built(tmp_path):
    problems, built = verdict(_job(tmp_path), search_path=[str(tmp_path)])
    assert problems == []
    expected = {
        "accepted": True, "replicas": 2, "params_batch_size": 2, "input_fn_calls": 1,
        "piece_shapes": {"image": [[2, 4, 4, 1]] * 4, "mask": [[2, 4, 4]] * 4},
        "sharding": {"image": "tiled", "mask": "tiled"}, "model": "job", "message": None, "traceback": None,
    }
    assert built == {"train": expected, "eval": expected}


def test_rejection_is_located_at_the_tensor_with_tensorflows_message(tmp_path):
    loaded = _job(tmp_path, image_dims="[1, 2, 1, 1]", tpu_type="v3-32", batch=8)
    problems, built = verdict(loaded, search_path=[str(tmp_path)])
    tf_message = ("ValueError: The product of each input partition dim should equal to num_cores_per_replica. "
                  "(dim = [1 2 1 1], num_cores_per_replica = 4)")
    assert _summary(problems) == [
        ("error", "partition.features.image", 18, "tensorflow-rejected",
         f"TensorFlow's TPUEstimator rejected the {mode} graph for v3-32: {tf_message}")
        for mode in ("train", "eval")]
    assert {mode: (info["accepted"], info["replicas"], info["message"]) for mode, info in built.items()} == {
        mode: (False, 8, tf_message.split(": ", 1)[1]) for mode in ("train", "eval")}
    # For --debug: TF's own traceback, ending in TF's partition check.
    last_lines = built["train"]["traceback"].rstrip().splitlines()[-3:]
    assert "_check_input_partition_dims" in last_lines[0] and last_lines[-1] == tf_message


def test_unbuildable_model_is_an_error_and_uneven_pieces_are_still_warned(tmp_path):
    """--tf never says OK for a job whose own model cannot be built; the slice is still checked with a stand-in."""
    # needs_rgb refuses one channel; image rows 6 split 4 ways give 2,2,2,0; mask columns 7 split 2 give 4,3.
    loaded = _job(tmp_path, builder="needs_rgb", image="[6, 8, 1]", image_dims="[1, 4, 1, 1]",
                  mask="[8, 7]", mask_dims="[1, 1, 4]", batch=2)
    problems, built = verdict(loaded, search_path=[str(tmp_path)])
    stand_in = ("the job's model could not be built for the {} graph (ValueError: needs 3 channels, got 1); "
                "TensorFlow checked the partitioning and batches with a one-variable stand-in model_fn instead")
    empty = ("TensorFlow split 'image' ({}) into per-core pieces [1, 2, 8, 1], [1, 2, 8, 1], [1, 2, 8, 1], "
             "[1, 0, 8, 1]: 1 of 4 cores get an empty piece")
    uneven = ("TensorFlow split 'mask' ({}) unevenly into per-core pieces [1, 8, 2], [1, 8, 2], [1, 8, 2], "
              "[1, 8, 1]; XLA pads each to the largest")
    assert _summary(problems) == [
        row for mode in ("train", "eval") for row in (
            ("error", "model.builder", 3, "tensorflow-stand-in-model", stand_in.format(mode)),
            ("warning", "partition.features.image", 18, "tensorflow-empty-pieces", empty.format(mode)),
            ("warning", "partition.labels.mask", 19, "tensorflow-uneven-pieces", uneven.format(mode)))]
    assert [(mode, info["accepted"], info["model"]) for mode, info in built.items()] == [
        ("train", True, "stand-in"), ("eval", True, "stand-in")]


def test_local_job_gets_one_note_and_no_tensorflow_run(tmp_path):
    path = tmp_path / "local.yaml"
    path.write_text(textwrap.dedent("""\
        name: local
        model: {builder: tpulaunch.models.cnn:build}
        data:
          train: train.tfrecord
          features: {image: {shape: [8, 8, 3]}}
          labels: {label: {shape: [], dtype: int64}}
        train: {batch_size: 4, steps: 2}
        run: {model_dir: run}
        """))
    problems, built = verdict(load_job(str(path)))
    assert built == {}
    assert _summary(problems) == [
        ("info", "name", 1, "tensorflow-not-on-tpu",
         "no tpu: section, so there is no TPUEstimator TPU path to check; the job runs locally")]


HAND_WRITTEN_MODEL_FN = textwrap.dedent('''
    import tensorflow as tf

    def model_fn(features, labels, mode, params):
        # Two silent mistakes: the Keras Input is built inside the TPU loop (no tf.init_scope()),
        # and the optimizer is not wrapped in CrossShardOptimizer.
        image = tf.keras.Input(shape=(8, 8, 1), name="image")
        model = tf.keras.Model(image, tf.keras.layers.Dense(2)(tf.keras.layers.Flatten()(image)))
        logits = model(features, training=True)
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)
''')


def test_silent_mistakes_in_the_built_graph_are_warned(tmp_path):
    (tmp_path / "hand_written.py").write_text(HAND_WRITTEN_MODEL_FN)
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent("""\
        name: hand-written
        model: {model_fn: hand_written:model_fn}
        data:
          train: gs://bucket/train-*.tfrecord
          features: {image: {shape: [8, 8, 1]}}
          labels: {label: {shape: [], dtype: int64}}
        tpu: {name: my-tpu, type: v3-8, iterations_per_loop: 10}
        train: {batch_size: 8, steps: 100}
        run: {model_dir: gs://bucket/run, save_checkpoints_steps: 100}
        """))
    problems, built = verdict(load_job(str(path)), search_path=[str(tmp_path)])
    assert _summary(problems) == [
        ("warning", "model.model_fn", 2, "tensorflow-no-cross-replica-sum",
         "the train graph has 8 replicas but no cross-replica gradient sum: each replica would train its own "
         "copy of the weights, and TF does not check this"),
        ("warning", "model.model_fn", 2, "tensorflow-placeholder-in-tpu-loop",
         "the train graph has placeholders inside the TPU loop (image), typically a Keras Input built in "
         "model_fn; XLA cannot compile a placeholder, so the TPU run would fail"),
    ]
    assert (built["train"]["accepted"], built["train"]["replicas"], built["train"]["model"]) == (True, 8, "job")


def test_model_that_does_not_fit_the_labels_is_located_at_the_builder(tmp_path):
    # The segmenter outputs [B, 8, 8, 2] but the label is one class per example: the loss cannot pair them.
    loaded = _job(tmp_path, mask="[]", mask_dims="null")
    problems, built = verdict(loaded, search_path=[str(tmp_path)])
    assert [(p.severity, p.path, p.line, p.code) for p in problems] == [
        ("error", "model.builder", 3, "tensorflow-rejected"), ("error", "model.builder", 3, "tensorflow-rejected")]
    assert problems[0].message.startswith(
        "the model_fn failed while TensorFlow built the train graph for v3-8: loss 'sparse_categorical_crossentropy' "
        "cannot score label 'mask' (int64 [] per example) against the model's output (float32 [8, 8, 2] per example): ")
    assert [(info["accepted"], info["model"]) for info in built.values()] == [(False, "job"), (False, "job")]


def test_plan_tf_gives_tensorflow_s_verdict_on_the_job_the_gate_checked(tmp_path):
    """`plan --tf` asks TensorFlow about the job and Plan its one gate checked: what TensorFlow built is in the plan,
    and what TensorFlow refuses refuses the plan, located in the job file."""
    import json

    from click.testing import CliRunner

    from tpulaunch.cli.app import cli

    good = _job(tmp_path).file
    result = CliRunner().invoke(cli, ["plan", good, "--no-memory", "--tf", "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["engine"] == "estimator"
    assert [(mode, info["accepted"], info["replicas"]) for mode, info in doc["tensorflow"].items()] == [
        ("train", True, 2), ("eval", True, 2)]

    bad = _job(tmp_path, builder="needs_rgb").file
    refused = CliRunner().invoke(cli, ["plan", bad, "--no-memory", "--tf"])
    assert refused.exit_code == 1, refused.output
    assert f"{bad}:3:12: model.builder: the job's model could not be built for the train graph" in refused.output
    assert f"not planning {bad}: fix the problems above (tpulaunch validate {bad} --tf)" in refused.output
