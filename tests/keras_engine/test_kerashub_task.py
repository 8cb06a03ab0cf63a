"""A real KerasHub task model on the keras engine (tests/models/kerashub_models.py: keras_hub's ResNetImageClassifier
around a ResNetBackbone made from a config, nothing downloaded).

Through the CLI, on TFRecords written by TensorFlow: the task model trains as it comes, with the compile its
constructor gave it (KerasHub's Adam(5e-5), crossentropy on logits, SparseCategoricalAccuracy), to the weights
Keras's own fit() gives, and evaluates to a hand computation on its checkpoint; `evaluate`, `validate` and the
program `explain --engine keras` writes agree with it; with the job's loss and optimizer, one line says what
replaced what, the weights are one SGD step computed by hand with tf.GradientTape, and its own metric is still
evaluated (the job sets no model.metrics); a task with a preprocessor
has it mapped over each batch, as its fit(), evaluate() and predict() apply it.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml
from click.testing import CliRunner

import keras_hub  # noqa: E402,F401  (tests/keras_engine/requirements.txt: CI installs it; missing, this fails)

from paths import MODELS, REPO  # noqa: E402
from programs_run import RUN_WITHOUT_TPULAUNCH  # noqa: E402
from records import write_examples  # noqa: E402
from tpulaunch.cli.app import cli  # noqa: E402

MODULE = "kerashub_models"
BUILDER = f"{MODULE}:resnet_classifier"
ENGINE = ["--set", "run.engine=keras"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """8 training and 8 evaluation records of 32x32x3 images and 3 classes, and the models' module beside them."""
    root = tmp_path_factory.mktemp("kerashub")
    (root / f"{MODULE}.py").write_text((MODELS / f"{MODULE}.py").read_text())
    rng = np.random.default_rng(5)
    for split in ("train", "eval"):
        rows = [{"image": rng.normal(size=32 * 32 * 3).astype(np.float32), "label": int(rng.integers(0, 3))}
                for _ in range(8)]
        write_examples(root / f"{split}.tfrecord", rows)
    return root


def records(root: Path, split: str, shape=(32, 32, 3)):
    """(images, labels) of a split, in file order."""
    images, labels = [], []
    for raw in tf.data.TFRecordDataset(str(root / f"{split}.tfrecord")).as_numpy_iterator():
        example = tf.train.Example.FromString(raw).features.feature
        images.append(np.array(example["image"].float_list.value, np.float32).reshape(shape))
        labels.append(example["label"].int64_list.value[0])
    return np.stack(images), np.array(labels)


def write_job(root: Path, name: str, steps: int, **model) -> Path:
    """No run.engine in the file: each verb is given --set run.engine=keras."""
    document = {
        "name": name, "model": {"builder": BUILDER, **model},
        "data": {"train": "train.tfrecord", "eval": "eval.tfrecord", "features": {"image": {"shape": [32, 32, 3]}},
                 "labels": {"label": {"shape": [], "dtype": "int64"}}, "shuffle_buffer": 0},
        "train": {"batch_size": 8, "steps": steps}, "eval": {"batch_size": 8, "steps": 1},
        # in file order (with a seed: else the parallel reads may start the next pass over the file early)
        "run": {"model_dir": f"runs/{name}", "log_every_steps": 1, "seed": 0},
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def invoke(*args) -> str:
    result = CliRunner().invoke(cli, [*map(str, args), *ENGINE], catch_exceptions=False)
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    return result.output


def last_evaluation(model_dir: Path) -> dict:
    """The metrics of the last evaluation in the run record, at full precision."""
    runs = [json.loads(line) for line in (model_dir / "tpulaunch-runs.jsonl").read_text().splitlines()]
    return [run for run in runs if run.get("evals")][-1]["evals"][-1]["metrics"]


def builder():
    """The project's copy of the builder, imported."""
    import importlib

    return importlib.import_module(MODULE).resnet_classifier


@pytest.fixture(scope="module", autouse=True)
def importable(project):
    sys.path.insert(0, str(project))
    yield
    sys.path.remove(str(project))
    sys.modules.pop(MODULE, None)


def restored(project: Path, name: str, build=None):
    """The builder's model with the weights of run `name`'s latest checkpoint."""
    model = (build or builder())()
    tf.train.Checkpoint(model=model).restore(tf.train.latest_checkpoint(str(project / "runs" / name))).expect_partial()
    return model


def by_name(model) -> dict:
    return {w.path: np.asarray(w.numpy()) for w in model.weights}


def crossentropy_and_accuracy(model, images, labels) -> tuple:
    """By hand: the mean crossentropy of the model's logits (inference mode) and the share of right classes."""
    logits = np.asarray(model(images, training=False), np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return float(-log_softmax[np.arange(len(labels)), labels].mean()), float((logits.argmax(-1) == labels).mean())


# ------------------------------------------------------------------------ trained as it comes

@pytest.fixture(scope="module")
def as_it_comes(project) -> tuple:
    """The job with no loss, optimizer or metrics: validated, then trained two steps; (job path, train's output)."""
    path = write_job(project, "as_it_comes", steps=2)
    validated = invoke("validate", path, "--local")
    assert "OK" in validated, validated
    return path, invoke("train", path, "--local")


def test_a_kerashub_task_model_trains_with_its_own_compile(project, as_it_comes):
    _, output = as_it_comes
    assert ("ResNetImageClassifier trains with Keras's train_step and test_step (the job sets no model.loss), each "
            "replica's step as fit() runs it; its loss SparseCategoricalCrossentropy; its optimizer Adam; its "
            "metrics [SparseCategoricalAccuracy]") in output, output

    # Its own Adam(5e-5), two steps of Keras's train_step: the weights Keras's own fit() gives on the same records.
    images, labels = records(project, "train")
    fitted = builder()()
    start = by_name(fitted)
    fitted.fit(images, labels, batch_size=8, epochs=2, shuffle=False, verbose=0)
    trained = by_name(restored(project, "as_it_comes"))
    assert trained.keys() == start.keys()
    for name, value in by_name(fitted).items():
        np.testing.assert_allclose(trained[name], value, atol=1e-6, err_msg=name)
    kernel = "predictions/kernel"
    moved = np.abs(trained[kernel] - start[kernel])
    assert moved.max() == pytest.approx(2 * 5e-5, rel=1e-2)  # Adam(5e-5): at most its rate a step

    # Its evaluation: the model's own test_step, its loss and accuracy, computed by hand on the checkpoint.
    loss, accuracy = crossentropy_and_accuracy(restored(project, "as_it_comes"), *records(project, "eval"))
    said = last_evaluation(project / "runs" / "as_it_comes")
    assert said == {"loss": pytest.approx(loss, abs=1e-5), "sparse_categorical_accuracy": pytest.approx(accuracy,
                                                                                                        abs=1e-5)}
    assert f"eval | step 2 | sparse_categorical_accuracy {accuracy:.4g} | loss {loss:.4g}" in output, output


def test_evaluate_and_the_explained_program_give_the_same_evaluation(project, as_it_comes, tmp_path):
    """`python -m tpulaunch evaluate` in a process of its own and the program `explain --engine keras` writes,
    run where tpulaunch cannot be imported, each evaluate the checkpoint to train's evaluation."""
    path, _ = as_it_comes
    model_dir = project / "runs" / "as_it_comes"
    expected = last_evaluation(model_dir)
    environment = dict({k: v for k, v in os.environ.items() if k != "TF_CONFIG"}, PYTHONPATH=str(REPO), CI="1")
    evaluated = subprocess.run([sys.executable, "-m", "tpulaunch", "evaluate", str(path), "--local", *ENGINE],
                               capture_output=True, text=True, env=environment, timeout=300)
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    assert "ResNetImageClassifier trains with Keras's train_step and test_step" in evaluated.stdout
    assert last_evaluation(model_dir) == {k: pytest.approx(v, abs=1e-5) for k, v in expected.items()}

    program = tmp_path / "program.py"
    CliRunner().invoke(cli, ["explain", str(path), "--engine", "keras", "-o", str(program), "--set",
                             f"run.model_dir={model_dir}"], catch_exceptions=False)
    wrapper = tmp_path / "run_without_tpulaunch.py"
    wrapper.write_text(RUN_WITHOUT_TPULAUNCH)
    kept = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TF_CONFIG", "TF_USE_LEGACY_KERAS")}
    environment = {**kept, "TF_CPP_MIN_LOG_LEVEL": "2"}
    child = subprocess.run([sys.executable, "-I", str(wrapper), str(program), "evaluate"], cwd="/", env=environment,
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    assert "ResNetImageClassifier trains with Keras's train_step and test_step" in child.stdout, child.stdout
    (results,) = [ast.literal_eval(line) for line in child.stdout.splitlines() if line.startswith("{")]
    assert results.pop("global_step") == 2
    assert results == {k: pytest.approx(v, abs=1e-5) for k, v in expected.items()}


# ------------------------------------------------------------------------ the job's loss and optimizer

def test_the_jobs_loss_and_sgd_replace_the_task_models_compile(project):
    """One step of the job's SGD(0.1) on the job's loss: every weight is w - 0.1 * its gradient, computed by hand
    with tf.GradientTape on the same batch (Adam(5e-5), the model's own, would move none by more than 5e-5)."""
    path = write_job(project, "jobs_sgd", steps=1, loss="sparse_categorical_crossentropy",
                     optimizer={"name": "sgd", "learning_rate": 0.1})
    validated = invoke("validate", path, "--local")
    assert "OK" in validated, validated
    output = invoke("train", path, "--local")
    assert ("ResNetImageClassifier trains with Keras's train_step and test_step (the job sets no model.metrics: its "
            "own are kept), each replica's step as fit() runs it; model.loss SparseCategoricalCrossentropy replaces "
            "its SparseCategoricalCrossentropy; model.optimizer SGD replaces its Adam; its metrics "
            "[SparseCategoricalAccuracy]") in output, output

    import keras

    images, labels = records(project, "train")
    model = builder()()
    with tf.GradientTape() as tape:
        logits = model(images, training=True)  # BatchNormalization's moving statistics move as in a step
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
    gradients = tape.gradient(loss, model.trainable_variables)
    for variable, gradient in zip(model.trainable_variables, gradients):
        variable.assign_sub(0.1 * gradient)
    trained = by_name(restored(project, "jobs_sgd"))
    for name, value in by_name(model).items():
        np.testing.assert_allclose(trained[name], value, atol=1e-5, err_msg=name)
    assert np.abs(trained["predictions/kernel"] - by_name(builder()())["predictions/kernel"]).max() > 1e-3

    eval_loss, accuracy = crossentropy_and_accuracy(restored(project, "jobs_sgd"), *records(project, "eval"))
    assert last_evaluation(project / "runs" / "jobs_sgd") == {  # its own metric kept: the job sets no model.metrics
        "loss": pytest.approx(eval_loss, abs=1e-5), "sparse_categorical_accuracy": pytest.approx(accuracy, abs=1e-6)}


# ------------------------------------------------------------------------ a task with a preprocessor

def test_a_task_models_preprocessor_maps_each_batch_as_its_fit_does(project):
    """A task whose preprocessor resizes 16x16 records to the model's 32x32 and maps [0, 1] to [-1, 1]: `validate`
    traces its steps on the preprocessed batch, training gives the weights KerasHub's own fit() gives (which maps
    the preprocessor over the data), and the evaluation is KerasHub's evaluate() on the same records."""
    rng = np.random.default_rng(9)
    for split in ("small-train", "small-eval"):
        rows = [{"image": rng.uniform(size=16 * 16 * 3).astype(np.float32), "label": int(rng.integers(0, 3))}
                for _ in range(8)]
        write_examples(project / f"{split}.tfrecord", rows)
    path = write_job(project, "preprocessed", steps=2, builder=f"{MODULE}:resnet_classifier_with_preprocessor")
    document = yaml.safe_load(path.read_text())
    document["data"].update({"train": "small-train.tfrecord", "eval": "small-eval.tfrecord",
                             "features": {"image": {"shape": [16, 16, 3]}}})
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    validated = invoke("validate", path, "--local")
    assert "OK" in validated, validated
    invoke("train", path, "--local")

    import importlib

    build = importlib.import_module(MODULE).resnet_classifier_with_preprocessor
    images, labels = records(project, "small-train", (16, 16, 3))
    fitted = build()
    fitted.fit(images, labels, batch_size=8, epochs=2, shuffle=False, verbose=0)
    trained = restored(project, "preprocessed", build)
    for name, value in by_name(fitted).items():
        np.testing.assert_allclose(by_name(trained)[name], value, atol=1e-6, err_msg=name)

    eval_images, eval_labels = records(project, "small-eval", (16, 16, 3))
    theirs = trained.evaluate(eval_images, eval_labels, batch_size=8, verbose=0, return_dict=True)
    assert last_evaluation(project / "runs" / "preprocessed") == {k: pytest.approx(v, abs=1e-5)
                                                                  for k, v in theirs.items()}
    unprocessed, _ = crossentropy_and_accuracy(trained, tf.image.resize(eval_images, (32, 32)).numpy(), eval_labels)
    assert abs(unprocessed - theirs["loss"]) > 1e-3  # without the preprocessor's scale the loss is another

    # The SavedModel `export` writes serves the records' images through the preprocessor, as its predict() does.
    exported = project / "exported"
    invoke("export", path, exported)
    (saved,) = exported.iterdir()
    serve = tf.saved_model.load(str(saved)).signatures["serving_default"]
    outputs = serve(image=tf.constant(eval_images))["outputs"].numpy()
    np.testing.assert_allclose(outputs, trained.predict(eval_images, batch_size=8, verbose=0), atol=1e-5)
