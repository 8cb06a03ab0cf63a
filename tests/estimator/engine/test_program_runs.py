"""A TPUEstimator program as TF1-era programs are written, run from a job file by every verb from another directory:
its model_fn imports a module of its source tree when it runs (python_path in effect for the whole run), its
input_fn opens a file the job names relatively in params (relative to the job file, wherever tpulaunch or the
explained program runs from), and it evaluates and serves with other params than it trains with (eval.params).

The model: logits = x @ w * params['scale']; the job trains with scale 1 and evaluates with eval.params
{scale: 0.0}, so the evaluation's loss is exactly ln 2 (a softmax over two zero logits) and the exported model's
logits are 0, whatever training did; the model_fn refuses an evaluation graph built with any other scale.
Everything is real: TPUEstimator on the CPU, each command in a process of its own.
"""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import programs_run
from programs_run import said

PROGRAM = textwrap.dedent('''
    import tensorflow as tf


    def input_fn(params):
        with open(params["table"]) as handle:  # a path the job gives relatively: relative to the job file
            values = [float(v) for v in handle.read().split()]
        return tf.data.Dataset.from_tensors((tf.constant(values), tf.constant(1))).repeat().batch(
            params["batch_size"], drop_remainder=True)


    def model_fn(features, labels, mode, params):
        import lazy_layers  # beside this file, imported when the model_fn runs (as TF1 programs do)

        if mode != tf.estimator.ModeKeys.TRAIN and params["scale"] != 0.0:
            raise ValueError(f"a graph that does not train wants scale 0.0, got {params['scale']}")
        logits = lazy_layers.dense(features) * params["scale"]
        spec = tf.compat.v1.estimator.tpu.TPUEstimatorSpec
        if mode == tf.estimator.ModeKeys.PREDICT:
            return spec(mode, predictions={"logits": logits})
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
        if mode == tf.estimator.ModeKeys.EVAL:
            return spec(mode, loss=loss)
        step = tf.compat.v1.train.get_global_step()
        return spec(mode, loss=loss, train_op=tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, step))
''')

LAYERS = textwrap.dedent('''
    import tensorflow as tf


    def dense(x):
        return tf.matmul(x, tf.compat.v1.get_variable("w", [4, 2]))
''')

JOB = textwrap.dedent('''
    name: lazy
    python_path: [src]
    model:
      model_fn: lazy_program:model_fn
      params: {table: data/table.txt, scale: 1.0}
    data:
      input_fn: lazy_program:input_fn
      features: {x: {shape: [4]}}
      labels: {label: {shape: [], dtype: int32}}
    train: {batch_size: 8, steps: 2}
    eval: {batch_size: 4, steps: 1, params: {scale: 0.0}}
    run: {model_dir: runs/lazy}
''')


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The job in project/, its program in project/src/; every command runs from elsewhere/."""
    root = tmp_path_factory.mktemp("program_runs")
    (root / "project" / "src").mkdir(parents=True)
    (root / "project" / "data").mkdir()
    (root / "elsewhere").mkdir()
    (root / "project" / "src" / "lazy_program.py").write_text(PROGRAM)
    (root / "project" / "src" / "lazy_layers.py").write_text(LAYERS)
    (root / "project" / "data" / "table.txt").write_text("0.5 1.0 -1.0 2.0\n")
    (root / "project" / "job.yaml").write_text(JOB)
    return root


def tpulaunch(project: Path, *args: str):
    return programs_run.tpulaunch(*args, cwd=project / "elsewhere")


@pytest.fixture(scope="module")
def trained(project):
    return tpulaunch(project, "train", "../project/job.yaml")


def test_validate_builds_every_graph_with_its_modes_params_from_another_directory(project):
    validated = tpulaunch(project, "validate", "../project/job.yaml")
    assert validated.returncode == 0 and validated.stdout.startswith("OK ../project/job.yaml"), said(validated)

    # The evaluation graph gets eval.params: another scale there is refused, at the model_fn, saying so.
    refused = tpulaunch(project, "validate", "../project/job.yaml", "--set", "eval.params.scale=2.0")
    assert refused.returncode == 1, said(refused)
    assert ("model.model_fn: building the eval graph: ValueError: a graph that does not train wants scale 0.0, "
            "got 2.0") in refused.stdout, said(refused)
    assert "in this graph params has eval.params (scale) over model.params" in refused.stdout, said(refused)
    line = next(i for i, text in enumerate(PROGRAM.splitlines(), 1) if "raise ValueError" in text)
    assert f"lazy_program.py:{line}, in model_fn" in refused.stdout, said(refused)


def test_train_evaluate_and_export_run_with_the_source_tree_and_eval_params(project, trained):
    assert trained.returncode == 0, said(trained)
    ln2 = f"{math.log(2):.4g}"
    assert re.search(rf"^eval \| step 2 \| loss {ln2}$", trained.stdout, re.M), trained.stdout
    assert tf.train.latest_checkpoint(str(project / "project" / "runs" / "lazy")).endswith("model.ckpt-2")
    # Training used scale 1: its loss is not the evaluation's.
    done = re.search(r"^done \| .*\| loss ([0-9.]+) ", trained.stdout, re.M)
    assert done and float(done.group(1)) != pytest.approx(math.log(2), abs=1e-3), trained.stdout

    evaluated = tpulaunch(project, "evaluate", "../project/job.yaml")
    assert evaluated.returncode == 0 and re.search(rf"^eval \| step 2 \| loss {ln2}$", evaluated.stdout, re.M), \
        said(evaluated)

    exported = tpulaunch(project, "export", "../project/job.yaml", "exported")  # relative to where it runs
    assert exported.returncode == 0, said(exported)
    printed = Path(re.search(r"^exported (\S+)$", exported.stdout, re.M).group(1))
    assert printed.parent == Path("exported"), exported.stdout  # said as given, written where it was given
    path = project / "elsewhere" / printed
    served = tf.saved_model.load(str(path)).signatures["serving_default"](tf.ones([3, 4]))["logits"].numpy()
    np.testing.assert_array_equal(served, np.zeros([3, 2], np.float32))  # served with eval.params: scale 0


def test_the_explained_program_runs_from_anywhere_with_the_same_params(project, trained):
    assert trained.returncode == 0, said(trained)
    explained = tpulaunch(project, "explain", "../project/job.yaml", "-o", "program.py")
    assert explained.returncode == 0, said(explained)
    program = (project / "elsewhere" / "program.py").read_text()
    assert "EVAL_PARAMS = {'scale': 0.0}" in program and "    os.chdir(JOB_DIR)" in program
    runner = project / "elsewhere" / "run_without_tpulaunch.py"
    runner.write_text(programs_run.RUN_WITHOUT_TPULAUNCH)
    (project / "other").mkdir()
    ran = programs_run.run("-I", str(runner), str(project / "elsewhere" / "program.py"), "evaluate",
                           cwd=project / "other")
    assert ran.returncode == 0, said(ran)
    printed = eval(ran.stdout.strip().splitlines()[-1], {"np": np})
    assert printed["global_step"] == 2 and printed["loss"] == pytest.approx(math.log(2), rel=1e-6)
