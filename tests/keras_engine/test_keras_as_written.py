"""Keras models as Keras users write them, on the keras engine (tests/models/keras_as_written.py, Keras 3).

A task model that compiles itself in its constructor around a backbone made from a config (what KerasHub's task
models do; keras_hub itself is not installed here) trains as it comes with its own compile, and evaluates, both
to a hand computation of the SGD steps and the metrics; a model with its own train_step trains to the weights
Keras's own fit() gives on the same records (1e-5); a compiled model trains with the job's loss when the job sets
one, says so in one line, and the weights prove that loss was the one minimised; Keras Metric classes and objects
by import path are fed each evaluation batch.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml
from click.testing import CliRunner

from paths import MODELS, REPO
from records import write_examples
from tpulaunch.cli import run as cli_run
from tpulaunch.cli import validate as cli_validate

MODULE = "keras_as_written"
IMAGE = {"image": {"shape": [4, 4, 2]}}
CLASS = {"label": {"shape": [], "dtype": "int64"}}


class Project(type(Path())):
    records: dict  # split -> (images, class labels, binary flags), in file order


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Project:
    root = Project(tmp_path_factory.mktemp("as_written"))
    (root / f"{MODULE}.py").write_text((MODELS / f"{MODULE}.py").read_text())
    rng = np.random.default_rng(7)
    records = {}
    for split, count in (("train", 4), ("eval", 4)):  # every batch the 4 records in file order (each job's run.seed),
        # so the steps can be computed by hand
        rows = [{"image": rng.normal(size=32).astype(np.float32), "label": int(rng.integers(0, 3)),
                 "flag": np.array([float(rng.integers(0, 2))], np.float32)} for _ in range(count)]
        write_examples(root / f"{split}.tfrecord", rows)
        records[split] = (np.stack([r["image"].reshape(4, 4, 2) for r in rows]), np.array([r["label"] for r in rows]),
                          np.stack([r["flag"] for r in rows]))
    root.records = records
    return root


def write_job(root: Path, name: str, model: dict, labels: dict = CLASS, steps: int = 2) -> Path:
    document = {
        "name": name, "model": model,
        "data": {"train": "train.tfrecord", "eval": "eval.tfrecord", "features": IMAGE, "labels": labels,
                 "shuffle_buffer": 0},
        "train": {"batch_size": 4, "steps": steps}, "eval": {"batch_size": 4, "steps": 1},
        # records in file order: without a seed the parallel reads hand out whichever record is ready first, and
        # a batch may hold a record of the next pass over the file before one of this pass
        "run": {"model_dir": f"runs/{name}", "log_every_steps": 1, "engine": "keras", "seed": 0},
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def validate_and_train(path: Path):
    validated = CliRunner().invoke(cli_validate.validate, [str(path), "--local"], catch_exceptions=False)
    trained = CliRunner().invoke(cli_run.train, [str(path), "--local"], catch_exceptions=False)
    said = f"validate:\n{validated.output}\ntrain:\n{trained.output}"
    assert validated.exit_code == 0 and trained.exit_code == 0, said
    assert "Traceback" not in said and "unexpected" not in said, said
    return trained.output


def eval_line(output: str) -> dict:
    line = [line for line in output.splitlines() if line.startswith("eval | step")][-1]
    return {k: float(v) for k, v in re.findall(r"\| ([\w\[\]/]+) (-?[\d.e-]+)", line)}


def written(project: Path):
    """The project's copy of the models' module, imported."""
    import importlib
    import sys

    sys.path.insert(0, str(project))
    try:
        return importlib.import_module(MODULE)
    finally:
        sys.path.remove(str(project))


def restored(project: Path, builder: str, name: str):
    """A fresh model of `builder` with the weights of run `name`'s latest checkpoint."""
    model = getattr(written(project), builder)()
    model(np.zeros((1, 4, 4, 2), np.float32))
    path = tf.train.latest_checkpoint(str(project / "runs" / name))
    tf.train.Checkpoint(model=model).restore(path).expect_partial()
    return model


def numpy_of(layer) -> list:
    import keras

    return [keras.ops.convert_to_numpy(w) for w in layer.weights]


def fixed(shape):
    return np.linspace(-0.5, 0.5, int(np.prod(shape))).reshape(shape).astype(np.float64)


def softmax(logits):
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def crossentropy(logits, labels) -> float:
    return float(-np.log(softmax(logits)[np.arange(len(labels)), labels]).mean())


def sgd_on_crossentropy(layers, images, labels, learning_rate, scale=1.0):
    """One SGD step of a stack of linear layers (after a global average pool) on `scale` x the mean crossentropy."""
    activations = [images.mean(axis=(1, 2))]
    for kernel, bias in layers:
        activations.append(activations[-1] @ kernel + bias)
    upstream = scale * (softmax(activations[-1]) - np.eye(activations[-1].shape[-1])[labels]) / len(labels)
    updated = []
    for (kernel, bias), inputs in zip(reversed(layers), reversed(activations[:-1])):
        updated.append((kernel - learning_rate * inputs.T @ upstream, bias - learning_rate * upstream.sum(0)))
        upstream = upstream @ kernel.T
    return list(reversed(updated))


def forward(layers, images):
    out = images.mean(axis=(1, 2))
    for kernel, bias in layers:
        out = out @ kernel + bias
    return out


# ------------------------------------------------------------------------ a task model that compiles itself

@pytest.fixture(scope="module")
def trained_task(project) -> str:
    """The task model's job (no loss, optimizer or metrics of its own), validated and trained: train's output."""
    return validate_and_train(write_job(project, "task", {"builder": f"{MODULE}:task_from_config"}))


def test_a_task_model_built_from_a_backbone_config_trains_with_its_own_compile(project, trained_task):
    output = trained_task
    assert ("TinyClassifier trains with Keras's train_step and test_step (the job sets no model.loss)" in output
            and "its loss SparseCategoricalCrossentropy; its optimizer SGD; its metrics [SparseCategoricalAccuracy]"
            in output), output

    images, labels, _ = project.records["train"]
    layers = [(fixed((2, 3)), np.zeros(3)), (fixed((3, 3)), np.zeros(3))]  # projection, predictions
    for _ in range(2):  # its own compile: SGD(0.5) on the crossentropy of logits
        layers = sgd_on_crossentropy(layers, images, labels, 0.5)
    model = restored(project, "task_from_config", "task")
    trained = numpy_of(model.backbone.get_layer("projection")) + numpy_of(model.get_layer("predictions"))
    for mine, hand in zip(trained, [w for layer in layers for w in layer]):
        np.testing.assert_allclose(mine, hand, atol=1e-5)

    eval_images, eval_labels, _ = project.records["eval"]
    logits = forward(layers, eval_images)
    said = eval_line(output)
    assert said["loss"] == pytest.approx(crossentropy(logits, eval_labels), abs=1e-3), output
    assert said["accuracy"] == pytest.approx(float((logits.argmax(-1) == eval_labels).mean()), abs=1e-3), output


def test_the_task_models_own_step_over_two_replicas_takes_the_steps_of_one(project, trained_task):
    """Keras's train_step in each replica of MirroredStrategy over two CPU devices (a process of its own: the CPU
    is split before TensorFlow starts) gives the weights the one-device run gave."""
    one = restored(project, "task_from_config", "task")
    environment = dict({k: v for k, v in os.environ.items() if k != "TF_CONFIG"}, PYTHONPATH=str(REPO), CI="1")
    two = subprocess.run([sys.executable, "-m", "tpulaunch", "train", str(project / "task.yaml"), "--local",
                          "--cpu-replicas", "2", "--set", "eval=null", "--model-dir", str(project / "runs/task-two")],
                         capture_output=True, text=True, env=environment, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "trains with Keras's train_step and test_step" in two.stdout, two.stdout
    mirrored = restored(project, "task_from_config", "task-two")
    for single, replicated in zip(numpy_of(one), numpy_of(mirrored)):
        np.testing.assert_allclose(replicated, single, atol=1e-5)


def test_the_jobs_optimizer_and_metrics_replace_a_task_models_own(project):
    """A task model whose compile the job's Adam and metrics replace (the loss stays its own): one line says so,
    and Adam's first step moves every weight by its learning rate (SGD's would move each by its gradient)."""
    path = write_job(project, "task_adam", {"builder": f"{MODULE}:task_from_config", "metrics": ["accuracy"],
                                            "optimizer": {"name": "adam", "learning_rate": 0.01}}, steps=1)
    output = validate_and_train(path)
    assert ("its loss SparseCategoricalCrossentropy; model.optimizer Adam replaces its SGD; model.metrics "
            "[accuracy] replace its [SparseCategoricalAccuracy]") in output, output
    assert set(eval_line(output)) == {"step", "accuracy", "loss"}, output
    model = restored(project, "task_from_config", "task_adam")
    moved = np.abs(numpy_of(model.get_layer("predictions"))[0] - fixed((3, 3)))
    np.testing.assert_allclose(moved, 0.01, atol=1e-5)


# ------------------------------------------------------------------------ a model with its own train_step

def test_a_model_with_its_own_train_step_trains_as_fit_trains_it(project):
    path = write_job(project, "own_step", {"builder": f"{MODULE}:with_own_train_step"}, steps=4)
    output = validate_and_train(path)
    assert "WithOwnTrainStep trains with its own train_step, each replica's step as fit() runs it" in output, output

    model = written(project).with_own_train_step()
    images, labels, _ = project.records["train"]
    model.fit(images, labels, batch_size=4, epochs=4, shuffle=False, verbose=0)  # 4 steps

    mine = restored(project, "with_own_train_step", "own_step")
    for trained, fits in zip(numpy_of(mine), numpy_of(model)):
        np.testing.assert_allclose(trained, fits, atol=1e-5)
    assert not np.allclose(numpy_of(mine)[0], fixed((2, 3)))  # it did train

    fit_eval = model.evaluate(*project.records["eval"][:2], batch_size=4, verbose=0, return_dict=True)
    said = eval_line(output)
    assert said["loss"] == pytest.approx(fit_eval["loss"], abs=1e-3), (said, fit_eval)
    assert said["accuracy"] == pytest.approx(fit_eval["accuracy"], abs=1e-3), (said, fit_eval)


def test_a_model_with_its_own_train_step_resumes_with_its_optimizers_state(project):
    """Two steps, then two more from the checkpoint: the weights of four steps in one run (its SGD's momentum is
    checkpointed and restored with it)."""
    path = write_job(project, "own_step_resumed", {"builder": f"{MODULE}:with_own_train_step"}, steps=2)
    validate_and_train(path)
    resumed = CliRunner().invoke(cli_run.train, [str(path), "--local", "--set", "train.steps=4"],
                                 catch_exceptions=False)
    assert resumed.exit_code == 0 and "resumed from step 2" in resumed.output, resumed.output
    model = written(project).with_own_train_step()
    images, labels, _ = project.records["train"]
    model.fit(images, labels, batch_size=4, epochs=4, shuffle=False, verbose=0)
    for trained, fits in zip(numpy_of(restored(project, "with_own_train_step", "own_step_resumed")), numpy_of(model)):
        np.testing.assert_allclose(trained, fits, atol=1e-5)


# ------------------------------------------------------------------------ the job's loss replaces compile()'s

def test_the_jobs_loss_replaces_a_compiled_models_own(project):
    path = write_job(project, "replaced", {"builder": f"{MODULE}:compiled_with_own_loss",
                                           "loss": "sparse_categorical_crossentropy"}, steps=1)
    output = validate_and_train(path)
    assert ("Functional was compiled: model.loss 'sparse_categorical_crossentropy' replaces its loss "
            "ten_times_crossentropy; its metrics none are not computed (the job sets no model.metrics); its optimizer "
            "SGD is kept (the job sets no model.optimizer)") in output, output

    images, labels, _ = project.records["train"]
    start = [(fixed((2, 3)), np.zeros(3))]
    jobs = sgd_on_crossentropy(start, images, labels, 0.5)  # its own SGD(0.5), the job's loss
    compiled = sgd_on_crossentropy(start, images, labels, 0.5, scale=10.0)
    kernel = numpy_of(restored(project, "compiled_with_own_loss", "replaced").get_layer("predictions"))[0]
    np.testing.assert_allclose(kernel, jobs[0][0], atol=1e-5)
    assert not np.allclose(kernel, compiled[0][0], atol=1e-3)
    step_loss = float(re.search(r"step 1/1 .*\| loss ([\d.]+)", output).group(1))
    assert step_loss == pytest.approx(crossentropy(forward(start, images), labels), abs=1e-3), output


# ------------------------------------------------------------------------ Keras metrics by import path

def test_keras_metric_classes_and_objects_by_import_path(project):
    import keras

    flag = {"flag": {"shape": [1], "dtype": "float32"}}
    path = write_job(project, "metrics", {"builder": f"{MODULE}:binary", "loss": "binary_crossentropy",
                                          "optimizer": {"name": "sgd", "learning_rate": 0.1},
                                          "metrics": ["keras.metrics:AUC", "keras.metrics:Precision",
                                                      f"{MODULE}:f1"]}, labels=flag)
    output = validate_and_train(path)
    said = eval_line(output)

    kernel, bias = numpy_of(restored(project, "binary", "metrics").layers[-1])
    images, _, flags = project.records["eval"]
    probabilities = 1 / (1 + np.exp(-(images.mean(axis=(1, 2)) @ kernel + bias)))
    auc = keras.metrics.AUC()
    auc.update_state(flags, probabilities)
    predicted = probabilities > 0.5
    true_positives = float((predicted & (flags > 0.5)).sum())
    precision = true_positives / max(1.0, float(predicted.sum()))
    f1 = 2 * true_positives / max(1.0, float(predicted.sum() + (flags > 0.5).sum()))
    assert said["auc"] == pytest.approx(float(auc.result()), abs=1e-3), output
    assert said["precision"] == pytest.approx(precision, abs=1e-3), output
    assert said["f1"] == pytest.approx(f1, abs=1e-3), output


# ------------------------------------------------------------------------ plan: the optimizer's own slots

def test_plan_counts_the_slots_of_the_optimizer_the_model_trains_with(project):
    """The compiled task model's SGD keeps no slot, the own-step model's SGD with momentum one, Adam two."""
    from memory_cases import plan_memory
    from tpulaunch.job.schema import Job
    from tpulaunch.plan.memory import COUNTED

    def planned(builder, **model):
        document = yaml.safe_load(write_job(project, "planned", {"builder": f"{MODULE}:{builder}", **model}).read_text())
        return plan_memory(Job.model_validate(document).located_at(str(project)))

    trainable = 2 * 3 + 3  # GlobalAveragePooling2D, then Dense(3) on 2 channels
    for plan, slots in ((planned("task_from_config"), 0), (planned("with_own_train_step"), 1),
                        (planned("with_own_train_step", optimizer="adam"), 2)):
        assert plan.optimizer_source == COUNTED and plan.optimizer_slots == slots, (plan.optimizer_slots, slots)
    assert planned("with_own_train_step").breakdown["optimizer"] == trainable * 4
