"""`tpulaunch explain`: the standalone TPUEstimator script holds the engine's own code, compiles, trains on CPU,
evaluates a checkpoint to the same metrics as `tpulaunch evaluate`, and matches the job's TPUConfig."""

from __future__ import annotations

import inspect
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

from explained_programs import evaluation_of
from paths import REPO
from programs_run import RUN_WITHOUT_TPULAUNCH
from tpulaunch.engine.estimator import runner, standalone
from tpulaunch.engine.estimator.make import make_estimator
from tpulaunch.cli.app import cli
from tpulaunch.engine.estimator.program import explain_script
from tpulaunch.job.load import load_job
from tpulaunch.cli.render.run_text import format_value
from tpulaunch.plan.build import build_plan

ROOT = str(REPO)

TINY_MODELS = textwrap.dedent('''
    import tensorflow as tf

    def build(input_shape, num_classes=2):
        image = tf.keras.Input(shape=tuple(input_shape), name="image")
        x = tf.keras.layers.Conv2D(4, 3, padding="same")(image)  # no ReLU: 4 dead filters would stall training
        x = tf.keras.layers.BatchNormalization()(x)
        x = tf.keras.layers.GlobalAveragePooling2D()(x)
        return tf.keras.Model(image, tf.keras.layers.Dense(num_classes)(x))
''')

LOCAL_JOB = textwrap.dedent("""\
    name: tiny
    model:
      builder: tiny_models:build
      params: {num_classes: 2}
      optimizer: {name: sgd, learning_rate: 0.1}
      metrics: [accuracy]
    data:
      train: data/train-*.tfrecord
      eval: data/eval-*.tfrecord
      features:
        image: {shape: [8, 8, 1]}
      labels:
        label: {shape: [], dtype: int64}
    train: {batch_size: 4, steps: 30}
    eval: {batch_size: 4, steps: 1}
    run: {model_dir: run, save_checkpoints_steps: 30, log_every_steps: 10, seed: 1}
    """)


def _write_records(path, count):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(count):
            feature = {
                "image": tf.train.Feature(float_list=tf.train.FloatList(value=[float(i % 2)] * 64)),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def _explain(job_path, *extra):
    result = CliRunner().invoke(cli, ["explain", str(job_path), *extra])
    assert result.exit_code == 0, result.output
    return result


def test_local_script_compiles_and_trains_like_tpulaunch_train(tmp_path):
    (tmp_path / "tiny_models.py").write_text(TINY_MODELS)
    (tmp_path / "data").mkdir()
    _write_records(tmp_path / "data" / "train-0.tfrecord", 16)
    _write_records(tmp_path / "data" / "eval-0.tfrecord", 8)
    job_path = tmp_path / "job.yaml"
    job_path.write_text(LOCAL_JOB)
    script_path = tmp_path / "run_tiny.py"
    _explain(job_path, "-o", str(script_path))
    source = script_path.read_text()
    compile(source, str(script_path), "exec")
    assert "tpulaunch" not in re.sub(r"#.*|\"\"\"[\s\S]*?\"\"\"", "", source)  # only in comments/docstring
    assert "USE_TPU = False" in source and "TRAIN_BATCH_SIZE = 4  # train.batch_size (job.yaml:14)" in source

    # Run from elsewhere, with nothing of tpulaunch on the path: the script stands alone.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    child = subprocess.run([sys.executable, "-I", str(script_path)], cwd="/", env=env,
                           capture_output=True, text=True, timeout=300, check=False)
    assert child.returncode == 0, child.stderr[-3000:]
    model_dir = tmp_path / "run"
    assert int(tf.train.load_variable(tf.train.latest_checkpoint(str(model_dir)), "global_step")) == 30
    accuracy, loss, step = evaluation_of(child.stdout)
    # Both runs learn the separable toy task: well under chance loss (ln 2 = 0.69).
    # Their shuffles are seeded from different graphs, so the two losses differ by a little.
    assert (step, 0.0 <= accuracy <= 1.0, loss < 0.55) == (30, True, True), (accuracy, loss)

    # `tpulaunch train` on the same job and data: the same final step, trained as well.
    loaded = load_job(str(job_path), [f"run.model_dir={tmp_path / 'tpulaunch-run'}"])
    summary = runner.train(loaded.job, build_plan(loaded.job, local=True), search_path=[str(tmp_path)])
    (evaluation,) = summary.evals
    assert (summary.final_step, evaluation.step) == (30, 30)
    assert evaluation.metrics["loss"] < 0.55, evaluation.metrics


def test_program_holds_the_engines_standalone_modules_verbatim():
    from tpulaunch.engine import portable

    quickstart = load_job(os.path.join(ROOT, "configs", "quickstart.yaml"))
    program = explain_script(quickstart, build_plan(quickstart.job))
    assert inspect.getsource(portable) in program
    # standalone.py whole, but for the one statement importing portable's names (defined above it in the program)
    own = inspect.getsource(standalone)
    start = own.index("from tpulaunch.engine.portable import (")
    end = own.index(")\n", start) + 2
    assert own[:start] in program and own[end:] in program
    assert "from tpulaunch" not in program.split("# " + "=" * 98)[2]


def _write_noisy_records(path, count, label, seed):
    """Records of one label whose images are noise barely shifted by it: a briefly trained model errs on some."""
    rng = np.random.default_rng(seed)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for _ in range(count):
            image = rng.normal(size=64) + (0.05 if label else -0.05)
            feature = {
                "image": tf.train.Feature(float_list=tf.train.FloatList(value=image.tolist())),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def test_program_evaluates_a_checkpoint_to_the_metrics_of_tpulaunch_evaluate(tmp_path):
    """`tpulaunch train`, then `tpulaunch evaluate` and the explained program in evaluate mode on the same
    checkpoint: the same metrics. Two eval files, one per label, read part-way (3 batches of 4 out of 24
    records) make the result depend on the order the pipeline interleaves them in; the noise makes the
    model err on some (seen over runs: accuracy 0.42-0.83)."""
    (tmp_path / "tiny_models.py").write_text(TINY_MODELS)
    (tmp_path / "data").mkdir()
    _write_records(tmp_path / "data" / "train-0.tfrecord", 16)
    _write_noisy_records(tmp_path / "data" / "eval-0.tfrecord", 12, label=0, seed=1)
    _write_noisy_records(tmp_path / "data" / "eval-1.tfrecord", 12, label=1, seed=2)
    job_path = tmp_path / "job.yaml"
    job_path.write_text(LOCAL_JOB)
    sets = ["--set", "train.steps=5", "--set", "eval.steps=3", "--set", "run.save_checkpoints_steps=5"]

    trained = CliRunner().invoke(cli, ["train", str(job_path), "--local", *sets])
    assert trained.exit_code == 0, trained.output
    evaluated = CliRunner().invoke(cli, ["evaluate", str(job_path), "--local", *sets])
    assert evaluated.exit_code == 0, evaluated.output
    script_path = tmp_path / "run_tiny.py"
    _explain(job_path, "-o", str(script_path), *sets)
    (tmp_path / "run_without_tpulaunch.py").write_text(RUN_WITHOUT_TPULAUNCH)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "TF_CPP_MIN_LOG_LEVEL": "2"}
    child = subprocess.run([sys.executable, "-I", str(tmp_path / "run_without_tpulaunch.py"), str(script_path),
                            "evaluate"], cwd="/", env=env, capture_output=True, text=True, timeout=300, check=False)
    assert child.returncode == 0, child.stderr[-3000:]
    accuracy, loss, step = evaluation_of(child.stdout)

    # What `tpulaunch evaluate` printed, to its 4 significant digits...
    shown = f"eval | step {step} | accuracy {format_value(accuracy)} | loss {format_value(loss)}"
    assert (step, shown) == (5, evaluated.output.strip().splitlines()[-1])
    # ...and the numbers behind it.
    loaded = load_job(str(job_path), [s for s in sets if s != "--set"])
    result = runner.evaluate(loaded.job, build_plan(loaded.job, local=True), search_path=[str(tmp_path)])
    assert result.metrics == {"accuracy": pytest.approx(accuracy, abs=1e-5), "loss": pytest.approx(loss, abs=1e-5)}


def test_quickstart_script_trains_like_tpulaunch_train(tmp_path):
    """The README's quickstart job, explained: the script (its CNN inlined) trains to the same step as
    `tpulaunch train` on the same synthetic data, and both learn to a similar loss."""
    (tmp_path / "configs").mkdir()
    shutil.copy(os.path.join(ROOT, "configs", "quickstart.yaml"), tmp_path / "configs")
    job_path = tmp_path / "configs" / "quickstart.yaml"
    synth = CliRunner().invoke(cli, ["data", "synth", "--example", "quickstart", str(tmp_path / "data" / "quickstart"),
                                     "--records", "512"])
    assert synth.exit_code == 0, synth.output
    overrides = ["train.steps=60", "eval.steps=2", "run.save_checkpoints_steps=60", "run.seed=7"]
    script_path = tmp_path / "run_quickstart.py"
    _explain(job_path, "-o", str(script_path), *(f"--set={o}" for o in overrides))
    child = subprocess.run([sys.executable, "-I", str(script_path)], cwd="/", capture_output=True, text=True,
                           env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ""}, timeout=300, check=False)
    assert child.returncode == 0, child.stderr[-3000:]
    accuracy, loss, step = evaluation_of(child.stdout)

    loaded = load_job(str(job_path), [*overrides, f"run.model_dir={tmp_path / 'tpulaunch-run'}"])
    summary = runner.train(loaded.job, build_plan(loaded.job, local=True), search_path=[str(tmp_path / "configs")])
    (evaluation,) = summary.evals
    chance = math.log(10)  # ten classes
    assert (step, evaluation.step) == (60, 60)
    # Seen over runs: 0.09-0.40 for either, at most 0.17 apart; chance is 2.30.
    assert loss < 0.4 * chance and evaluation.metrics["loss"] < 0.4 * chance, (loss, evaluation.metrics)
    assert abs(loss - evaluation.metrics["loss"]) < 0.3 * chance, (loss, evaluation.metrics)
    assert 0.0 <= accuracy <= 1.0


def test_tpu_script_has_the_jobs_exact_tpu_config():
    job_file = os.path.join(ROOT, "configs", "unet3d_ct.yaml")
    loaded = load_job(job_file)
    source = explain_script(loaded, build_plan(loaded.job))
    namespace = {"__name__": "explained"}
    exec(compile(source, "explained.py", "exec"), namespace)  # defines everything; main() does not run
    # A direct grpc:// address: the resolver asks no API, and nothing is contacted while building.
    namespace["TPU_NAME"] = "grpc://10.240.1.2:8470"
    estimator = namespace["make_estimator"]()
    from tensorflow.python.distribute.cluster_resolver import TPUClusterResolver

    # What `tpulaunch train` builds for the same TPU (a resolver also changes RunConfig's defaults).
    theirs = make_estimator(loaded.job, build_plan(loaded.job),
                                   cluster_resolver=TPUClusterResolver(tpu="grpc://10.240.1.2:8470"))
    expected, config = theirs.config, estimator.config
    assert config.tpu_config == expected.tpu_config
    assert config.tpu_config.input_partition_dims == [[1, 4, 2, 2, 1], [1, 4, 2, 2]]
    assert config.tpu_config.num_cores_per_replica == 16
    fields = ("model_dir", "save_checkpoints_steps", "keep_checkpoint_max", "tf_random_seed",
              "log_step_count_steps", "save_summary_steps")
    assert {f: getattr(config, f) for f in fields} == {f: getattr(expected, f) for f in fields}
    assert config.master == "grpc://10.240.1.2:8470"
    batches = [(e._ctx._train_batch_size, e._ctx._eval_batch_size, e._ctx._eval_on_tpu)  # pylint: disable=protected-access
               for e in (estimator, theirs)]
    assert batches == [(2, 2, True), (2, 2, True)]


def test_script_comments_name_the_job_keys():
    loaded = load_job(os.path.join(ROOT, "configs", "unet3d_ct.yaml"))
    lines = explain_script(loaded, build_plan(loaded.job)).splitlines()
    assert "NUM_CORES_PER_REPLICA = 16  # tpu.cores_per_replica (unet3d_ct.yaml:24)" in lines
    assert "ITERATIONS_PER_LOOP = 100  # tpu.iterations_per_loop (unet3d_ct.yaml:25)" in lines
    assert "INPUT_PARTITION_DIMS = [[1, 4, 2, 2, 1], [1, 4, 2, 2]]" in lines
    # The reference model's source is copied in: the script needs no tpulaunch install.
    assert "build_model = _unet3d.build" in lines
    assert not [line for line in lines if line.startswith(("import tpulaunch", "from tpulaunch"))]


ESCAPE_HATCH_JOB = textwrap.dedent("""\
    name: own-code
    model:
      model_fn: my_code:model_fn
    data:
      input_fn: my_code:input_fn
      features: {ids: {shape: [12], dtype: int32}, mask: {shape: [12], dtype: bool}}
      labels: {a: {shape: [], dtype: int64}, b: {shape: [3]}}
    tpu: {type: v3-32, cores_per_replica: 2, iterations_per_loop: 50}
    partition:
      features: {ids: [1, 2]}
    train: {batch_size: 32, steps: 100}
    run: {model_dir: gs://bucket/run}
    """)


def test_every_example_and_an_escape_hatch_job_compile(tmp_path):
    job_path = tmp_path / "own.yaml"
    job_path.write_text(ESCAPE_HATCH_JOB)
    paths = [os.path.join(ROOT, "configs", name) for name in sorted(os.listdir(os.path.join(ROOT, "configs")))
             if name.endswith(".yaml")] + [str(job_path)]
    for path in paths:
        compile(_explain(path).output, path, "exec")
    lines = _explain(job_path).output.splitlines()
    assert "from my_code import model_fn as user_model_fn" in lines
    assert "from my_code import input_fn as user_input_fn" in lines
    assert "TPU_NAME = os.environ.get('TPU_NAME')  # tpu.name (default: $TPU_NAME)" in lines
    assert "INPUT_PARTITION_DIMS = [{'ids': [1, 2], 'mask': None}, {'a': None, 'b': None}]" in lines
