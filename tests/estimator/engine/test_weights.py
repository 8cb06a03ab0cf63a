"""What a fresh run starts from: the weights a builder loaded, another run's checkpoint (run.warm_start),
and never a silent random initialisation instead. Real TPUEstimator on the CPU; the values are read
back from the checkpoints the runs write (model.ckpt-0 holds the values training starts from)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tpulaunch.checks.validate import validate_job
from tpulaunch.cli.app import cli
from weight_loading import MODEL_VARIABLES, MODELS, values, write_project


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return write_project(tmp_path_factory.mktemp("weights"))


def train(project: Path, *overrides: str):
    args = ["train", str(project / "job.yaml")]
    for override in overrides:
        args += ["--set", override]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def loaded_run(project) -> Path:
    train(project)
    return project / "runs" / "loaded"


def test_a_builder_that_loads_weights_starts_training_from_exactly_those(loaded_run):
    start, after_one_step = values(loaded_run, 0), values(loaded_run, 1)
    assert sorted(start) == MODEL_VARIABLES
    for name, value in start.items():
        np.testing.assert_array_equal(value, np.full(value.shape, 0.0123, np.float32), err_msg=name)
    for name in MODEL_VARIABLES:
        if "moving" not in name:  # the moving statistics move with the batch; the weights only by the 1e-12 step
            np.testing.assert_allclose(after_one_step[name], 0.0123, rtol=0, atol=1e-9, err_msg=name)


def test_a_resumed_run_restores_its_checkpoint_not_the_builders_weights(project, tmp_path):
    model_dir = tmp_path / "resumed"
    train(project, f"run.model_dir={model_dir}", "model.optimizer.learning_rate=0.5", "train.steps=2")
    # The output layer's bias: its gradient is the softmax's error itself, never held at zero by the symmetry of
    # constant weights (a convolution's kernel behind batch normalization can barely move in two steps).
    trained = values(model_dir, 2)["dense/bias"]
    assert np.abs(trained - 0.0123).max() > 1e-3  # moved away from the builder's weights
    # --force: the learning rate is part of the model spec a resume compares; back to 1e-12 for the third step.
    resumed = CliRunner().invoke(cli, ["train", str(project / "job.yaml"), "--force", "--set", f"run.model_dir={model_dir}",
                                       "--set", "train.steps=3"])
    assert resumed.exit_code == 0 and "resumed from step 2" in resumed.output, resumed.output
    np.testing.assert_allclose(values(model_dir, 3)["dense/bias"], trained, rtol=0, atol=1e-9)


def test_warm_start_takes_the_selected_variables_from_the_checkpoint_and_the_rest_from_the_builder(
        project, loaded_run, tmp_path):
    model_dir = tmp_path / "warm"
    train(project, f"run.model_dir={model_dir}", f"model.params.weights={project / 'kernels-0.5.h5'}",
          f"run.warm_start={{from: {loaded_run}, vars: conv2d/}}")
    start = values(model_dir, 0)
    for name, value in start.items():
        expected = 0.0123 if name.startswith("conv2d/") else 0.5
        np.testing.assert_array_equal(value, np.full(value.shape, expected, np.float32), err_msg=name)


def test_warm_start_mistakes_are_located(project, loaded_run):
    job = str(project / "job.yaml")
    nowhere = validate_job(job, [f"run.warm_start={{from: {project / 'nowhere'}}}"])
    assert [(p.severity, p.code, p.path) for p in nowhere.problems] == [
        ("error", "warm-start-no-checkpoint", "run.warm_start.from")]
    nothing = validate_job(job, [f"run.warm_start={{from: {loaded_run}, vars: conv3d}}"])
    assert [(p.severity, p.code, p.path) for p in nothing.problems] == [
        ("warning", "warm-start-matches-nothing", "run.warm_start.vars")]


def test_a_builder_that_cannot_download_its_weights_is_a_located_validate_error(project, tmp_path):
    job = tmp_path / "pretrained.yaml"
    text = (project / "job.yaml").read_text().replace("weight_models:classifier", "weight_models:pretrained")
    job.write_text(text.replace(f"  params: {{weights: {project / 'kernels-0.0123.h5'}}}\n", ""))
    (tmp_path / "weight_models.py").write_text(MODELS)
    (tmp_path / "train.tfrecord").write_bytes((project / "train.tfrecord").read_bytes())
    [problem] = validate_job(str(job)).problems
    line = job.read_text().splitlines().index("  builder: weight_models:pretrained") + 1
    assert (problem.code, problem.path, problem.line) == ("builder-download-failed", "model.builder", line)
    assert problem.message.startswith("building the train graph: weight_models:pretrained downloads "
                                      "https://weights.invalid/classifier.h5 "
                                      "and the download failed")

    result = CliRunner().invoke(cli, ["train", str(job)])
    assert result.exit_code == 1
    assert ("error: model.builder: building the train graph: weight_models:pretrained downloads "
            "https://weights.invalid/classifier.h5") in result.output
    assert "unexpected" not in result.output


GROWING = textwrap.dedent('''
    import tensorflow as tf

    calls = []


    def growing(input_shape=(8, 8, 1)):
        """A builder that builds a wider model every time it is called."""
        calls.append(1)
        image = tf.keras.Input(shape=tuple(input_shape), name="image")
        x = tf.keras.layers.GlobalAveragePooling2D()(image)
        return tf.keras.Model(image, tf.keras.layers.Dense(2 + len(calls))(x))
''')


def test_a_builder_that_builds_another_model_on_a_second_call_is_a_clear_error(project, tmp_path):
    """A fresh run builds the model twice (in the run's graph, and for its starting weights): they must match."""
    (tmp_path / "growing_models.py").write_text(GROWING)
    (tmp_path / "train.tfrecord").write_bytes((project / "train.tfrecord").read_bytes())
    job = tmp_path / "growing.yaml"
    job.write_text((project / "job.yaml").read_text().replace("weight_models:classifier", "growing_models:growing")
                   .replace(f"  params: {{weights: {project / 'kernels-0.0123.h5'}}}\n", ""))
    result = CliRunner().invoke(cli, ["train", str(job), "--set", f"run.model_dir={tmp_path / 'run'}"])
    assert result.exit_code == 1, result.output
    found = re.search(r"error: the builder built another model on a second call: "
                      r"dense/kernel:0 is \[1, (\d+)\] in the second build, \[1, (\d+)\] in the graph", result.output)
    assert found and int(found[1]) == int(found[2]) + 1, result.output  # one unit wider, built once more
    assert "hint: the builder must build the same model every time it is called" in result.output
    assert "unexpected" not in result.output
