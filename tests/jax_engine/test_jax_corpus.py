"""The keras engine's Keras 3 corpus on the jax engine: `validate` says OK exactly when `train` works there too, and
what the jax engine does not run yet is refused by both at the same key (never "unexpected", never a traceback).

Keras chooses its backend once per process and this pytest process's Keras is on TensorFlow, so one `tpulaunch`
process of its own (Keras on JAX) validates and trains every job in turn, through the same commands the CLI runs,
and reports each outcome; the assertions are made here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import user_models as corpus
from paths import REPO

# The part of the corpus the jax engine trains as the keras engine does (float32, losses and metrics by the names it
# compiles; two heads paired with their labels by order and by name), the part it refuses at a key of what it does
# not run yet, and jobs broken for every engine.
TRAINS = ("subclassed", "two_inputs", "custom_layer", "own_compute_loss", "compiled", "two_outputs_list_by_order",
          "two_outputs_list_by_name")
# What it refuses, and where: what it does not run yet, and steps written for Keras on TensorFlow (`step(self,
# data)`; on JAX Keras calls `step(self, state, data)`).
NOT_YET = {"sequential_without_input": "model.metrics", "mixed_float16": "model.precision",
           "two_outputs_dict_own_loss_and_metric": "model.loss.box", "own_keras3_optimizer": "model.optimizer.name",
           "own_train_step": "model.builder", "own_test_step": "model.builder"}
BROKEN = ("label_shape_wrong_for_loss", "wrong_number_of_inputs", "one_class_loss_for_a_box_head",
          "outputs_not_matching_labels")

RUN_EACH = textwrap.dedent('''
    import json, sys
    from click.testing import CliRunner
    from tpulaunch.cli import run, validate

    outcomes = {}
    for path in sys.argv[2:]:
        said = {}
        for verb, command, args in (("validate", validate.validate, [path, "--local", "--set", "run.engine=jax"]),
                                    ("train", run.train, [path, "--local", "--set", "run.engine=jax"])):
            result = CliRunner().invoke(command, args)
            said[verb] = {"exit": result.exit_code, "output": result.output,
                          "raised": None if result.exception is None or isinstance(result.exception, SystemExit)
                          else repr(result.exception)}
        outcomes[path] = said
    with open(sys.argv[1], "w") as handle:
        json.dump(outcomes, handle)
''')

project = corpus.project


@pytest.fixture(scope="module")
def outcomes(project, tmp_path_factory) -> dict:
    names = (*TRAINS, *NOT_YET, *BROKEN)
    paths = {}
    for name in names:
        document, _ = corpus.KERAS3_JOBS[name]
        paths[name] = corpus.write_job(project, f"jax_{name}", document)
    report = tmp_path_factory.mktemp("jax_corpus") / "outcomes.json"
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "KERAS_BACKEND")}
    env.update(KERAS_BACKEND="jax", CI="1", PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH"))
                                                                        if p))
    ran = subprocess.run([sys.executable, "-c", RUN_EACH, str(report), *map(str, paths.values())], cwd=project,
                         env=env, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    by_path = json.loads(report.read_text())
    return {name: by_path[str(path)] for name, path in paths.items()}


@pytest.mark.parametrize("name", (*TRAINS, *NOT_YET, *BROKEN))
def test_validate_agrees_with_train_on_the_jax_engine(outcomes, name):
    validated, trained = outcomes[name]["validate"], outcomes[name]["train"]
    said = f"validate:\n{validated['output']}\ntrain:\n{trained['output']}"
    assert validated["raised"] is None and trained["raised"] is None, (validated["raised"], trained["raised"], said)
    assert (validated["exit"] == 0) == (trained["exit"] == 0), said
    assert "unexpected" not in said and "Traceback" not in said, said
    if name in TRAINS:
        assert validated["exit"] == 0 and "done | step 2/2" in trained["output"], said
    else:
        assert validated["exit"] == 1 and trained["exit"] == 1, said
        if name in NOT_YET:
            key = NOT_YET[name]
            assert f"{key}:" in validated["output"] and " engine" in validated["output"], said
            assert key in trained["output"], said
