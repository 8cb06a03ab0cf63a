"""A model of two labels on the jax engine against Keras 3 on JAX itself (the differential oracle, `oracle.py`): a
two-head functional model (class logits and a box, a dict keyed like the labels) with a loss per label trains to the
weights `model.fit` gives with those losses compiled per output, on the same records in the same order and the same
seed; `train`'s and `evaluate`'s metrics (the eval line and the run record) equal `model.evaluate`'s, each metric
scored on the head it fits as on the other engines; `export` serves `model.predict`'s outputs by name; and `validate`
traces the same steps `train` runs, refusing at the same key what `train` fails at. Tolerances: oracle.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml

import user_models as corpus
from oracle import (SERVED, STEPS, TWO_HEADS_COMPILED, assert_reported_as_evaluated, assert_weights_equal, oracle_call,
                    run_oracles, write_compiled_job, write_project)
from jax_runs import TPULAUNCH, checkpoint_variables, run_env

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

LOSSES = {"cls": "sparse_categorical_crossentropy", "box": "mean_squared_error"}
# What Keras compiles for the job's losses and metrics: a crossentropy on the class logits, and each metric on the
# head it fits (accuracy: the class; the mean absolute error: the box), as the other engines score them.
KERAS_LOSSES = {"cls": {"class_name": "SparseCategoricalCrossentropy", "config": {"from_logits": True}},
                "box": "mean_squared_error"}
KERAS_METRICS = {"cls": ["accuracy"], "box": ["mean_absolute_error"]}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """oracle.py's project with records of a class and a box (32 to train on, 40 to evaluate: whole batches)."""
    root = write_project(tmp_path_factory.mktemp("two_labels"), "jax")
    specs = {**corpus.IMAGE, **corpus.CLS_AND_BOX}
    corpus.write_records(root / "train2.tfrecord", specs, 32, seed=11)
    corpus.write_records(root / "eval2.tfrecord", specs, 40, seed=12)
    job = yaml.safe_load((root / "job.yaml").read_text())
    job["name"] = "two-labels"
    job["model"].update(builder="oraclemodels:two_heads", loss=LOSSES, metrics=["accuracy", "mean_absolute_error"])
    job["data"].update(train="train2.tfrecord", eval="eval2.tfrecord", labels=corpus.CLS_AND_BOX)
    (root / "two.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return root


def _run(verb: str, project: Path, *args: str, job: str = "two.yaml", ok: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([*TPULAUNCH, verb, str(project / job), *args], capture_output=True, text=True,
                            env=run_env(), timeout=300, cwd=project)
    assert (result.returncode == 0) == ok, result.stdout + result.stderr
    return result


def _model_weights(model_dir: Path, count: int = 6) -> list:
    """The model's weights in the checkpoint: the trunk's, the class head's and the box head's kernel and bias."""
    found = checkpoint_variables(model_dir)
    return [found[f"variables/{i}/.ATTRIBUTES/VARIABLE_VALUE"] for i in range(count)]


BUILDERS = ("two_heads", "two_heads_list")


@pytest.fixture(scope="module")
def trained(project, tmp_path_factory) -> dict:
    """Each model's `train`, and Keras's answers for all of them from ONE oracle process (oracle.run_oracles: Keras on
    JAX imported once, not once per model), shared by the tests below: {name: (model_dir, train's stdout, its
    weights, the oracle's answers)} for each builder of BUILDERS (the job's own model.builder, two_heads, among
    them) and "compiled" (the builder that compiles its model itself, compiled.yaml)."""
    (project / "twoheads.py").write_text(TWO_HEADS_COMPILED)
    write_compiled_job(project, "twoheads:build", source="two.yaml")
    root = tmp_path_factory.mktemp("two_labels_runs")
    runs, calls = {}, {}
    for name in (*BUILDERS, "compiled"):
        model_dir = root / "runs" / name
        if name == "compiled":
            done = _run("train", project, "--model-dir", str(model_dir), job="compiled.yaml")
            oracle = dict(builder="twoheads:build", compile=False, job="compiled.yaml")
        else:
            done = _run("train", project, "--model-dir", str(model_dir), "--set", f"model.builder=oraclemodels:{name}")
            oracle = dict(builder=name, job="two.yaml", losses=KERAS_LOSSES, metrics=KERAS_METRICS)
        ours = _model_weights(model_dir)
        runs[name] = (model_dir, done.stdout, ours)
        calls[name] = oracle_call(project, backend="jax", checkpoint=ours, **oracle)
    (root / "oracle").mkdir()
    answers = run_oracles(root / "oracle", run_env(), calls)
    return {name: (*run, answers[name]) for name, run in runs.items()}


@pytest.mark.parametrize("builder", BUILDERS)
def test_two_labels_train_evaluate_and_export_as_keras_fit_evaluate_and_predict(project, trained, tmp_path, builder):
    """The heads as a dict keyed like the labels, and as a list [box, cls] of output layers named like the labels
    (declared cls, box): each label scored against its own head."""
    model = ("--set", f"model.builder=oraclemodels:{builder}")
    validated = _run("validate", project, *model)
    assert "jax-engine-unsupported" not in validated.stdout + validated.stderr

    model_dir, trained_stdout, ours, oracle = trained[builder]
    assert_weights_equal(ours, oracle["fit"])

    expected = oracle["evaluate"]
    assert set(expected) == {"loss", "cls_loss", "box_loss", "cls_accuracy", "box_mean_absolute_error"}
    evaluated = _run("evaluate", project, "--set", f"run.model_dir={model_dir}", *model)
    assert_reported_as_evaluated(model_dir, trained_stdout, evaluated.stdout, expected, step=STEPS)

    exported = _run("export", project, str(tmp_path / "exported"), "--set", f"run.model_dir={model_dir}", *model)
    path = re.search(r"^exported (\S+)$", exported.stdout, re.MULTILINE).group(1)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    images = np.stack([tf.io.parse_single_example(r, {"image": tf.io.FixedLenFeature([8, 8, 1], tf.float32)})[
        "image"].numpy() for r in tf.data.TFRecordDataset(str(project / "eval2.tfrecord"))])
    served = serve(image=tf.constant(images))
    for name in ("cls", "box"):
        np.testing.assert_allclose(served[name].numpy(), oracle["predict"][name], err_msg=name, **SERVED)


def test_validate_refuses_what_train_fails_at_for_a_label_its_loss_cannot_score(project, tmp_path):
    """A class id's crossentropy given the box (4 values per example) fails train's first step, where Keras's loss
    compares the box with the output; validate, which traces that step, refuses the job with the same words."""
    wrong = ("--set", "model.loss.box=sparse_categorical_crossentropy", "--set", "model.metrics=[accuracy]")
    validated = _run("validate", project, *wrong, ok=False)
    trained = _run("train", project, "--model-dir", str(tmp_path / "run"), *wrong, ok=False)
    said_validate, said_train = validated.stdout + validated.stderr, trained.stdout + trained.stderr
    assert "Traceback" not in said_validate + said_train, said_validate + said_train
    failure = "ValueError: Arguments `target` and `output` must have the same shape up until the last dimension"
    assert f"model.builder: building the train model: {failure}" in said_validate, said_validate
    assert f"model.builder: building the train graph: {failure}" in said_train, said_train


def test_the_explained_program_trains_two_labels_as_tpulaunch_train_does(project, trained, tmp_path):
    """`tpulaunch explain`'s program of the two-label job, run with nothing of tpulaunch importable, trains to the
    weights `tpulaunch train` does (the shared `train` of two.yaml: its own builder, two_heads) and evaluates as it
    does."""
    import sys

    from programs_run import RUN_WITHOUT_TPULAUNCH

    job = yaml.safe_load((project / "two.yaml").read_text())
    job["run"]["model_dir"] = str(tmp_path / "run")
    (project / "explained.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    program, wrapper = tmp_path / "program.py", tmp_path / "run_without_tpulaunch.py"
    _run("explain", project, "-o", str(program), job="explained.yaml")
    assert "\nLABEL_NAMES = ['cls', 'box']\n" in program.read_text()
    wrapper.write_text(RUN_WITHOUT_TPULAUNCH)
    env = {k: v for k, v in run_env().items() if k != "PYTHONPATH"}
    ran = subprocess.run([sys.executable, "-I", str(wrapper), str(program)], cwd="/", capture_output=True, text=True,
                         env=env, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]

    model_dir = trained["two_heads"][0]
    assert yaml.safe_load((project / "two.yaml").read_text())["model"]["builder"] == "oraclemodels:two_heads"
    theirs, ours = checkpoint_variables(model_dir), checkpoint_variables(tmp_path / "run")
    assert sorted(theirs) == sorted(ours) and ours["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == STEPS
    for name in theirs:
        np.testing.assert_allclose(ours[name], theirs[name], err_msg=name, rtol=1e-5, atol=1e-6)
    results = eval(ran.stdout.splitlines()[-1], {})
    assert {"loss", "cls_loss", "box_loss", "cls_accuracy", "box_mean_absolute_error"} <= set(results), results


def test_a_compiled_two_head_model_trains_with_its_own_compile_as_keras_fit_and_evaluate_do(project, trained):
    """The job sets no loss, optimizer or metrics: the builder's own compile (per-output losses, loss weights,
    metrics and weighted metrics) trains the two labels to fit's weights and evaluates as evaluate() does (its
    `train` and oracle: the shared `trained`'s "compiled")."""
    model_dir, trained_stdout, ours, oracle = trained["compiled"]
    assert "Functional was compiled: its loss {cls: SparseCategoricalCrossentropy, box: 'mse'}" in trained_stdout

    assert_weights_equal(ours, oracle["fit"])
    expected = oracle["evaluate"]
    assert set(expected) == {"loss", "cls_loss", "box_loss", "cls_acc", "box_mae", "box_mse"}
    evaluated = _run("evaluate", project, "--set", f"run.model_dir={model_dir}", job="compiled.yaml")
    assert_reported_as_evaluated(model_dir, trained_stdout, evaluated.stdout, expected, step=STEPS)
