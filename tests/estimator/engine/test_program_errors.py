"""What a TF1-era TPUEstimator program trips on, said by validate and train alike: at the job key and the program's own
line, with what to do. Real TPUEstimator builds on the CPU; each program is a module of its own name (this process
may have imported another one beside it).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import tensorflow as tf
from click.testing import CliRunner

from tpulaunch.checks.validate import validate_job
from tpulaunch.cli.app import cli
from tpulaunch.engine.estimator.build import build_problems
from tpulaunch.errors import first_line
from tpulaunch.job.load import load_job
from tpulaunch.plan.build import build_plan

HEAD = textwrap.dedent('''
    import tensorflow as tf


    def input_fn(params):
        return tf.data.Dataset.from_tensors((tf.ones([4]), tf.constant(1))).repeat().batch(
            params["batch_size"], drop_remainder=True)


    def model_fn(features, labels, mode, params):
        logits = tf.matmul(features, tf.compat.v1.get_variable("w", [4, 2]))
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
        if mode == tf.estimator.ModeKeys.EVAL:
            return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss)
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        optimizer = OPTIMIZER
        step = tf.compat.v1.train.get_global_step()
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(loss, step))
''')

JOB = textwrap.dedent('''
    name: program
    model: {model_fn: MODULE:model_fn}
    data:
      input_fn: INPUT_FN
      features: {x: {shape: [4]}}
      labels: {label: {shape: [], dtype: int32}}
    train: {batch_size: 8, steps: 2}
    eval: {batch_size: 4, steps: 1}
    run: {model_dir: runs/program}
''')


def write(tmp_path: Path, module: str, program: str, input_fn: str = "") -> Path:
    (tmp_path / f"{module}.py").write_text(program)
    job = tmp_path / "job.yaml"
    job.write_text(JOB.replace("INPUT_FN", input_fn or "MODULE:input_fn").replace("MODULE", module))
    return job


def line_of(program: str, text: str) -> int:
    return next(i for i, line in enumerate(program.splitlines(), 1) if text in line)


def errors(job: Path) -> list:
    return [p for p in validate_job(str(job)).problems if p.is_error]


def train(job: Path, *args: str):
    return CliRunner().invoke(cli, ["train", "--local", str(job), *args])


def test_cross_shard_optimizer_under_local_is_named_with_what_to_do(tmp_path):
    """tf.tpu.CrossShardOptimizer, unconditionally: its CrossReplicaSum has no CPU kernel. validate and train refuse
    it at model.model_fn before a step, naming the op, what makes it, the program's line, and the use_tpu fix."""
    program = HEAD.replace("OPTIMIZER", "tf.compat.v1.tpu.CrossShardOptimizer(optimizer)")
    job = write(tmp_path, "cross_shard_program", program)
    line = line_of(program, "CrossShardOptimizer") + 2  # minimize() makes the op, two lines below
    [problem] = errors(job)
    assert problem.path == "model.model_fn", problem
    assert problem.message.startswith(
        "building the train graph: the graph has the op 'CrossReplicaSum', which runs on a TPU only: "
        "tf.compat.v1.tpu.CrossShardOptimizer (or tf.compat.v1.tpu.cross_replica_sum) makes it "
        f"(at {tmp_path / 'cross_shard_program.py'}:{line}, in model_fn)"), problem.message
    assert "if params['use_tpu']: optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)" in problem.hint

    result = train(job)
    assert result.exit_code == 1, result.output
    assert "error: model.model_fn: building the train graph: the graph has the op 'CrossReplicaSum'" in result.output
    assert "Traceback" not in result.output and "Registered kernels" not in result.output
    assert tf.train.latest_checkpoint(str(tmp_path / "runs" / "program")) is None

    # Wrapped only on a TPU, as tensorflow/tpu's programs do: it trains here.
    fixed = HEAD.replace("OPTIMIZER", "tf.compat.v1.tpu.CrossShardOptimizer(optimizer) if params['use_tpu'] "
                                      "else optimizer")
    assert train(write(tmp_path, "cross_shard_fixed", fixed), "--set", "eval=null").exit_code == 0


def test_tensorflows_message_is_the_line_that_says_what_is_wrong():
    """A graph that ran an op with no kernel here: TensorFlow's message goes on with 'Registered kernels:'."""
    with tf.Graph().as_default():
        summed = tf.compat.v1.tpu.cross_replica_sum(tf.ones([2]))
        with tf.compat.v1.Session() as session, pytest.raises(tf.errors.InvalidArgumentError) as raised:
            session.run(summed)
    assert "Registered kernels:" in str(raised.value)
    assert first_line(raised.value).startswith("No OpKernel was registered to support Op 'CrossReplicaSum'")


def test_a_failing_input_fn_is_located_at_its_line_with_the_debug_hint(tmp_path):
    """TF1 shape behaviour (a dimension's .value) in the input_fn: the job key, the program's line, the TF2 fix."""
    program = HEAD.replace("OPTIMIZER", "optimizer").replace(
        "def input_fn(params):\n", "def input_fn(params):\n    width = tf.TensorShape([None, 4])[1].value\n")
    job = write(tmp_path, "dimension_program", program)
    where = f"{tmp_path / 'dimension_program.py'}:{line_of(program, '.value')}, in input_fn"
    [problem] = errors(job)
    assert (problem.path, problem.code) == ("data.input_fn", "input-fn-call-failed")
    assert problem.message.endswith("failed: AttributeError: 'int' object has no attribute 'value'"), problem.message
    assert problem.hint.startswith(f"raised at {where}; TensorFlow 2's shapes hold ints and None"), problem.hint
    assert "`tpulaunch --debug train --local` shows the traceback" in problem.hint

    result = train(job)
    assert result.exit_code == 1 and f"raised at {where}" in result.output, result.output


def test_an_input_fn_that_fails_in_the_build_is_located_at_its_line(tmp_path):
    """The same failure where TensorFlow calls the input_fn (train's build, validate's stopped build)."""
    program = HEAD.replace("OPTIMIZER", "optimizer").replace(
        "def input_fn(params):\n", "def input_fn(params):\n    assert params['batch_size'] < 8, 'too big'\n")
    job = write(tmp_path, "assert_program", program)
    loaded = load_job(str(job))
    [problem] = build_problems(loaded, build_plan(loaded.job, local=True))
    assert (problem.path, problem.message) == ("data.input_fn", "building the train graph: AssertionError: too big")
    where = f"{tmp_path / 'assert_program.py'}:{line_of(program, 'too big')}, in input_fn"
    assert problem.hint == (f"the error is in the job's input_fn, at {where} "
                            "(`tpulaunch --debug train --local` shows the traceback)")


def test_an_eval_graph_error_is_located_at_the_eval_entry(tmp_path):
    """One input_fn per mode; the eval one fails: the eval entry, in validate's check and in the build."""
    program = HEAD.replace("OPTIMIZER", "optimizer") + textwrap.dedent('''

        def eval_input_fn(params):
            raise ValueError("no evaluation data here")
    ''')
    job = write(tmp_path, "eval_entry_program", program, "{train: MODULE:input_fn, eval: MODULE:eval_input_fn}")
    [problem] = errors(job)
    assert (problem.path, problem.line) == ("data.input_fn.eval", 5), problem
    loaded = load_job(str(job))
    [built] = build_problems(loaded, build_plan(loaded.job, local=True))
    assert (built.path, built.message) == ("data.input_fn.eval",
                                           "building the eval graph: ValueError: no evaluation data here")


@pytest.mark.parametrize("imports, said, instead", [
    ("import tensorflow.contrib.slim as slim", "'tensorflow.contrib.slim'", "tf-slim (pip install tf-slim"),
    ("from tensorflow.contrib import tpu as contrib_tpu", "'tensorflow.contrib.tpu'", "tf.compat.v1.estimator.tpu"),
])
def test_an_import_of_tensorflow_contrib_says_tensorflow_2_removed_it(tmp_path, imports, said, instead):
    module = f"contrib_program_{len(imports)}"
    program = f"{imports}\n" + HEAD.replace("OPTIMIZER", "optimizer")
    problems = errors(write(tmp_path, module, program))
    assert [p.path for p in problems] == ["model.model_fn", "data.input_fn"], problems  # both in that module
    problem = problems[0]
    assert f"module '{module}' imports {said}, which TensorFlow 2 removed" in problem.message, problem.message
    assert problem.message.endswith(f"(at {tmp_path / module}.py:1)"), problem.message
    assert problem.hint.startswith("no package provides it: port the import") and instead in problem.hint, problem.hint
    assert "pip install the package that provides" not in problem.hint


def test_tf_contrib_used_inside_the_model_fn_says_the_same(tmp_path):
    program = HEAD.replace("OPTIMIZER", "tf.contrib.tpu.CrossShardOptimizer(optimizer)")
    [problem] = errors(write(tmp_path, "contrib_attribute_program", program))
    assert problem.path == "model.model_fn"
    assert problem.message.endswith("AttributeError: module 'tensorflow' has no attribute 'contrib'"), problem.message
    assert problem.hint.startswith("no package provides it: port the import"), problem.hint
    assert f"at {tmp_path / 'contrib_attribute_program.py'}:{line_of(program, 'tf.contrib')}" in problem.hint


def test_eval_params_are_a_model_fn_jobs_and_not_tensorflows_keys(tmp_path):
    """Static: eval.params on a builder job (its model.params are the builder's arguments), and a key TensorFlow sets."""
    job = write(tmp_path, "eval_params_program", HEAD.replace("OPTIMIZER", "optimizer"))
    text = job.read_text().replace("eval: {batch_size: 4, steps: 1}",
                                   "eval: {batch_size: 4, steps: 1, params: {scale: 0.0, batch_size: 2}}")
    job.write_text(text)
    found = [(p.code, p.path) for p in validate_job(str(job), static=True).problems if p.is_error]
    assert found == [("params-set-by-tensorflow", "eval.params.batch_size")]

    job.write_text(text.replace("model: {model_fn: eval_params_program:model_fn}", "model: {builder: some.models:build}"))
    found = [(p.code, p.path) for p in validate_job(str(job), static=True).problems if p.is_error]
    assert ("eval-params-builder-job", "eval.params") in found, found
