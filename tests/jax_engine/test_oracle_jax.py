"""The jax engine's numbers against Keras 3 on JAX itself (a differential oracle, `oracle.py`): on the same records
in the same order and the same seed, `tpulaunch train`'s weights equal `model.fit`'s; every metric `train` and
`evaluate` print and the run record holds equals `model.evaluate` over the same eval set; `export`'s SavedModel
answers what `model.predict` answers; a Sequential model and a subclassed keras.Model with its own call train to
fit's weights and evaluate to evaluate()'s metrics as the functional one does; a model its builder compile()d trains
with its own compile where the job sets none; and a run stopped at step 3 and resumed ends with the weights of one
that never stopped. Tolerances: oracle.py. (The spatial split's oracle: test_jax_partition.py; a KerasHub task's:
test_kerashub_task_jax.py.)

Each model's `train` runs once, in the module's `answered` fixture, and Keras's answers for all of them come from ONE
oracle process (`oracle.run_oracles`: Keras on JAX imported once, not once a model)."""

from __future__ import annotations

import re
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from oracle import (LEFT_OUT_5, SERVED, STEPS, assert_metrics_equal, assert_reported_as_evaluated, assert_weights_equal,
                    eval_images, eval_line, evaluate_call, model_style_cases, oracle_call, recorded_evals, run_oracles,
                    write_compiled_job, write_compiled_project, write_project)
from jax_runs import TPULAUNCH, checkpoint_variables, run_env

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return write_project(tmp_path_factory.mktemp("oracle_jax"), "jax")


def _run(verb: str, project: Path, *args: str, job: str = "job.yaml") -> subprocess.CompletedProcess:
    result = subprocess.run([*TPULAUNCH, verb, str(project / job), *args], capture_output=True, text=True,
                            env=run_env(), timeout=300, cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _model_weights(model_dir: Path, count: int = 4) -> list:
    """The model's weights in a jax-engine checkpoint: variables/0 ... variables/count-1 (the optimizer's follow)."""
    found = checkpoint_variables(model_dir)
    return [found[f"variables/{i}/.ATTRIBUTES/VARIABLE_VALUE"] for i in range(count)]


REGRESSOR = textwrap.dedent('''
    import keras


    def build():
        """A regressor its builder compiles with its own squared error and metric."""
        image = keras.Input(shape=(8, 8, 1), name="image")
        model = keras.Model(image, keras.layers.Dense(2)(keras.layers.Flatten()(image)))
        model.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse", metrics=["mae"])
        return model
''')


@pytest.fixture(scope="module")
def answered(project, tmp_path_factory) -> dict:
    """Each model's one `train` and Keras's answers for it: {case: (model_dir, train's process, the oracle's answer)}
    for the job's classifier ("classifier"), a model compiled by its builder where the job sets none ("compiled"), a
    Sequential and a subclassed model ("sequential", "subclassed"), and a regressor of its own project compiled by its
    builder ("regressor": the oracle's answer, evaluate()'s metrics over the eval set's whole batches). The oracle's
    answers all come from one process, after every train: it evaluates and predicts each checkpoint's weights."""
    runs = tmp_path_factory.mktemp("oracle_jax_runs")
    compiled = write_compiled_job(project, "oraclemodels:compiled")
    trains, calls = {}, {}
    for case, (job, sets, oracle) in model_style_cases(compiled).items():
        model_dir = runs / case
        trains[case] = (model_dir, _run("train", project, "--model-dir", str(model_dir), *sets, job=job))
        calls[case] = oracle_call(project, backend="jax", checkpoint=_model_weights(model_dir), **oracle)

    regressor, job = write_compiled_project(tmp_path_factory.mktemp("oracle_jax_regressor"), engine="jax",
                                            labels={"target": {"shape": [2]}}, module="regressor", source=REGRESSOR)
    trains["regressor"] = (regressor / "run", _run("train", regressor))
    whole_batches = {**job, "eval": {"batch_size": 8, "steps": 4}}
    calls["regressor"] = evaluate_call(regressor, builder="regressor:build", job=whole_batches, backend="jax",
                                       tf_checkpoint=tf.train.latest_checkpoint(str(regressor / "run")))

    answers = run_oracles(tmp_path_factory.mktemp("oracle_jax_answers"), run_env(), calls)
    return {case: (model_dir, ran, answers[case]) for case, (model_dir, ran) in trains.items()}


def test_train_evaluate_and_export_equal_keras_fit_evaluate_and_predict(project, answered, tmp_path):
    model_dir, trained, oracle = answered["classifier"]
    assert_weights_equal(_model_weights(model_dir), oracle["fit"])

    # The evaluation at the end of train: the mean over the eval set, in the run record and on the eval line.
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


def test_a_model_compiled_by_its_builder_trains_with_its_own_compile_where_the_job_sets_none(project, answered,
                                                                                              tmp_path):
    model_dir, trained, oracle = answered["compiled"]
    assert "Functional was compiled: its loss SparseCategoricalCrossentropy; its optimizer Adam; its metrics " \
           "[SparseCategoricalAccuracy]" in trained.stdout, trained.stdout

    assert_weights_equal(_model_weights(model_dir), oracle["fit"])
    assert set(oracle["evaluate"]) == {"loss", "acc"}  # its own metric, evaluated as evaluate() does
    assert_metrics_equal(recorded_evals(model_dir, "train")[-1], oracle["evaluate"])

    # The job's settings win where it sets them, and the line names what they replaced; its own metrics are kept.
    replaced = _run("train", project, "--model-dir", str(tmp_path / "replaced"), "--set", "train.steps=1",
                    "--set", "eval=null", "--set", "model.optimizer=sgd", "--set",
                    "model.loss=sparse_categorical_crossentropy", job="compiled.yaml")
    assert "Functional was compiled: model.loss SparseCategoricalCrossentropy replaces its " \
           "SparseCategoricalCrossentropy; model.optimizer SGD replaces its Adam; its metrics " \
           "[SparseCategoricalAccuracy]" in replaced.stdout, replaced.stdout


@pytest.mark.parametrize("style", ["sequential", "subclassed"])
def test_a_sequential_and_a_subclassed_model_train_and_evaluate_as_keras_fit_and_evaluate(project, answered, style):
    """A Sequential model without an Input and a subclassed keras.Model with its own call (oracle.py's MODELS), each
    built at its first batch: train's weights are fit's, and train's and evaluate's metrics are evaluate()'s."""
    model_dir, trained, oracle = answered[style]
    # the checkpoint's variables/i are model.weights[i], get_weights' order
    assert_weights_equal(_model_weights(model_dir), oracle["fit"])

    expected = oracle["evaluate"]
    assert set(expected) == {"loss", "accuracy"}
    evaluated = _run("evaluate", project, "--set", f"run.model_dir={model_dir}", "--set",
                     f"model.builder=oraclemodels:{style}")
    assert_reported_as_evaluated(model_dir, trained.stdout, evaluated.stdout, expected)


def test_a_run_stopped_at_step_3_and_resumed_equals_one_that_never_stopped(project, tmp_path):
    """Shuffled (a seeded buffer, reshuffled each epoch): the resumed run reads on from batch 4 of the same order."""
    shuffled = ("--set", "data.shuffle_buffer=16", "--set", "eval=null")
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    _run("train", project, "--model-dir", str(whole), *shuffled)
    _run("train", project, "--model-dir", str(parts), *shuffled, "--set", "train.steps=3")
    resumed = _run("train", project, "--model-dir", str(parts), *shuffled)
    assert f"resumed from step 3 ({parts})" in resumed.stdout.splitlines()
    ours, theirs = checkpoint_variables(parts), checkpoint_variables(whole)
    assert sorted(ours) == sorted(theirs) and ours["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == STEPS
    assert_weights_equal([ours[name] for name in sorted(ours)], [theirs[name] for name in sorted(theirs)])


def test_a_compiled_regressor_trains_with_its_own_loss_and_evaluates_as_keras_evaluate_does(answered):
    """The job sets no model.loss: the model's own squared error trains it, so its real-valued label is not
    checked as class ids (as the job's default crossentropy would score it), and its metrics are Keras's over the
    eval set's whole batches: 37 records at batch 8 end before eval.steps 5, and the eval line says what was left."""
    model_dir, trained, expected = answered["regressor"]
    assert "Functional was compiled: its loss 'mse'" in trained.stdout, trained.stdout

    assert set(expected) == {"loss", "mae"}
    assert_metrics_equal(recorded_evals(model_dir, "train")[-1], expected)
    assert eval_line(4, expected, (32, 5)) in trained.stdout.splitlines(), trained.stdout
    assert eval_line(4, expected, (32, 5)).endswith(LEFT_OUT_5)
