"""tensorflow/tpu's EfficientNet (models/official/efficientnet at tensorflow/tpu 7dc921f), the original files copied
unchanged into tests/programs/tensorflow_tpu (license kept), run from a job file by every verb.

What its `main()` does, the job says: `main:model_fn` (absl FLAGS for the model name and sizes, a learning rate on
TensorFlow's global step, batch-norm update ops, an exponential moving average restored for evaluation, a
host_call, eval_metrics), `params` as main() makes them (`steps_per_epoch`, `use_bfloat16`), and
`imagenet_input.ImageNetInput(...).input_fn` per mode; the program's directory on `python_path`, as its README's
`python main.py` has it on sys.path (`import imagenet_input`, `from condconv import ...`). Tiny: efficientnet-b0 scaled down by its
own width/depth coefficients, 32x32 images, 2 steps.

Two things of the program need porting help on TensorFlow 2, as docs/own-program.md ("Porting a TF1-era program")
says, and the tests do both: its CondConv layers read `shape[0].value` (TensorFlow 1's shapes: refused with where
and why, and trained through a three-line module beside the job that turns TF1 shapes on), and its AutoAugment
imports `tensorflow.contrib` (refused, saying TensorFlow 2 removed it and what replaces it).

absl flags are process-wide and the reference programs define the same names: each command runs in a process of
its own.
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
from programs_run import explained_evaluation, metrics, said, tpulaunch

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

EFFICIENTNET = Path("tensorflow_tpu/models/official/efficientnet")

JOB = textwrap.dedent('''
    name: efficientnet
    python_path: [tensorflow_tpu/models/official/efficientnet]
    model:
      model_fn: main:model_fn
      params: {steps_per_epoch: 4, use_bfloat16: false}   # main(): num_train_images / train_batch_size
    data:
      input_fn:
        train:
          factory: imagenet_input:ImageNetInput
          args: {is_training: true, data_dir: data, use_bfloat16: false, transpose_input: false, image_size: 32,
                 num_parallel_calls: 2, num_label_classes: 10}
          method: input_fn
        eval:
          factory: imagenet_input:ImageNetInput
          args: {is_training: false, data_dir: data, use_bfloat16: false, transpose_input: false, image_size: 32,
                 num_parallel_calls: 2, num_label_classes: 10}
          method: input_fn
      features: {image: {shape: [32, 32, 3], dtype: float32}}
      labels: {label: {shape: [10], dtype: float32}}    # one-hot, as its input yields them
    train: {batch_size: 8, steps: 2}
    eval: {batch_size: 8, steps: 2}                     # the 16 validation images, each once
    run: {model_dir: runs/efficientnet, save_checkpoints_steps: 2, log_every_steps: 1}
    flags: {use_tpu: false, model_name: efficientnet-b0, depth_coefficient: 0.1, width_coefficient: 0.1,
            input_image_size: 32, num_label_classes: 10, transpose_input: false, use_bfloat16: false,
            train_batch_size: 8, num_train_images: 32, train_steps: 2, iterations_per_loop: 1}
''')

# What a user writes beside the job so that the program runs with the shapes it was written for (TensorFlow 1's),
# leaving its files as they are.
TF1_SHAPES = textwrap.dedent('''
    import tensorflow as tf

    tf.compat.v1.disable_v2_tensorshape()  # shape[i] is a Dimension again, with .value

    from main import model_fn  # noqa: E402  (imported after the switch)
''')


def write_project(root: Path) -> Path:
    (root / "tensorflow_tpu").mkdir()
    shutil.copy(PROGRAMS / "tensorflow_tpu" / "LICENSE", root / "tensorflow_tpu")
    shutil.copytree(PROGRAMS / EFFICIENTNET, root / EFFICIENTNET)
    (root / "data").mkdir()
    write_imagenet(root / "data" / "train-00000-of-00001", 32, seed=1)
    write_imagenet(root / "data" / "validation-00000-of-00001", 16, seed=2)
    (root / "job.yaml").write_text(JOB)
    (root / "tf1_shapes.py").write_text(TF1_SHAPES)
    return root


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return write_project(tmp_path_factory.mktemp("efficientnet"))


@pytest.fixture(scope="module")
def trained(project):
    return tpulaunch("train", "job.yaml", cwd=project)


def test_the_program_validates(project):
    validated = tpulaunch("validate", "job.yaml", cwd=project)
    assert validated.returncode == 0 and validated.stdout.startswith("OK job.yaml (checked: "), said(validated)


def test_train_evaluate_export_and_the_explained_program_run_the_same_model(project, trained):
    assert trained.returncode == 0 and "Traceback" not in said(trained), said(trained)
    (at_training,) = [line for line in trained.stdout.splitlines() if line.startswith("eval |")]
    assert at_training.startswith("eval | step 2 | ") and set(metrics(at_training)) == {
        "top_1_accuracy", "top_5_accuracy", "loss"}, at_training
    assert tf.train.latest_checkpoint(str(project / "runs" / "efficientnet")).endswith("model.ckpt-2")

    evaluated = tpulaunch("evaluate", "job.yaml", cwd=project)
    assert evaluated.returncode == 0, said(evaluated)
    (again,) = [line for line in evaluated.stdout.splitlines() if line.startswith("eval |")]
    assert metrics(again) == metrics(at_training)

    exported = tpulaunch("export", "job.yaml", "exported", cwd=project)
    assert exported.returncode == 0, said(exported)
    path = re.search(r"^exported (\S+)$", exported.stdout, re.M).group(1)
    serve = tf.saved_model.load(str(project / path)).signatures["serving_default"]
    served = serve(tf.random.uniform([2, 32, 32, 3], 0, 255))["probabilities"].numpy()
    assert served.shape == (2, CLASSES)
    np.testing.assert_allclose(served.sum(axis=1), 1.0, rtol=1e-5)

    program, printed = explained_evaluation(project)
    assert "from main import model_fn as user_model_fn" in program
    assert printed["global_step"] == 2
    assert printed["loss"] == pytest.approx(metrics(at_training)["loss"], rel=1e-3)  # shown to 4 digits


def test_tf1_shapes_are_located_and_a_module_beside_the_job_ports_them(project):
    """efficientnet-condconv reads `inputs.shape[0].value`: refused at the program's own line (inside a Keras layer
    autograph converted), with the TensorFlow 2 fix; the module beside the job turns TF1 shapes on and it builds."""
    condconv = ("--set", "flags.model_name=efficientnet-condconv-b0-8e")
    refused = tpulaunch("validate", "job.yaml", *condconv, cwd=project)
    assert refused.returncode == 1, said(refused)
    assert "model.model_fn: building the train and eval graph: AttributeError: 'int' object has no attribute " \
           "'value'" in refused.stdout, said(refused)
    assert f"{project / EFFICIENTNET / 'condconv' / 'condconv_layers.py'}:210, in call" in refused.stdout
    assert "TensorFlow 2's shapes hold ints and None, not TF1's Dimension objects" in refused.stdout

    ported = tpulaunch("validate", "job.yaml", *condconv, "--set", "model.model_fn=tf1_shapes:model_fn", cwd=project)
    assert ported.returncode == 0, said(ported)


def test_an_import_of_tensorflow_contrib_is_refused_with_what_replaces_it(project):
    """AutoAugment (augment_name: autoaugment, as main() passes --augment_name) imports tensorflow.contrib.image."""
    refused = tpulaunch("validate", "job.yaml", "--set", "data.input_fn.train.args.augment_name=autoaugment",
                        cwd=project)
    assert refused.returncode == 1, said(refused)
    assert "data.input_fn.train: calling the train input_fn imagenet_input:ImageNetInput to see what it yields " \
           "failed: ModuleNotFoundError: No module named 'tensorflow.contrib'" in refused.stdout, said(refused)
    assert f"raised at {project / EFFICIENTNET / 'autoaugment.py'}:27, in <module>" in refused.stdout
    assert "no package provides it: port the import (tensorflow.contrib.image -> tf.image" in refused.stdout
