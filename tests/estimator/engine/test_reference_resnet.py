"""tensorflow/tpu's ResNet (models/official/resnet), the original files copied unchanged, run from a job file.

tests/programs/tensorflow_tpu holds them with their license: `resnet_main.py`'s `resnet_model_fn` (a
learning-rate schedule on TensorFlow's global step, batch-norm update ops, L2 weight decay, a `host_call`
writing summaries under `FLAGS.model_dir`, `eval_metrics`) and `imagenet_input.ImageNetInput(...).input_fn`,
the object its own `main()` builds per mode. The job says what `main()` says: `params` (its RESNET_CFG, small),
the input objects as `{factory, args, method}`, and the source tree on `python_path` as the program's README
puts it on PYTHONPATH (`models/` for `official.resnet`, `models/official/resnet` for its `import
resnet_layers`). The records are ImageNet's TFRecord format (`image/encoded` JPEG, `image/class/label` from
1), written here: tiny images, a few steps.

absl flags are process-wide and this program defines flags the other programs define too (`tpu`,
`data_dir`...): every command runs in a process of its own.
"""

from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from imagenet_records import CLASSES, write_imagenet
from paths import PROGRAMS
from programs_run import explained_evaluation, metrics, refused_alike, said, tpulaunch

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

TENSORFLOW_TPU = PROGRAMS / "tensorflow_tpu"

JOB = textwrap.dedent('''
    name: resnet
    python_path: [tensorflow_tpu/models, tensorflow_tpu/models/official/resnet]
    model:
      model_fn: official.resnet.resnet_main:resnet_model_fn
      params:                # resnet_config.RESNET_CFG, as main() passes it (params.as_dict()), made small
        resnet_depth: 18
        num_label_classes: 10
        train_batch_size: 8
        num_train_images: 48
        train_steps: 540
        base_learning_rate: 0.1
        iterations_per_loop: 2
        enable_lars: false
        transpose_input: false
        precision: float32
        momentum: 0.9
        weight_decay: 0.0001
        label_smoothing: 0.0
        skip_host_call: false
        dropblock_groups: ''
        dropblock_keep_prob: null
        dropblock_size: 7
        pre_activation: false
        norm_act_layer: bn_relu
        data_format: channels_last
        use_resnetd_stem: false
        resnetd_shortcut: false
        replace_stem_max_pool: false
        se_ratio: null
        drop_connect_rate: null
        dropout_rate: null
        moving_average_decay: 0
        bn_momentum: 0.9
    data:
      input_fn:
        train:
          factory: official.resnet.imagenet_input:ImageNetInput
          args: {is_training: true, data_dir: data, use_bfloat16: false, transpose_input: false, image_size: 32,
                 num_parallel_calls: 2}
          method: input_fn
        eval:
          factory: official.resnet.imagenet_input:ImageNetInput
          args: {is_training: false, data_dir: data, use_bfloat16: false, transpose_input: false, image_size: 32,
                 num_parallel_calls: 2}
          method: input_fn
      features: {image: {shape: [32, 32, 3], dtype: float32}}
      labels: {label: {shape: [], dtype: int32}}
    train: {batch_size: 8, steps: 4}
    eval: {batch_size: 8, steps: 2}
    run: {model_dir: runs/resnet, save_checkpoints_steps: 2, log_every_steps: 2}
    flags: {export_moving_average: false}
''')


def write_project(root: Path, job: str = JOB) -> Path:
    shutil.copytree(TENSORFLOW_TPU, root / "tensorflow_tpu")
    (root / "data").mkdir()
    write_imagenet(root / "data" / "train-00000-of-00001", 48, seed=1)
    write_imagenet(root / "data" / "validation-00000-of-00001", 16, seed=2)
    (root / "job.yaml").write_text(job)
    return root


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return write_project(tmp_path_factory.mktemp("resnet"))


@pytest.fixture(scope="module")
def trained(project):
    return tpulaunch("train", "job.yaml", cwd=project)


def test_the_program_validates(project):
    validated = tpulaunch("validate", "job.yaml", cwd=project)
    assert validated.returncode == 0 and validated.stdout.startswith("OK job.yaml (checked: "), said(validated)
    assert "build" in validated.stdout  # the model_fn and the input objects were built, stopped before a step


def test_the_program_trains_and_evaluates(project, trained):
    assert trained.returncode == 0, said(trained)
    assert "Traceback" not in said(trained)
    (evaluation,) = [line for line in trained.stdout.splitlines() if line.startswith("eval |")]
    assert evaluation.startswith("eval | step 4 | ") and set(metrics(evaluation)) == {
        "top_1_accuracy", "top_5_accuracy", "loss"}, evaluation
    assert tf.train.latest_checkpoint(str(project / "runs" / "resnet")).endswith("model.ckpt-4")
    reader = tf.train.load_checkpoint(str(project / "runs" / "resnet" / "model.ckpt-4"))
    start = tf.train.load_checkpoint(str(project / "runs" / "resnet" / "model.ckpt-0"))
    # The batch-norm update ops the program ties to its train_op ran: the moving means moved.
    moving = [name for name in reader.get_variable_to_shape_map() if name.endswith("moving_mean")]
    assert moving and any(not np.allclose(reader.get_tensor(n), start.get_tensor(n)) for n in moving)


def test_host_call_summaries_land_in_the_runs_model_dir(project, trained):
    """The program's host_call writes under FLAGS.model_dir, which the job's run.model_dir sets."""
    assert trained.returncode == 0, said(trained)
    tags = set()
    for path in tf.io.gfile.glob(str(project / "runs" / "resnet" / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags |= {value.tag for value in event.summary.value}
    assert {"loss", "learning_rate", "current_epoch"} <= tags, tags


def test_evaluate_export_and_the_explained_program_run_the_same_model(project, trained):
    assert trained.returncode == 0, said(trained)
    (at_training,) = [line for line in trained.stdout.splitlines() if line.startswith("eval |")]
    evaluated = tpulaunch("evaluate", "job.yaml", cwd=project)
    assert evaluated.returncode == 0, said(evaluated)
    (again,) = [line for line in evaluated.stdout.splitlines() if line.startswith("eval |")]
    assert metrics(again) == metrics(at_training)

    # The program's own serving_input_receiver_fn: JPEG bytes in, classes out.
    exported = tpulaunch("export", "job.yaml", "exported", "--set",
                         "model.serving_input_fn=official.resnet.imagenet_input:image_serving_input_fn", cwd=project)
    assert exported.returncode == 0, said(exported)
    path = re.search(r"^exported (\S+)$", exported.stdout, re.M).group(1)
    serve = tf.saved_model.load(str(project / path)).signatures["serving_default"]
    jpeg = tf.io.encode_jpeg(np.full((40, 40, 3), 90, np.uint8))
    served = serve(tf.reshape(jpeg, [1]))
    assert served["probabilities"].shape == (1, CLASSES)
    assert served["classes"].numpy()[0] in range(CLASSES)

    program, printed = explained_evaluation(project)
    assert "python_path (job.yaml:3)" in program
    assert printed["global_step"] == 4
    assert printed["loss"] == pytest.approx(metrics(at_training)["loss"], rel=1e-3)  # shown to 4 digits


@pytest.mark.parametrize("broken, key", [
    # A flag the program does not define.
    (("flags: {export_moving_average: false}", "flags: {export_moving_averages: false}"),
     "flags.export_moving_averages"),
    # Declared at ImageNet's size, where the job's input object makes 32x32 images.
    (("shape: [32, 32, 3]", "shape: [224, 224, 3]"), "data.features.image.shape"),
    # A params key the model_fn reads, left out: the model_fn fails inside.
    (("    bn_momentum: 0.9\n", ""), "model.model_fn"),
])
def test_validate_and_train_refuse_a_broken_job_at_the_same_key(tmp_path, broken, key):
    old, new = broken
    assert old in JOB
    write_project(tmp_path, JOB.replace(old, new))
    refused_alike(tmp_path, key)
    assert tf.train.latest_checkpoint(str(tmp_path / "runs" / "resnet")) is None


def test_a_missing_python_path_directory_is_located(tmp_path):
    write_project(tmp_path, JOB.replace("tensorflow_tpu/models/official/resnet]", "tensorflow_tpu/models/oficial/resnet]"))
    validated = tpulaunch("validate", "job.yaml", "--static", cwd=tmp_path)
    assert validated.returncode == 1, said(validated)
    assert f"job.yaml:3:38: python_path[1]: no directory {tmp_path}/tensorflow_tpu/models/oficial/resnet" \
        in validated.stdout, said(validated)
