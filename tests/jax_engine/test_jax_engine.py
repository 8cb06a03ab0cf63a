"""The jax engine (Keras 3 on JAX) trains the same job file for real on this CPU: data-parallel over 8 devices
(XLA's host platform split) equals one device on the same examples, evaluate reads a checkpoint, export writes a
SavedModel that TensorFlow serves, Ctrl-C saves a checkpoint the rerun resumes from, and what it does not run is
refused at its key. Each run is a `tpulaunch` process of its
own: Keras chooses its backend once per process, and this pytest process's Keras is on TensorFlow."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml

from jax_runs import KERAS3_MODELS, TPULAUNCH, checkpoint_variables, run_env
from jax_runs import project  # noqa: F401  (the fixture: the job these tests train)
from paths import REPO

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first


def _run(verb: str, project: Path, *args: str, devices: int = 1) -> subprocess.CompletedProcess:
    return subprocess.run([*TPULAUNCH, verb, str(project / "job.yaml"), *args], capture_output=True, text=True,
                          env=run_env(devices), timeout=300, cwd=project)


def _keras3_classifier_with(variables: dict):
    """The job's classifier built by this process's Keras 3 (on TensorFlow) holding a checkpoint's weights: the
    jax engine saves the model's weights first, in their order, as variables/0, variables/1, ..."""
    import keras

    namespace = {}
    exec(KERAS3_MODELS, namespace)
    model = namespace["classifier"](num_classes=3, filters=5)
    model.set_weights([variables[f"variables/{i}/.ATTRIBUTES/VARIABLE_VALUE"] for i in range(len(model.weights))])
    assert isinstance(model, keras.Model)
    return model


@pytest.fixture(scope="module")
def one_device_run(project, tmp_path_factory) -> tuple:
    """`tpulaunch train` of the job on one device, with its evaluation at the end: (model_dir, stdout)."""
    one = tmp_path_factory.mktemp("trained") / "one"
    result = _run("train", project, "--model-dir", str(one))
    assert result.returncode == 0, result.stderr
    assert re.search(r"^eval \| step 6 \| accuracy [0-9.]+ \| loss [0-9.]+$", result.stdout, re.MULTILINE)
    # The job's flags: were set before its builder ran: the convolution has conv_filters' 5, not its default 4.
    assert checkpoint_variables(one)["variables/0/.ATTRIBUTES/VARIABLE_VALUE"].shape == (3, 3, 1, 5)
    return one, result.stdout


def test_data_parallel_over_8_devices_equals_one_device_evaluates_and_exports_a_savedmodel_that_serves(
        project, one_device_run, tmp_path):
    (one, trained), eight = one_device_run, tmp_path / "eight"
    result = _run("train", project, "--model-dir", str(eight), "--set", "eval=null", devices=8)
    assert result.returncode == 0, result.stderr
    for run, devices, stdout in ((one, 1, trained), (eight, 8, result.stdout)):
        assert f"checkpoint | step 6 | {run}/model.ckpt-6" in stdout
        assert f"jax | data-parallel over {devices} cpu device{'s' if devices > 1 else ''}" in stdout
    first, second = checkpoint_variables(one), checkpoint_variables(eight)
    assert sorted(first) == sorted(second)
    assert first["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == 6
    for name in first:
        np.testing.assert_allclose(first[name], second[name], rtol=1e-5, atol=1e-5, err_msg=name)
    # Steps 4 to 6 changed the weights: the two runs agree on a training that happened.
    third = checkpoint_variables(one, str(one / "model.ckpt-3"))
    assert any(not np.allclose(first[name], value) for name, value in third.items() if "global_step" not in name)

    evaluated = _run("evaluate", project, "--set", f"run.model_dir={one}", "--checkpoint", str(one / "model.ckpt-3"))
    assert evaluated.returncode == 0, evaluated.stderr
    assert re.search(r"^eval \| step 3 \| accuracy [0-9.]+ \| loss [0-9.]+$", evaluated.stdout, re.MULTILINE), \
        evaluated.stdout

    # The export of the 8-device run serves without JAX: TensorFlow loads it and answers what the checkpoint's
    # model answers, built here by Keras 3 on TensorFlow.
    exported = _run("export", project, str(tmp_path / "exported"), "--set", f"run.model_dir={eight}", devices=8)
    assert exported.returncode == 0, exported.stderr
    path = re.search(r"^exported (\S+)$", exported.stdout, re.MULTILINE).group(1)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    images = np.random.default_rng(0).random((5, 8, 8, 1), dtype=np.float32)
    served = serve(image=tf.constant(images))
    assert list(served) == ["outputs"]
    np.testing.assert_allclose(served["outputs"].numpy(), _keras3_classifier_with(second)(images).numpy(),
                               rtol=1e-5, atol=1e-5)


def test_the_explained_program_trains_over_8_devices_as_tpulaunch_train_does(project, one_device_run, tmp_path):
    """`tpulaunch explain`'s program, run with nothing of tpulaunch importable: the same checkpoints, weights and
    evaluation as `tpulaunch train` of the job; the job's `${RUN_DIR}` is read from the environment as it runs."""
    from programs_run import RUN_WITHOUT_TPULAUNCH
    from tpulaunch.cli.render.run_text import format_value

    job = yaml.safe_load((project / "job.yaml").read_text())
    job["run"]["model_dir"] = "${RUN_DIR}/run"
    (project / "explained.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    program, wrapper = tmp_path / "program.py", tmp_path / "run_without_tpulaunch.py"
    explained = subprocess.run([*TPULAUNCH, "explain", str(project / "explained.yaml"), "-o", str(program)],
                               capture_output=True, text=True, env=dict(run_env(), RUN_DIR="/nowhere"), timeout=120)
    assert explained.returncode == 0, explained.stderr
    text = program.read_text()
    source = (REPO / "tpulaunch" / "engine" / "jax" / "standalone.py").read_text()
    start = source.index("from tpulaunch.engine.portable import (")  # verbatim but for this import: the program
    assert source[:start] in text and source[source.index(")\n", start) + 2:] in text  # defines them above it
    assert "MODEL_DIR = (os.environ['RUN_DIR'] + '/run')  # run.model_dir (explained.yaml:" in text
    assert "/nowhere" not in text
    lines = text.splitlines()
    assert lines.index('os.environ["KERAS_BACKEND"] = "jax"') < lines.index("import tensorflow as tf")

    wrapper.write_text(RUN_WITHOUT_TPULAUNCH)
    env = {k: v for k, v in run_env(devices=8).items() if k != "PYTHONPATH"}
    ran = subprocess.run([sys.executable, "-I", str(wrapper), str(program)], cwd="/", capture_output=True, text=True,
                         env=dict(env, RUN_DIR=str(tmp_path)), timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    said = ran.stdout.splitlines()
    assert said[0] == "data-parallel over 8 cpu devices"
    assert [line for line in said if line.startswith("checkpoint ")] == \
        [f"checkpoint {tmp_path}/run/model.ckpt-3", f"checkpoint {tmp_path}/run/model.ckpt-6"]

    (one, trained) = one_device_run
    theirs, ours = checkpoint_variables(one), checkpoint_variables(tmp_path / "run")
    assert sorted(theirs) == sorted(ours) and ours["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == 6
    for name in theirs:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-5, atol=1e-5, err_msg=name)
    # The evaluation at the end, as `tpulaunch train` printed it (4 significant digits).
    results = eval(said[-1], {})
    shown = f"eval | step {results['global_step']} | accuracy {format_value(results['accuracy'])} | " \
            f"loss {format_value(results['loss'])}"
    assert shown in trained.splitlines()


def test_sigint_saves_a_checkpoint_and_the_rerun_resumes_from_it(project, tmp_path):
    """Ctrl-C once a progress line shows training under way, in a run far longer than the test lasts."""
    run = tmp_path / "run"
    child = subprocess.Popen([*TPULAUNCH, "train", str(project / "job.yaml"), "--model-dir", str(run), "--set",
                              "eval=null", "--set", "train.steps=1000000", "--set", "run.log_every_steps=10",
                              "--set", "run.save_checkpoints_steps=100000"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env(), cwd=project)
    line = child.stdout.readline()
    while line and not line.startswith("train | step "):
        line = child.stdout.readline()
    assert line.startswith("train | step 10/1000000 | "), child.stderr.read()
    child.send_signal(signal.SIGINT)
    _out, err = child.communicate(timeout=120)

    assert child.returncode == 130, err
    stopped = re.search(r"stopped at step (\d+), checkpoint saved; rerun the same command to resume", err)
    assert stopped, err
    step = int(stopped.group(1))
    assert checkpoint_variables(run)["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == step >= 10

    rerun = _run("train", project, "--model-dir", str(run), "--set", "eval=null", "--set", f"train.steps={step + 3}")
    assert rerun.returncode == 0, rerun.stderr
    assert f"resumed from step {step} ({run})" in rerun.stdout.splitlines()
    assert checkpoint_variables(run)["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == step + 3


def test_what_the_jax_engine_does_not_run_is_refused_at_its_key(project):
    static = _run("validate", project, "--static", "--set", "model.model_fn=k3models:classifier",
                  "--set", "model.builder=null", "--set", "data.skip_corrupt=true")
    assert static.returncode == 1, static.stdout + static.stderr
    assert "model.model_fn: a TPUEstimator model_fn runs only on the estimator engine; this job runs on the jax " \
           "engine" in static.stdout + static.stderr
    assert "data.skip_corrupt: the jax engine does not skip corrupt records yet" in static.stdout + static.stderr

    keras2 = _run("validate", project, "--set", "model.builder=k3models:tf_keras_classifier")
    said = keras2.stdout + keras2.stderr
    assert keras2.returncode == 1, said
    assert "--set:1:1: model.builder: building the train model: model builder 'k3models:tf_keras_classifier' " \
           "returned Functional of tf_keras, a tf.keras (Keras 2) model; the jax engine trains Keras 3 models" in said
    assert "[jax-engine-keras2-model]" in said and "Traceback" not in said

    # explain's program trains data-parallel only: a spatial split gets none yet (its mesh is tpulaunch's own).
    split = _run("explain", project, "--set", "partition={features: {image: [1, 2, 2, 1]}}")
    said = split.stdout + split.stderr
    assert split.returncode == 1 and "Traceback" not in said, said
    assert "this job trains split spatially (partition:), which its program does not do yet" in said


def test_a_jax_run_frozen_in_the_middle_of_a_save_leaves_its_successors_checkpoint_alone(project, tmp_path):
    from lease_runs import Run, check_fenced_mid_save

    env = dict(run_env(), TPULAUNCH_LEASE_RENEW_S="0.2", TPULAUNCH_LEASE_STALE_S="600")
    check_fenced_mid_save(lambda run_dir, *args, **extra: Run(["train", str(project / "job.yaml"), "--model-dir",
                                                               str(run_dir), *args], env=dict(env, **extra)),
                          tmp_path / "run")
