"""`tpulaunch explain` on the keras engine: the Keras + tf.distribute program holds portable.py and the keras
engine's standalone.py verbatim, runs with nothing of tpulaunch importable, trains a job to its steps with its
evaluations, and evaluates a checkpoint to the metrics of `tpulaunch evaluate`; `--engine keras` prints a
TPUEstimator job's migration, refuses TPUEstimator's own functions, and writes the program without TensorFlow."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import user_models as corpus
from explained_programs import explain_keras, keras_evaluations, run_keras_program
from paths import REPO
from tpulaunch.cli.app import cli
from tpulaunch.engine.keras import runner
from tpulaunch.engine.core.model_dir import checkpoint_step
from tpulaunch.engine.keras.program import explain_script
from tpulaunch.job.load import load_job
from tpulaunch.plan.build import build_plan
from tpulaunch.cli.render.run_text import format_value



# The job's own code beside its file: a metric the program imports from the job's directory.
OWN_METRIC = textwrap.dedent('''
    import tensorflow as tf

    def mean_label(labels, outputs):
        return tf.reduce_mean(tf.cast(labels, tf.float32))
''')


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The reference CNN (4 filters) on 8x8 images, 3 classes; two eval files read part-way, so the result depends
    on the order the pipeline reads them in. No run.engine: --engine keras picks the program."""
    root = tmp_path_factory.mktemp("keras_explain")
    specs = {**corpus.IMAGE, **corpus.CLASS}
    corpus.write_records(root / "train.tfrecord", specs, 32, seed=1)
    corpus.write_records(root / "eval-0.tfrecord", specs, 12, seed=2)
    corpus.write_records(root / "eval-1.tfrecord", specs, 12, seed=3)
    (root / "own_metrics.py").write_text(OWN_METRIC)
    job = {
        "name": "keras-explain",
        "model": {"builder": "tpulaunch.models.cnn:build", "params": {"num_classes": 3, "filters": 4},
                  "loss": "sparse_categorical_crossentropy", "optimizer": {"name": "sgd", "learning_rate": 0.05},
                  "metrics": ["accuracy", "own_metrics:mean_label"]},
        "data": {"train": "train.tfrecord", "eval": "eval-*.tfrecord", "features": corpus.IMAGE,
                 "labels": corpus.CLASS},
        "train": {"batch_size": 4, "steps": 6},
        "eval": {"batch_size": 4, "steps": 5, "every_steps": 3},
        "run": {"model_dir": "runs/k", "save_checkpoints_steps": 3, "log_every_steps": 2, "seed": 3},
    }
    (root / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return root


def test_program_holds_portable_and_the_keras_standalone_verbatim():
    from tpulaunch.engine import portable
    from tpulaunch.engine.keras import standalone

    loaded = load_job(str(REPO / "configs" / "unet3d_ct.yaml"), ["run.engine=keras"])
    program = explain_script(loaded, build_plan(loaded.job))
    compile(program, "program.py", "exec")
    assert inspect.getsource(portable) in program
    own = inspect.getsource(standalone)  # whole, but for its import of portable's names (defined above it)
    start = own.index("from tpulaunch.engine.portable import (")
    end = own.index(")\n", start) + 2
    assert own[:start] in program and own[end:] in program
    code = re.sub(r"#.*|\"\"\"[\s\S]*?\"\"\"", "", program.split(own[end:])[1])  # the tail, without comments
    assert "tpulaunch" not in code
    # tf.keras is tf-keras: set before anything imports TensorFlow (the job's code and the copied model included).
    lines = program.splitlines()
    setting = lines.index('os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")')
    assert setting < min(i for i, line in enumerate(lines) if "import tensorflow" in line or line.startswith("exec("))
    # The TPU's values: the strategy's device assignment and the splits, each at its job key.
    assert "COMPUTATION_SHAPE = [4, 2, 1, 2]" in lines and "FEATURE_DIMS = {'image': [1, 4, 2, 2, 1]}" in lines
    assert "NUM_REPLICAS = 2  # tpu.type (unet3d_ct.yaml:23): the slice's cores over tpu.cores_per_replica" in lines
    assert "STEPS_PER_CALL = 100  # tpu.iterations_per_loop (unet3d_ct.yaml:25): steps per compiled call on the " \
           "TPU" in lines
    assert "build_model = _unet3d.build" in lines
    # TensorFlow's own DeviceAssignment takes them on the slice's topology (fabricated: no TPU here).
    import tensorflow as tf

    from tpulaunch.engine.keras.tpu_setup import topology_for
    from tpulaunch.tpu.types import lookup

    namespace = {"__name__": "explained"}
    exec(compile(program, "program.py", "exec"), namespace)  # defines everything; main() does not run
    assignment = tf.tpu.experimental.DeviceAssignment.build(
        topology_for(lookup(namespace["TPU_TYPE"])), computation_shape=namespace["COMPUTATION_SHAPE"],
        num_replicas=namespace["NUM_REPLICAS"])
    assert (assignment.num_replicas, assignment.num_cores_per_replica) == (2, 16)


@pytest.fixture(scope="module")
def trained(project, tmp_path_factory):
    """The program of the job, written with `--engine keras` and run to train.steps: (program, its stdout, MODEL_DIR)."""
    where = tmp_path_factory.mktemp("program")
    program = where / "program.py"
    explain_keras(project / "job.yaml", "-o", str(program), "--set", f"run.model_dir={where / 'run'}")
    return program, run_keras_program(program), where / "run"


def test_program_trains_to_the_jobs_steps_with_its_evaluations(trained):
    program, stdout, model_dir = trained
    text = program.read_text()
    assert "from own_metrics import mean_label as custom_metric_0  # model.metrics.1 (job.yaml:13)" in text
    assert "BUILDER_KWARGS = {'num_classes': 3, 'filters': 4, 'input_shape': (8, 8, 1)}" in text
    progress = [line for line in stdout.splitlines() if line.startswith("step ")]
    assert [line.split(" |")[0] for line in progress] == ["step 2/6", "step 4/6", "step 6/6"]
    assert [e["global_step"] for e in keras_evaluations(stdout)] == [3, 6]  # eval.every_steps 3
    assert sorted(p.name for p in model_dir.glob("model.ckpt-*.index")) == ["model.ckpt-3.index", "model.ckpt-6.index"]
    assert checkpoint_step(str(model_dir)) == 6


def test_program_evaluates_a_checkpoint_to_the_metrics_of_tpulaunch_evaluate(project, trained):
    """`tpulaunch evaluate` (the keras engine) and the program in evaluate mode on the checkpoint the program
    trained: the same metrics (5 batches of 4 out of 24 records in two files)."""
    program, _, model_dir = trained
    job = project / "job.yaml"
    sets = ["--set", "run.engine=keras", "--set", f"run.model_dir={model_dir}"]
    evaluated = CliRunner().invoke(cli, ["evaluate", str(job), *sets])
    assert evaluated.exit_code == 0, evaluated.output
    (results,) = keras_evaluations(run_keras_program(program, "evaluate"))

    # What `tpulaunch evaluate` printed, to its 4 significant digits...
    shown = "eval | step {global_step} | accuracy {accuracy} | mean_label {mean_label} | loss {loss}".format(
        **{k: format_value(v) if k != "global_step" else v for k, v in results.items()})
    assert (results["global_step"], shown) == (6, evaluated.output.strip().splitlines()[-1])
    # ...and the numbers behind it.
    loaded = load_job(str(job), [s for s in sets if s != "--set"])
    theirs = runner.evaluate(loaded.job, build_plan(loaded.job), search_path=loaded.job.search_path)
    assert theirs.metrics == {k: pytest.approx(v, abs=1e-5) for k, v in results.items() if k != "global_step"}


def test_engine_keras_refuses_a_model_fn_job_naming_its_key_and_the_fix(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(textwrap.dedent("""\
        name: own-model-fn
        model:
          model_fn: my_code:model_fn
        data:
          train: train.tfrecord
          features: {image: {shape: [8, 8, 1]}}
          labels: {label: {shape: [], dtype: int64}}
        train: {batch_size: 4, steps: 2}
        run: {model_dir: run}
        """))
    result = CliRunner().invoke(cli, ["explain", str(job), "--engine", "keras"])
    assert result.exit_code == 1, result.output
    assert "job.yaml:3:13: model.model_fn:" in result.output
    assert "hint: explain it with --engine estimator" in result.output
    assert f"error: no keras program for {job}: model.model_fn is the estimator engine's own" in result.output
    # The TPUEstimator program of the same job is still there, under this TensorFlow too: it is only text.
    estimator = CliRunner().invoke(cli, ["explain", str(job), "--engine", "estimator"])
    assert estimator.exit_code == 0, estimator.output
    assert "The TPUEstimator program of job 'own-model-fn'" in estimator.output
    assert "from my_code import model_fn as user_model_fn" in estimator.output.splitlines()


PROBE = """
import sys
from tpulaunch.cli.app import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code or 0
print("LOADED=" + ",".join(m for m in ("tensorflow", "tf_keras", "keras") if m in sys.modules))
sys.exit(code)
"""


@pytest.mark.parametrize("engine", ["keras", "estimator"])
def test_the_program_is_written_without_tensorflow(project, engine):
    """The job names a reference model and a metric of its own, both of which import TensorFlow: their
    signatures are read from their source."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", PROBE, "explain", str(project / "job.yaml"), "--engine", engine],
                          capture_output=True, text=True, cwd=str(REPO), env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    *program, loaded = proc.stdout.splitlines()
    assert loaded == "LOADED="
    assert "BUILDER_KWARGS = {'num_classes': 3, 'filters': 4, 'input_shape': (8, 8, 1)}" in program
