"""A Keras 3 model with its own JAX train_step written as Keras's guide writes it ("Customizing what happens in fit()
with JAX": `x, y = data`, the step's own gradient and optimizer update) trains on the jax engine as `model.fit` trains
it: the same weights on the same records in the same order and seed (the oracle of `oracle.py`). Keras's
train_on_batch would hand such a step (x, y, None), which it cannot unpack."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from oracle import assert_weights_equal, run_oracle, write_project
from jax_runs import TPULAUNCH, checkpoint_variables, run_env

GUIDE_STEP = textwrap.dedent('''

    import jax


    class GuideModel(keras.Model):
        def loss_and_updates(self, trainable_variables, non_trainable_variables, x, y, training=False):
            y_pred, non_trainable_variables = self.stateless_call(trainable_variables, non_trainable_variables, x,
                                                                  training=training)
            loss = self.compute_loss(x, y, y_pred)
            return loss, (y_pred, non_trainable_variables)

        def train_step(self, state, data):
            trainable_variables, non_trainable_variables, optimizer_variables, metrics_variables = state
            x, y = data
            grad_fn = jax.value_and_grad(self.loss_and_updates, has_aux=True)
            (loss, (y_pred, non_trainable_variables)), grads = grad_fn(
                trainable_variables, non_trainable_variables, x, y, training=True)
            trainable_variables, optimizer_variables = self.optimizer.stateless_apply(
                optimizer_variables, grads, trainable_variables)
            return {"loss": loss}, (trainable_variables, non_trainable_variables, optimizer_variables,
                                    metrics_variables)


    def guide_step():
        inputs = keras.Input(shape=(8, 8, 1), name="image")
        x = keras.layers.Flatten()(inputs)
        x = keras.layers.Dense(16, activation="relu")(x)
        return GuideModel(inputs, keras.layers.Dense(3)(x))
''')


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = write_project(tmp_path_factory.mktemp("guide_step"), "jax")
    with open(root / "oraclemodels.py", "a") as handle:
        handle.write(GUIDE_STEP)
    return root


def test_a_guide_written_jax_train_step_trains_as_fit_trains_it(project, tmp_path):
    model_dir = tmp_path / "run"
    job = ["--set", "model.builder=oraclemodels:guide_step", "--set", "model.metrics=[]", "--set", "eval=null",
           "--set", "data.eval=null"]
    checked = subprocess.run([*TPULAUNCH, "validate", str(project / "job.yaml"), *job], capture_output=True,
                             text=True, env=run_env(), timeout=300, cwd=project)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    trained = subprocess.run([*TPULAUNCH, "train", str(project / "job.yaml"), "--model-dir", str(model_dir), *job],
                             capture_output=True, text=True, env=run_env(), timeout=300, cwd=project)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    found = checkpoint_variables(model_dir)
    ours = [found[f"variables/{i}/.ATTRIBUTES/VARIABLE_VALUE"] for i in range(4)]
    oracle = run_oracle(project, tmp_path, run_env(), backend="jax", checkpoint=ours, builder="guide_step")
    assert_weights_equal(ours, oracle["fit"])


def test_the_same_step_on_the_keras_engine_is_refused_at_model_builder(project):
    """On TensorFlow Keras calls train_step(self, data): a JAX step there is refused at its key, by validate and by
    train alike, naming the engine that runs it (it was a raw TypeError at the first step)."""
    job = ["--set", "model.builder=oraclemodels:guide_step", "--set", "run.engine=keras", "--set", "model.metrics=[]"]
    for verb, extra in (("validate", []), ("train", ["--local"])):
        done = subprocess.run([*TPULAUNCH, verb, str(project / "job.yaml"), *extra, *job], capture_output=True,
                              text=True, env=run_env(), timeout=300, cwd=project)
        said = done.stdout + done.stderr
        assert done.returncode == 1, said
        assert "model.builder" in said and "take(s) the state before the batch, as Keras 3 calls them on JAX" in said
        assert "run.engine: jax" in said and "Traceback" not in said
