"""A job file in front of an existing TPUEstimator program: model_fn, input_fns by mode, params, absl flags.

tensorflow/tpu's own models/official/mnist/mnist_tpu.py is such a program (module-level absl FLAGS, a
model_fn reading FLAGS, one input_fn per mode reading params["data_dir"]); its original, copied unchanged
into tests/programs/tensorflow_tpu (license kept), runs next to the job file as a user's would, on
TFRecords this file writes in its format. Everything is real: TPUEstimator on the CPU, absl flags, TFRecords.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

from own_programs import PROBE, PROBE_JOB, write_project
from programs_run import refused_alike, tpulaunch
from tpulaunch.checks.validate import validate_job
from tpulaunch.cli.app import cli

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return write_project(tmp_path_factory.mktemp("own_program"))


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def trained(project):
    """`tpulaunch train` in a fresh process, as a user runs it."""
    return tpulaunch("train", "job.yaml", cwd=project)


def test_the_program_trains_and_evaluates_unmodified(project, trained):
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert "Traceback" not in trained.stdout + trained.stderr
    (evaluation,) = [line for line in trained.stdout.splitlines() if line.startswith("eval |")]
    accuracy = float(re.search(r"accuracy ([0-9.]+)", evaluation).group(1))
    assert evaluation.startswith("eval | step 120 |") and accuracy >= 0.9, trained.stdout
    assert tf.train.latest_checkpoint(str(project / "runs" / "mnist")).endswith("model.ckpt-120")


def test_evaluate_and_export_run_the_same_program(project, trained):
    evaluated = invoke("evaluate", str(project / "job.yaml"))
    assert evaluated.exit_code == 0, evaluated.output
    assert re.search(r"^eval \| step 120 \| accuracy (0\.9\d*|1) \| loss ", evaluated.output, re.M), evaluated.output

    exported = invoke("export", str(project / "job.yaml"), str(project / "exported"))
    assert exported.exit_code == 0, exported.output
    path = re.search(r"^exported (\S+)$", exported.output, re.M).group(1)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    (signature,) = serve.structured_input_signature[1].values()
    assert (signature.shape.as_list(), signature.dtype) == ([None, 28, 28, 1], tf.float32)
    # A bar in rows 10-15 is digit 5 in the data the program learned from (pixels 0-255: it divides by 255).
    image = np.zeros((1, 28, 28, 1), np.float32)
    image[0, 10:16, 4:24] = 255.0
    assert serve(tf.constant(image))["class_ids"].numpy().tolist() == [5]


def test_flags_reach_the_program_before_it_runs(project, tmp_path):
    """learning_rate 0 through flags: one step leaves every weight where it started."""
    result = invoke("train", str(project / "job.yaml"), "--model-dir", str(tmp_path / "frozen"),
                    "--set", "flags.learning_rate=0.0", "--set", "train.steps=1", "--set", "eval=null")
    assert result.exit_code == 0, result.output
    start, after = (tf.train.load_checkpoint(str(tmp_path / "frozen" / f"model.ckpt-{n}")) for n in (0, 1))
    kernels = [name for name in start.get_variable_to_shape_map() if name.endswith("kernel")]
    assert kernels
    for name in kernels:
        np.testing.assert_array_equal(start.get_tensor(name), after.get_tensor(name))


def test_the_good_job_validates(project):
    """The README's own example: validate says OK for the job train runs (its model_fn's learning-rate schedule
    reads TensorFlow's global step, which exists because validate runs TPUEstimator's own train)."""
    proc = tpulaunch("validate", "job.yaml", cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("OK job.yaml (checked: "), proc.stdout


FLAG_TYPO = ("learning_rate: 0.05", "learning_rte: 0.05")


@pytest.fixture(scope="module")
def flag_typo(project, tmp_path_factory) -> tuple:
    """The job with a flag typo (learning_rte) beside the unmodified program, and one `tpulaunch validate` of it:
    the same job and command the broken-program case for that typo and the did-you-mean test each ran, so it runs
    once and both read its output. (job file, the finished validate)"""
    root = tmp_path_factory.mktemp("flag_typo")
    job = root / "job.yaml"
    job.write_text((project / "job.yaml").read_text().replace(*FLAG_TYPO))
    shutil.copy(project / "mnist_tpu.py", root / "mnist_tpu.py")
    return job, tpulaunch("validate", str(job), cwd=root)


@pytest.mark.parametrize("broken, key", [
    (FLAG_TYPO, "flags.learning_rte"),
    (("shape: [28, 28, 1]", "shape: [784]"), "data.features.image.shape"),
    (("labels=labels, logits=logits)", "labels=labels, logits=logitz)"), "model.model_fn"),
])
def test_validate_and_train_refuse_a_broken_program_at_the_same_key(project, tmp_path, broken, key, request):
    """A flag typo, a wrong declared feature, a model_fn bug: validate and train both exit 1 at the key."""
    old, new = broken
    job, program = (project / "job.yaml").read_text(), (project / "mnist_tpu.py").read_text()
    assert old in job + program
    cwd, validated = tmp_path, None
    if broken == FLAG_TYPO:  # that job, validated once for this module (`flag_typo`)
        typo, validated = request.getfixturevalue("flag_typo")
        cwd = typo.parent
        assert typo.read_text() == job.replace(old, new) and (cwd / "mnist_tpu.py").read_text() == program
    else:
        (tmp_path / "job.yaml").write_text(job.replace(old, new))
        (tmp_path / "mnist_tpu.py").write_text(program.replace(old, new))
    refused_alike(cwd, key, train_args=("--model-dir", str(tmp_path / "run")), validated=validated)
    assert tf.train.latest_checkpoint(str(tmp_path / "run")) is None


def test_a_flag_typo_is_located_with_a_did_you_mean(flag_typo):
    job, proc = flag_typo
    result = validate_job(str(job))
    [problem] = [p for p in result.problems if p.is_error]
    line = job.read_text().splitlines().index("flags: {learning_rte: 0.05, use_tpu: false}") + 1
    assert (problem.code, problem.path, problem.line, problem.column) == ("flag-unknown", "flags.learning_rte", line, 9)
    assert problem.hint == "did you mean 'learning_rate'?"

    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    assert f"{job}:{line}:9: flags.learning_rte: no module of this job defines a flag 'learning_rte'" in proc.stdout


def test_a_wrongly_typed_flag_value_is_located(project, tmp_path):
    job = tmp_path / "typed.yaml"
    job.write_text((project / "job.yaml").read_text().replace("learning_rate: 0.05", "learning_rate: fast")
                   .replace("use_tpu: false}", "use_tpu: false, train_steps: 1.5, verbosity: 1}"))
    shutil.copy(project / "mnist_tpu.py", tmp_path / "mnist_tpu.py")
    found = [(p.code, p.path, p.column) for p in validate_job(str(job)).problems if p.is_error]
    assert found == [("flag-value", "flags.learning_rate", 24), ("flag-value", "flags.train_steps", 59),
                     ("flag-unknown", "flags.verbosity", 64)]
    messages = {p.path: p for p in validate_job(str(job)).problems}
    assert messages["flags.learning_rate"].message.startswith("--learning_rate is a float flag; 'fast' is not one")
    assert "absl.logging" in messages["flags.verbosity"].hint


def test_features_describe_what_the_input_fn_yields(project, tmp_path):
    """Declaring the stored bytes (uint8) for what the input_fn yields decoded (float32) is refused at its place."""
    job = tmp_path / "stored.yaml"
    job.write_text((project / "job.yaml").read_text().replace("dtype: float32", "dtype: uint8")
                   .replace("shape: [28, 28, 1]", "shape: [784]"))
    shutil.copy(project / "mnist_tpu.py", tmp_path / "mnist_tpu.py")
    found = [(p.code, p.path, p.message) for p in validate_job(str(job)).problems]
    assert found == [
        ("input-fn-shape", "data.features.image.shape",
         "the train input_fn (mnist_tpu:train_input_fn) yields 'image' with [28, 28, 1] per example (batch dim left "
         "out), but it is declared [784]"),
        ("input-fn-dtype", "data.features.image.dtype",
         "the train input_fn (mnist_tpu:train_input_fn) yields 'image' as float32, but it is declared uint8"),
    ]


def test_keys_a_model_fn_job_cannot_use_are_refused(project, tmp_path):
    job = tmp_path / "keys.yaml"
    job.write_text((project / "job.yaml").read_text()
                   .replace("  params: {data_dir:", "  loss: huber\n  precision: bfloat16\n  params: {batch_size: 8, data_dir:")
                   .replace("eval: mnist_tpu:eval_input_fn", "predict: mnist_tpu:predict_input_fn"))
    found = [(p.severity, p.code, p.path) for p in validate_job(str(job), static=True).problems]
    assert found == [("error", "model-fn-job-key", "model.loss"), ("error", "model-fn-job-key", "model.precision"),
                     ("error", "params-set-by-tensorflow", "model.params.batch_size"),
                     ("error", "input-fn-mode-missing", "data.input_fn")]


# ------------------------------------------------------------------------------------------ params

@pytest.fixture
def probe(tmp_path) -> Path:
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "job.yaml").write_text(PROBE_JOB.replace("RECORD", str(tmp_path / "params.jsonl")))
    return tmp_path


def records(root: Path) -> list:
    with open(root / "params.jsonl") as handle:
        return [json.loads(line) for line in handle]


def test_what_model_fn_and_input_fn_receive_locally(probe):
    """The README's table, locally: model.params beside batch_size (and use_tpu for model_fn); one input_fn that
    names `mode` gets each mode; export calls model_fn in infer mode without batch_size."""
    assert invoke("train", str(probe / "job.yaml")).exit_code == 0
    assert invoke("export", str(probe / "job.yaml"), str(probe / "exported")).exit_code == 0
    own = ["record_to", "scale"]
    train_input = {"who": "input_fn", "mode": "train", "keys": ["batch_size", *own], "batch_size": 8, "use_tpu": None}
    train_model = {"who": "model_fn", "mode": "train", "keys": ["batch_size", *own, "use_tpu"], "batch_size": 8,
                   "use_tpu": False}
    eval_input = {"who": "input_fn", "mode": "eval", "keys": ["batch_size", *own], "batch_size": 4, "use_tpu": None}
    eval_model = {"who": "model_fn", "mode": "eval", "keys": ["batch_size", *own, "use_tpu"], "batch_size": 4,
                  "use_tpu": False}
    assert records(probe) == [
        train_input, eval_input,  # train: validate's check of what each input_fn yields, before anything is built
        eval_input, eval_model,  # its evaluation built first and stopped, so a broken one is found before training
        train_input, train_model,  # training
        eval_input, eval_model,  # the evaluation at the end
        train_input, eval_input,  # export: the same check of the input_fns
        {"who": "model_fn", "mode": "infer", "keys": [*own, "use_tpu"], "batch_size": None, "use_tpu": False},
    ]


@pytest.fixture(scope="module")
def trained_probe(tmp_path_factory) -> Path:
    """The probe trained without evaluation (`train --set eval=null`), once for the module: the two export tests
    below each trained exactly this before exporting from it (export only reads model_dir; each writes its exports
    under its own tmp_path)."""
    root = tmp_path_factory.mktemp("trained_probe")
    (root / "probe.py").write_text(PROBE)
    (root / "job.yaml").write_text(PROBE_JOB.replace("RECORD", str(root / "params.jsonl")))
    assert invoke("train", str(root / "job.yaml"), "--set", "eval=null").exit_code == 0
    return root


def test_a_failed_export_leaves_nothing_behind(trained_probe, tmp_path):
    probe = trained_probe
    out = tmp_path / "exported"
    # A scale the model_fn cannot multiply by: only the serving graph, built by export, fails.
    broken = ["--set", "model.params.scale=twice"]
    result = CliRunner().invoke(cli, ["export", str(probe / "job.yaml"), str(out), *broken])
    assert result.exit_code == 1, result.output
    assert "error: export failed building the serving graph from data.features:" in result.output
    assert "unexpected" not in result.output and not out.exists()

    out.mkdir()
    (out / "older").mkdir()
    result = CliRunner().invoke(cli, ["export", str(probe / "job.yaml"), str(out), *broken])
    assert result.exit_code == 1 and sorted(os.listdir(out)) == ["older"]


def test_export_uses_the_programs_own_serving_input_receiver_fn(trained_probe, tmp_path):
    probe = trained_probe
    own = ["--set", "model.serving_input_fn=probe:serving_input_receiver_fn"]
    exported = invoke("export", str(probe / "job.yaml"), str(tmp_path / "exported"), *own)
    assert exported.exit_code == 0, exported.output
    path = re.search(r"^exported (\S+)$", exported.output, re.M).group(1)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    (name, signature), = serve.structured_input_signature[1].items()
    assert (name, signature.shape.as_list()) == ("half", [None, 2])
    served = serve(half=tf.ones([1, 2]))["logits"].numpy()
    assert served.shape == (1, 2)

    out = tmp_path / "broken"
    broken = invoke("export", str(probe / "job.yaml"), str(out), "--set", "model.serving_input_fn=probe:model_fn")
    assert broken.exit_code == 1 and "model.serving_input_fn:" in broken.output, broken.output
    assert "unexpected" not in broken.output and not out.exists()


FACTORY_INPUTS = ("input_fn: {train: {factory: 'probe:Inputs', args: {is_training: true}, method: input_fn}, "
                  "eval: {factory: 'probe:Inputs', args: {is_training: false}, method: input_fn}}")


def test_an_input_fn_made_by_a_factory_with_arguments(probe):
    """data.input_fn.MODE: {factory, args, method}: validate, train and explain build the object as the program does."""
    job = probe / "job.yaml"
    job.write_text(job.read_text().replace("input_fn: probe:input_fn", FACTORY_INPUTS))
    validated = tpulaunch("validate", "job.yaml", cwd=probe)
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert invoke("train", str(job)).exit_code == 0
    assert {(r["who"], r["mode"]) for r in records(probe)} == {("input_fn", "train"), ("input_fn", "eval"),
                                                                ("model_fn", "train"), ("model_fn", "eval")}
    program = invoke("explain", str(job)).output
    assert "from probe import Inputs as _user_train_input_fn_0\n" in program
    assert "user_train_input_fn = _user_train_input_fn_0(is_training=True).input_fn  # data.input_fn.train" in program
    assert "user_eval_input_fn = _user_eval_input_fn_0(is_training=False).input_fn  # data.input_fn.eval" in program

    job.write_text(job.read_text().replace("is_training: true", "is_training: true, sise: 4"))
    refused_alike(probe, "data.input_fn.train: probe:Inputs(**args) failed making the train input_fn: TypeError: "
                  "Inputs.__init__() got an unexpected keyword argument 'sise'",
                  train_args=("--model-dir", str(probe / "again")))


def test_on_a_tpu_model_fn_gets_the_job_params_beside_tensorflows(probe):
    """The README's TPU column for model_fn, from TensorFlow's own TPU graph for a v3-8 (validate --tf)."""
    job = probe / "job.yaml"
    job.write_text(job.read_text().replace("eval: {batch_size: 4", "eval: {batch_size: 16")
                   .replace("run: {model_dir: runs/probe}", "tpu: {type: v3-8, iterations_per_loop: 2}\n"
                                                            "run: {model_dir: gs://bucket/runs/probe}"))
    result = validate_job(str(job), static=True, use_tf=True)
    assert result.ok, result.problems
    assert [(r["who"], r["mode"], r["keys"], r["batch_size"], r["use_tpu"]) for r in records(probe)] == [
        ("model_fn", "train", ["batch_size", "context", "record_to", "scale", "use_tpu"], 1, True),
        ("model_fn", "eval", ["batch_size", "context", "record_to", "scale", "use_tpu"], 2, True),
    ]


def test_an_error_the_run_hits_is_one_line_unless_debug(probe):
    """An error TensorFlow raises while the steps run (here the model_fn's own assertion) says its first line:
    TensorFlow's message goes on with the graph's stack frames; --debug shows everything."""
    program = (probe / "probe.py").read_text()
    # A module of its own name: this process may have imported probe.py already.
    (probe / "probe_inf.py").write_text(program.replace(
        "    logits = tf.matmul(", "    features = tf.debugging.assert_all_finite(features / 0.0, 'no features')\n"
                                  "    logits = tf.matmul("))
    assert "assert_all_finite" in (probe / "probe_inf.py").read_text()
    job = probe / "job.yaml"
    job.write_text(job.read_text().replace("probe:", "probe_inf:"))
    result = CliRunner().invoke(cli, ["train", str(job), "--set", "eval=null"])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 1 and len(errors) == 1, result.output
    assert "no features" in errors[0] and errors[0].endswith("(rerun with --debug for the traceback)"), errors
    assert "Traceback" not in result.output and "stack trace" not in result.output.lower(), result.output


HOST_CALL = textwrap.dedent('''
    """A program whose host_call writes summaries under FLAGS.model_dir, as tensorflow/tpu's ResNet does."""
    from absl import flags
    import tensorflow as tf

    flags.DEFINE_string("model_dir", None, "Estimator model_dir")
    FLAGS = flags.FLAGS


    def input_fn(params):
        return tf.data.Dataset.from_tensors((tf.ones([4]), tf.constant(1))).repeat().batch(
            params["batch_size"], drop_remainder=True)


    def host_call_fn(gs, loss):
        with tf.compat.v2.summary.create_file_writer(FLAGS.model_dir).as_default():
            with tf.compat.v2.summary.record_if(True):
                tf.compat.v2.summary.scalar("program_loss", loss[0], step=gs[0])
                return tf.compat.v1.summary.all_v2_summary_ops()


    def model_fn(features, labels, mode, params):
        logits = tf.matmul(features, tf.compat.v1.get_variable("w", [4, 2]))
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
        step = tf.compat.v1.train.get_global_step()
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, step)
        host_call = (host_call_fn, [tf.reshape(step, [1]), tf.reshape(loss, [1])])
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op, host_call=host_call)
''')


def test_host_call_summaries_land_in_run_model_dir(tmp_path):
    """A program that writes its host_call summaries under FLAGS.model_dir gets run.model_dir there (its main()
    would have passed --model_dir), so TensorBoard on model_dir shows them."""
    (tmp_path / "summaries.py").write_text(HOST_CALL)
    (tmp_path / "job.yaml").write_text(textwrap.dedent('''
        name: summaries
        model: {model_fn: summaries:model_fn}
        data:
          input_fn: summaries:input_fn
          features: {x: {shape: [4]}}
          labels: {label: {shape: [], dtype: int32}}
        train: {batch_size: 8, steps: 3}
        run: {model_dir: runs/summaries}
    '''))
    result = tpulaunch("train", "job.yaml", cwd=tmp_path)  # its own process: absl flags are process-wide
    assert result.returncode == 0, result.stdout + result.stderr
    tags = set()
    for path in tf.io.gfile.glob(str(tmp_path / "runs" / "summaries" / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags |= {value.tag for value in event.summary.value}
    assert "program_loss" in tags, tags
