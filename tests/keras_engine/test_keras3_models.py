"""Keras 3 models (`import keras`) on the keras engine, beside tf-keras ones: the same user-written models as
tests/keras_engine/test_user_models_keras.py, written with Keras 3 (tests/models/keras3_models.py).

`validate` says OK exactly when `train` works, and refuses a broken job at the key train names; a trained
Keras 3 model resumes to exactly train.steps (in a process where tf_keras cannot be imported: the
tensorflow-tpu install has none), evaluates to the training's last metrics, exports a SavedModel that
serves, and its explained program evaluates to the same metrics; two replicas take the same step as one;
memory is planned from the traced step as for tf-keras; a TPU target is warned about.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml
from click.testing import CliRunner

import builder_contract as contract
import memory_cases
import user_models as corpus
from explained_programs import explain_keras, keras_evaluations, run_keras_program
from paths import REPO
from tpulaunch.cli import run as cli_run
from tpulaunch.cli import validate as cli_validate
from tpulaunch.engine.core.model_dir import checkpoint_step
from tpulaunch.job.load import load_job
from tpulaunch.job.schema import Job
from tpulaunch.plan.build import build_plan

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

ENGINE = ("--set", "run.engine=keras")
M = "keras3_models"

JOBS = corpus.KERAS3_JOBS  # name: (job, None when train must work, else the key both refuse it at, ...)

project = corpus.project


@pytest.mark.parametrize("name", list(JOBS))
def test_validate_agrees_with_train_on_keras3_models(project, name):
    document, broken_at = JOBS[name]
    path, validated, trained = contract.validate_and_train(project, f"keras3_{name}", document, *ENGINE)
    if isinstance(broken_at, tuple):
        contract.assert_refused(path, validated, trained, *broken_at)
    else:
        corpus.assert_agreement(name, path, validated, trained, broken_at)


# ---------------------------------------------------------------------------------- one model, trained

# Its own directory (records, job and model code), as a user's project.
TRAINED_JOB = {
    "name": "keras3-trained",
    "model": {"builder": f"{M}:custom_layer", "params": {"num_classes": 3}, "loss": "sparse_categorical_crossentropy",
              "optimizer": {"name": "adam", "learning_rate": 0.01}, "metrics": ["accuracy", "auc"]},
    "data": {"train": "train.tfrecord", "eval": "eval.tfrecord", "features": corpus.IMAGE, "labels": corpus.CLASS},
    "train": {"batch_size": 8, "steps": 6},
    "eval": {"batch_size": 8, "steps": 2},
    "run": {"model_dir": "runs/k3", "save_checkpoints_steps": 3, "log_every_steps": 1, "seed": 3, "engine": "keras"},
}

# `tpulaunch` in a process where tf_keras cannot be imported, as on the tensorflow-tpu install.
WITHOUT_TF_KERAS = textwrap.dedent("""\
    import sys
    sys.modules["tf_keras"] = None
    from tpulaunch.cli.app import main
    try:
        main(sys.argv[1:])
    finally:
        assert sys.modules["tf_keras"] is None
    """)


def run_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    return dict(env, PYTHONUNBUFFERED="1", CI="1", PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")


def _tpulaunch(*args: str, without_tf_keras: bool = False) -> subprocess.CompletedProcess:
    command = ([sys.executable, "-c", WITHOUT_TF_KERAS] if without_tf_keras else
               [sys.executable, "-m", "tpulaunch"])
    return subprocess.run([*command, *args], capture_output=True, text=True, env=run_env(), timeout=300)


@pytest.fixture(scope="module")
def keras3_project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("keras3_trained")
    (root / f"{M}.py").write_text((REPO / "tests" / "models" / f"{M}.py").read_text())
    specs = {**corpus.IMAGE, **corpus.CLASS}
    corpus.write_records(root / "train.tfrecord", specs, 32, seed=1)
    corpus.write_records(root / "eval.tfrecord", specs, 16, seed=2)
    (root / "job.yaml").write_text(yaml.safe_dump(TRAINED_JOB, sort_keys=False))
    return root


@pytest.fixture(scope="module")
def trained(keras3_project):
    """Trained to step 3 here, then resumed to 6 by `tpulaunch train` where tf_keras cannot be imported:
    (model_dir, the resumed run's stdout)."""
    job_file = str(keras3_project / "job.yaml")
    first = CliRunner().invoke(cli_run.train, [job_file, "--local", "--set", "train.steps=3"],
                               catch_exceptions=False)
    assert first.exit_code == 0, first.output
    run = keras3_project / "runs" / "k3"
    assert checkpoint_step(str(run)) == 3
    resumed = _tpulaunch("train", job_file, "--local", without_tf_keras=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return run, resumed.stdout


def _weights(training) -> list:
    return [np.array(v) for v in training.model.weights]


def test_a_keras3_model_resumes_to_exactly_train_steps_without_tf_keras(trained):
    run, stdout = trained
    lines = stdout.splitlines()
    assert f"resumed from step 3 ({run})" in lines, stdout
    (done,) = [line for line in lines if line.startswith("done |")]
    assert done.startswith("done | step 6/6 | 3 steps in "), done
    assert checkpoint_step(str(run)) == 6
    assert sorted(p.name for p in run.glob("model.ckpt-*.index")) == ["model.ckpt-3.index", "model.ckpt-6.index"]


def test_the_checkpoint_restores_a_trained_keras3_model_with_its_optimizer(keras3_project, trained):
    """The model as the builder makes it (seeded) differs from the checkpoint's, which restores whole."""
    from tpulaunch.engine.keras.runner import make_training

    loaded = load_job(str(keras3_project / "job.yaml"))
    training = make_training(loaded.job, build_plan(loaded.job, local=True), search_path=loaded.job.search_path)
    assert training.keras3 and type(training.optimizer).__module__.startswith("keras.")
    initial = _weights(training)
    assert training.restore() == 6
    restored = _weights(training)
    assert len(restored) == len(initial) and any(not np.allclose(a, b) for a, b in zip(initial, restored))
    assert int(training.optimizer.iterations.numpy()) == 6  # Adam's own step count came back with its slots


def test_the_precision_policy_and_loss_scaling_are_keras3s_own(keras3_project):
    from tpulaunch.engine.keras.runner import make_training

    loaded = load_job(str(keras3_project / "job.yaml"), ["model.precision=mixed_float16"])
    training = make_training(loaded.job, build_plan(loaded.job, local=True), search_path=loaded.job.search_path,
                             model_dir=str(keras3_project / "scratch"))
    assert {layer.dtype_policy.name for layer in training.model.layers[1:]} == {"mixed_float16"}
    assert type(training.optimizer).__module__.startswith("keras.") and training.optimizer.name.startswith("loss_scale")


@pytest.fixture(scope="module")
def evaluated(keras3_project, trained) -> tuple:
    """`tpulaunch evaluate` of the trained checkpoint, once for two tests: what it printed (the evaluate test) and the
    metrics it recorded in model_dir's run records, each the engine's evaluation as computed (the explained
    program's test). Returns (its CliRunner result, its run record)."""
    run, _ = trained
    result = CliRunner().invoke(cli_run.evaluate, [str(keras3_project / "job.yaml")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (run / "tpulaunch-runs.jsonl").read_text().splitlines()]
    assert records[-1]["command"] == "evaluate", records[-1]
    return result, records[-1]


def test_evaluate_gives_the_trainings_last_metrics_and_the_export_serves(keras3_project, trained, evaluated,
                                                                         tmp_path):
    run, stdout = trained
    job_file = str(keras3_project / "job.yaml")
    (trained_eval,) = [line for line in stdout.splitlines() if line.startswith("eval | step 6 |")]
    result, _ = evaluated
    assert result.exit_code == 0, result.output
    assert trained_eval in result.output.splitlines()

    exported = CliRunner().invoke(cli_run.export, [job_file, str(tmp_path / "exported")], catch_exceptions=False)
    assert exported.exit_code == 0, exported.output
    (path,) = re.findall(r"^exported (.+)$", exported.output, re.MULTILINE)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    outputs = serve(image=tf.ones([3, 8, 8, 1]))
    assert {k: v.shape.as_list() for k, v in outputs.items()} == {"outputs": [3, 3]}


def test_the_explained_program_evaluates_to_the_metrics_of_tpulaunch_evaluate(keras3_project, trained, evaluated,
                                                                               tmp_path):
    """The program `explain --engine keras` writes for a Keras 3 builder runs with nothing of tpulaunch importable
    and evaluates the checkpoint to what `tpulaunch evaluate` reports (the metrics its run record holds: the
    engine's evaluation, each a float as computed)."""
    run, _ = trained
    program = tmp_path / "program.py"
    explain_keras(keras3_project / "job.yaml", "-o", str(program), "--set", f"run.model_dir={run}")
    (results,) = keras_evaluations(run_keras_program(program, "evaluate"))
    (theirs,) = evaluated[1]["evals"]
    assert results["global_step"] == 6 == theirs["step"]
    assert theirs["metrics"] == {k: pytest.approx(v, abs=1e-5) for k, v in results.items() if k != "global_step"}


def test_two_replicas_take_the_same_step_as_one(keras3_project, tmp_path):
    """MirroredStrategy over two CPU devices and one device, one step on copies of one record (so every batch and
    every replica's share of it holds the same examples, however the pipeline shuffles): the same weights, which
    the step changed."""
    from tpulaunch.engine.keras.runner import make_training

    distinct = [bytes(r.numpy()) for r in tf.data.TFRecordDataset(str(keras3_project / "train.tfrecord")).take(1)]
    with tf.io.TFRecordWriter(str(tmp_path / "repeated.tfrecord")) as writer:
        for _ in range(64):
            for record in distinct:
                writer.write(record)
    job_file = str(keras3_project / "job.yaml")
    same = ["--set", "train.steps=1", "--set", "eval=null", "--set", f"data.train={tmp_path / 'repeated.tfrecord'}",
            "--set", f"model.builder={M}:subclassed", "--set", "model.optimizer.name=sgd"]
    one = _tpulaunch("train", job_file, "--local", "--model-dir", str(tmp_path / "one"), *same)
    two = _tpulaunch("train", job_file, "--local", "--model-dir", str(tmp_path / "two"), *same, "--cpu-replicas", "2")
    assert one.returncode == 0 and two.returncode == 0, one.stderr[-2000:] + two.stderr[-2000:]

    def checkpointed(model_dir: Path) -> dict:
        path = tf.train.latest_checkpoint(str(model_dir))
        return {name: tf.train.load_variable(path, name) for name, _ in tf.train.list_variables(path)
                if name.endswith("VARIABLE_VALUE") and not name.startswith("save_counter")}

    single, mirrored = checkpointed(tmp_path / "one"), checkpointed(tmp_path / "two")
    assert single.keys() == mirrored.keys() and len(single) > 3
    for name in single:
        np.testing.assert_allclose(mirrored[name], single[name], rtol=1e-4, atol=1e-5, err_msg=name)
    loaded = load_job(job_file, [s for s in same if s != "--set" and not s.startswith("data.")])
    initial = make_training(loaded.job, build_plan(loaded.job, local=True), search_path=loaded.job.search_path)
    before = sorted(float(np.sum(np.abs(w))) for w in _weights(initial))
    after = sorted(float(np.sum(np.abs(v))) for v in single.values() if np.ndim(v) > 0)
    assert before != pytest.approx(after, rel=1e-6)


# ------------------------------------------------------------------------------------- validate's view

# The tf-keras networks of tests/memory_cases.py, written with Keras 3.
KERAS3_NETWORKS = "import keras\n" + memory_cases.NETWORKS.replace("tf.keras.", "keras.")


def test_memory_is_planned_from_the_traced_step_as_for_tf_keras(tmp_path):
    (tmp_path / "networks.py").write_text(memory_cases.NETWORKS)
    (tmp_path / "networks3.py").write_text(KERAS3_NETWORKS)
    base = {"name": "ways", "model": {"optimizer": {"name": "adam"}},
            "data": {"features": {"image": {"shape": [64, 64, 3]}}, "labels": {"label": {"shape": [], "dtype": "int64"}}},
            "tpu": {"type": "v3-8"}, "train": {"batch_size": 64, "steps": 10},
            "run": {"model_dir": "gs://bucket/run", "engine": "keras"}}
    plans = {}
    for builder in ("networks:functional", "networks3:functional", "networks3:subclassed"):
        document = json.loads(json.dumps(base))
        document["model"]["builder"] = builder
        plans[builder] = memory_cases.plan_memory(Job.model_validate(document).located_at(str(tmp_path)))
        assert plans[builder].verdict == "fits", (builder, plans[builder].reason)
    reference = plans["networks:functional"]
    for builder, plan in plans.items():
        assert plan.params == reference.params, builder
        assert abs(plan.per_core_bytes - reference.per_core_bytes) <= 0.1 * reference.per_core_bytes, \
            (builder, plan.breakdown, reference.breakdown)


def test_validate_warns_of_a_keras3_model_for_a_tpu_target_with_the_keras_to_pin(keras3_project):
    from importlib import metadata

    job_file = str(keras3_project / "job.yaml")
    # A TPU VM's own TPU (tpu.name: local) reads local files.
    tpu = ["--set", "tpu.type=v3-8", "--set", "tpu.name=local", "--set", "tpu.iterations_per_loop=3"]
    checked = CliRunner().invoke(cli_validate.validate, [job_file, *tpu], catch_exceptions=False)
    said = checked.output
    assert "model.builder: warning: the builder returns a Keras 3 model" in said, said
    assert f"install keras=={metadata.version('keras')} on the TPU VM" in said, said
    assert checked.exit_code == 0 and "[keras3-on-tpu]" in said and "OK " in said, said
    # Besides it, at most the stack rule's warning about this machine's TensorFlow (2.21 has no TPU build).
    warnings = [line for line in said.splitlines() if ": warning: " in line]
    assert len(warnings) == 1 + ("[tpu-stack-tensorflow-without-tpu]" in said), said
    local = CliRunner().invoke(cli_validate.validate, [job_file, "--local"], catch_exceptions=False)
    assert local.exit_code == 0 and "keras3-on-tpu" not in local.output, local.output
