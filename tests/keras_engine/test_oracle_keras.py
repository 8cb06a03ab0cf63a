"""The keras engine's numbers against Keras 3 on TensorFlow itself (a differential oracle, `oracle.py`): on the same
records in the same order and the same seed, `tpulaunch train`'s weights (its own step, in the strategy's replica)
equal `model.fit`'s; every metric `train` and `evaluate` print and the run record holds equals `model.evaluate` over
the same eval set; `export`'s SavedModel answers what `model.predict` answers; a Sequential model and a subclassed
keras.Model with its own call train to fit's weights and evaluate to evaluate()'s metrics as the functional one does;
and a run stopped at step 3 and resumed ends with the weights of one that never stopped, over two replicas.
Tolerances: oracle.py.

Each model's `train` runs once, in the module's `answered` fixture, and Keras's answers for all of them come from ONE
oracle process (`oracle.run_oracles`: Keras on TensorFlow imported once, not once a model)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import user_models as corpus
from oracle import (LEFT_OUT_5, SERVED, STEPS, TWO_HEADS_COMPILED, assert_metrics_equal, assert_reported_as_evaluated,
                    assert_weights_equal, eval_images, eval_line, evaluate_call, model_style_cases, oracle_call,
                    recorded_evals, run_oracles, write_compiled_job, write_compiled_project, write_project)
from jax_runs import TPULAUNCH, run_env

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return write_project(tmp_path_factory.mktemp("oracle_keras"), "keras")


def _run(verb: str, project: Path, *args: str, job: str = "job.yaml") -> subprocess.CompletedProcess:
    result = subprocess.run([*TPULAUNCH, verb, str(project / job), *args], capture_output=True, text=True,
                            env=run_env(), timeout=300, cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _checkpoint_values(model_dir: Path) -> dict:
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name.endswith("/.ATTRIBUTES/VARIABLE_VALUE")}


@pytest.fixture(scope="module")
def answered(project, tmp_path_factory) -> dict:
    """Each model's one `train` and Keras's answers for it: {case: (model_dir, train's process, the oracle's answer)}
    for the job's classifier ("classifier"), a model compiled by its builder where the job sets only the loss
    ("compiled"), a Sequential and a subclassed model ("sequential", "subclassed"), and a two-head model of its own
    project compiled by its builder ("two_heads": the oracle's answer, evaluate()'s metrics over the eval set's whole
    batches). The oracle's answers all come from one process, after every train: a keras-engine checkpoint is
    evaluated as Keras restores it."""
    runs = tmp_path_factory.mktemp("oracle_keras_runs")
    compiled = write_compiled_job(project, "oraclemodels:compiled", unset=("optimizer", "metrics"))
    trains, calls = {}, {}
    for case, (job, sets, oracle) in model_style_cases(compiled).items():
        model_dir = runs / case
        trains[case] = (model_dir, _run("train", project, "--model-dir", str(model_dir), *sets, job=job))
        calls[case] = oracle_call(project, backend="tensorflow",
                                  tf_checkpoint=tf.train.latest_checkpoint(str(model_dir)), **oracle)

    two_heads, job = write_compiled_project(tmp_path_factory.mktemp("oracle_keras_two_heads"), engine="keras",
                                            labels=corpus.CLS_AND_BOX, module="twoheads", source=TWO_HEADS_COMPILED)
    trains["two_heads"] = (two_heads / "run", _run("train", two_heads))
    whole_batches = {**job, "eval": {"batch_size": 8, "steps": 4}}
    calls["two_heads"] = evaluate_call(two_heads, builder="twoheads:build", job=whole_batches,
                                       tf_checkpoint=tf.train.latest_checkpoint(str(two_heads / "run")))

    answers = run_oracles(tmp_path_factory.mktemp("oracle_keras_answers"), run_env(), calls)
    return {case: (model_dir, ran, answers[case]) for case, (model_dir, ran) in trains.items()}


def test_train_evaluate_and_export_equal_keras_fit_evaluate_and_predict(project, answered, tmp_path):
    model_dir, trained, oracle = answered["classifier"]
    assert_weights_equal(oracle["checkpoint"], oracle["fit"])  # the checkpoint, as Keras reads it, is fit's

    expected = oracle["evaluate"]
    assert set(expected) == {"loss", "accuracy"}
    (recorded,) = recorded_evals(model_dir, "train")
    assert_metrics_equal(recorded, expected)
    assert eval_line(STEPS, expected) in trained.stdout.splitlines(), trained.stdout

    evaluated = _run("evaluate", project, "--set", f"run.model_dir={model_dir}")
    assert eval_line(STEPS, expected) in evaluated.stdout.splitlines(), evaluated.stdout
    assert_metrics_equal(recorded_evals(model_dir, "evaluate")[-1], expected)

    exported = _run("export", project, str(tmp_path / "exported"), "--set", f"run.model_dir={model_dir}")
    path = re.search(r"^exported (\S+)$", exported.stdout, re.MULTILINE).group(1)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    served = serve(image=tf.constant(eval_images(project)))["outputs"].numpy()
    np.testing.assert_allclose(served, oracle["predict"], **SERVED)


def test_a_compiled_model_keeps_its_own_metrics_and_optimizer_where_the_job_sets_only_the_loss(answered):
    """The job sets model.loss alone: the model's own Adam(0.02) trains it, and its own metric is evaluated (Keras's
    steps, the job's loss in its compile), as `fit` and `evaluate` with the model's compile compute them."""
    model_dir, trained, oracle = answered["compiled"]
    assert ("Functional trains with Keras's train_step and test_step (the job sets no model.metrics: its own are "
            "kept), each replica's step as fit() runs it; model.loss SparseCategoricalCrossentropy replaces its "
            "SparseCategoricalCrossentropy; its optimizer Adam; its metrics [SparseCategoricalAccuracy]"
            ) in trained.stdout, trained.stdout

    assert_weights_equal(oracle["checkpoint"], oracle["fit"])
    assert set(oracle["evaluate"]) == {"loss", "acc"}  # its own metric, evaluated as evaluate() does
    assert_metrics_equal(recorded_evals(model_dir, "train")[-1], oracle["evaluate"])


@pytest.mark.parametrize("style", ["sequential", "subclassed"])
def test_a_sequential_and_a_subclassed_model_train_and_evaluate_as_keras_fit_and_evaluate(project, answered, style):
    """A Sequential model without an Input and a subclassed keras.Model with its own call (oracle.py's MODELS), each
    built at its first batch: train's weights are fit's, and train's and evaluate's metrics are evaluate()'s."""
    model_dir, trained, oracle = answered[style]
    assert_weights_equal(oracle["checkpoint"], oracle["fit"])  # restored by name into zeroed weights: none missed

    expected = oracle["evaluate"]
    assert set(expected) == {"loss", "accuracy"}
    evaluated = _run("evaluate", project, "--set", f"run.model_dir={model_dir}", "--set",
                     f"model.builder=oraclemodels:{style}")
    assert_reported_as_evaluated(model_dir, trained.stdout, evaluated.stdout, expected)


def test_a_run_stopped_at_step_3_and_resumed_equals_one_that_never_stopped(project, tmp_path):
    """Shuffled (a seeded buffer, reshuffled each epoch) over two replicas (one input pipeline handing each a batch a
    step): the resumed run reads on from step 4's batches of the same order."""
    shuffled = ("--set", "data.shuffle_buffer=16", "--set", "eval=null", "--cpu-replicas", "2")
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    _run("train", project, "--model-dir", str(whole), *shuffled)
    _run("train", project, "--model-dir", str(parts), *shuffled, "--set", "train.steps=3")
    resumed = _run("train", project, "--model-dir", str(parts), *shuffled)
    assert f"resumed from step 3 ({parts})" in resumed.stdout.splitlines()
    ours, theirs = _checkpoint_values(parts), _checkpoint_values(whole)
    assert sorted(ours) == sorted(theirs) and ours["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == STEPS
    assert_weights_equal([ours[name] for name in sorted(ours)], [theirs[name] for name in sorted(theirs)])


def test_a_compiled_two_head_model_trains_and_evaluates_with_its_own_loss_as_keras_evaluate_does(answered):
    """The job sets no model.loss: the model's own compile trains it, so only its crossentropy's label is checked
    for class ids (the box's real values are no class ids), and every metric equals Keras's evaluate over the eval
    set's whole batches: 37 records at batch 8 end before eval.steps 5, and the eval line says what was left."""
    model_dir, trained, expected = answered["two_heads"]
    assert "its loss {cls: SparseCategoricalCrossentropy, box: 'mse'}" in trained.stdout, trained.stdout

    assert set(expected) == {"loss", "cls_loss", "box_loss", "cls_acc", "box_mae", "box_mse"}
    (recorded,) = recorded_evals(model_dir, "train")
    assert_metrics_equal(recorded, expected)
    assert eval_line(4, expected, (32, 5)) in trained.stdout.splitlines(), trained.stdout
    assert eval_line(4, expected, (32, 5)).endswith(LEFT_OUT_5)
