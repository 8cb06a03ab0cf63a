"""The jax engine's `validate` traces every step the job runs (`engine/jax/runner.trace_steps`): a job whose eval
path breaks is refused at its key before any training, not after it. Each run is a `tpulaunch` process of its own
(Keras chooses its backend once per process)."""

from __future__ import annotations

import subprocess
import textwrap

from jax_runs import TPULAUNCH, run_env
from jax_runs import project  # noqa: F401  (the fixture: the small Keras 3 job)

# A classifier whose own JAX test_step (keras.io's guide's form) takes the class along an axis its outputs do not
# have: its training step is Keras's and runs; only an evaluation fails.
EVAL_BROKEN = textwrap.dedent('''
    import keras


    class Scored(keras.Model):
        def test_step(self, state, data):
            x, y = data
            trainable, non_trainable, metrics_variables = state
            y_pred, non_trainable = self.stateless_call(trainable, non_trainable, x, training=False)
            predicted = keras.ops.argmax(y_pred, axis=2)
            return {"hits": keras.ops.mean(keras.ops.cast(predicted == y, "float32"))}, state


    def classifier(num_classes=3):
        inputs = keras.Input(shape=(8, 8, 1), name="image")
        x = keras.layers.GlobalAveragePooling2D()(inputs)
        return Scored(inputs, keras.layers.Dense(num_classes)(x))
''')


def test_validate_refuses_a_job_whose_eval_step_breaks_at_its_key(project):
    (project / "k3eval.py").write_text(EVAL_BROKEN)
    job = [str(project / "job.yaml"), "--local", "--set", "model.builder=k3eval:classifier",
           "--set", "flags={}"]
    checked = subprocess.run([*TPULAUNCH, "validate", *job], capture_output=True, text=True, env=run_env(),
                             timeout=300, cwd=project)
    said = checked.stdout + checked.stderr
    assert checked.returncode == 1 and "Traceback" not in said, said
    assert "model.builder: building the eval model: " in said and "IndexError" in said, said
    assert "building the train" not in said, said  # its train step is Keras's own, and traces

    # Without eval: nothing evaluates, and the same model validates.
    trained_only = subprocess.run([*TPULAUNCH, "validate", *job, "--set", "eval=null"], capture_output=True,
                                  text=True, env=run_env(), timeout=300, cwd=project)
    assert trained_only.returncode == 0, trained_only.stdout + trained_only.stderr
