"""A real KerasHub task model on the jax engine, against Keras 3 on JAX itself (the differential oracle, `oracle.py`):
keras_hub's ResNetImageClassifier around a ResNetBackbone made from a config (tests/models/kerashub_models.py,
nothing downloaded), trained through the CLI with the compile its constructor gave it (KerasHub's Adam(5e-5),
crossentropy on logits, SparseCategoricalAccuracy; the job sets no loss, optimizer or metrics). On the same records
in the same order from the same seed, `train`'s weights (batch normalization's moving statistics among them) are
those Keras's own fit() gives on JAX, and the metrics `train` prints and records, and `evaluate`'s, are those
Keras's evaluate() gives of the checkpoint. Tolerances: oracle.py. (tests/keras_engine/test_kerashub_task.py: the same
task on the keras engine.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

import keras_hub  # noqa: F401  (the jax session's environment installs it; missing, this fails)

import user_models as corpus
from jax_runs import TPULAUNCH, checkpoint_variables, run_env
from oracle import assert_reported_as_evaluated, assert_weights_equal, oracle_call, run_oracles
from paths import MODELS

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

MODULE = "kerashub_models"
BUILDER = f"{MODULE}:resnet_classifier"
STEPS = 2


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """8 training and 8 evaluation records of 32x32x3 images and 3 classes, read in file order; the models' module
    beside the job."""
    root = tmp_path_factory.mktemp("kerashub_jax")
    (root / f"{MODULE}.py").write_text((MODELS / f"{MODULE}.py").read_text())
    image = {"image": {"shape": [32, 32, 3]}}
    for split, seed in (("train", 5), ("eval", 6)):
        corpus.write_records(root / f"{split}.tfrecord", {**image, **corpus.CLASS}, 8, seed=seed)
    job = {
        "name": "kerashub-jax", "model": {"builder": BUILDER},
        "data": {"train": "train.tfrecord", "eval": "eval.tfrecord", "features": image, "labels": corpus.CLASS,
                 "shuffle_buffer": 0},
        "train": {"batch_size": 8, "steps": STEPS}, "eval": {"batch_size": 8, "steps": 1},
        "run": {"model_dir": "runs/k", "save_checkpoints_steps": STEPS, "log_every_steps": 1, "seed": 7,
                "engine": "jax"},
    }
    (root / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return root


def _run(verb: str, project: Path, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([*TPULAUNCH, verb, str(project / "job.yaml"), *args], capture_output=True, text=True,
                            env=run_env(), timeout=300, cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


BUILDERS = (BUILDER, f"{MODULE}:resnet_classifier_with_preprocessor")


@pytest.fixture(scope="module")
def trained(project, tmp_path_factory) -> dict:
    """Each task's `train`, and Keras's fit and evaluate of both from ONE oracle process (oracle.run_oracles: Keras on
    JAX and KerasHub imported once, not once per task): {builder: (model_dir, train's stdout, the checkpoint's
    variables, the oracle's answers)}."""
    root = tmp_path_factory.mktemp("kerashub_runs")
    runs, calls = {}, {}
    for index, builder in enumerate(BUILDERS):
        model_dir = root / "runs" / str(index)
        done = _run("train", project, "--model-dir", str(model_dir), "--set", f"model.builder={builder}")
        found = checkpoint_variables(model_dir)  # variables/i: the model's, then the optimizer's
        variables = [found[f"variables/{i}/.ATTRIBUTES/VARIABLE_VALUE"]
                     for i in range(sum(name.startswith("variables/") for name in found))]
        runs[builder] = (model_dir, done.stdout, variables)
        calls[str(index)] = oracle_call(project, backend="jax", builder=builder, compile=False, checkpoint=variables)
    (root / "oracle").mkdir()
    answers = run_oracles(root / "oracle", run_env(), calls)
    return {builder: (*run, answers[str(index)]) for index, (builder, run) in enumerate(runs.items())}


@pytest.mark.parametrize("builder", BUILDERS)
def test_a_kerashub_task_trains_and_evaluates_on_jax_as_keras_fit_and_evaluate(project, trained, builder):
    """Its evaluation runs keras.Model's evaluate() on the batches its preprocess_samples maps, as its own evaluate()
    does (which takes no generator of batches); the task with a preprocessor (an image converter that rescales)
    has it applied to each batch, as its fit() and evaluate() apply it."""
    model_dir, trained_stdout, variables, oracle = trained[builder]
    assert ("ResNetImageClassifier was compiled: its loss SparseCategoricalCrossentropy; its optimizer Adam; its "
            "metrics [SparseCategoricalAccuracy]") in trained_stdout, trained_stdout

    ours = variables[:len(oracle["fit"])]  # variables/i: model.weights[i], in get_weights' order
    assert_weights_equal(ours, oracle["fit"])

    expected = oracle["evaluate"]
    assert set(expected) == {"loss", "sparse_categorical_accuracy"}  # its own metric, as its evaluate() reports it
    evaluated = _run("evaluate", project, "--set", f"run.model_dir={model_dir}", "--set", f"model.builder={builder}")
    assert_reported_as_evaluated(model_dir, trained_stdout, evaluated.stdout, expected, step=STEPS)
