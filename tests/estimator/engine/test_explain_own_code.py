"""`tpulaunch explain` of a job in front of the user's own code: the program it prints imports the job's
model_fn and input_fns, hands them the job's params, sets the job's absl flags, and starts a builder's
run from the weights the builder loaded, as `tpulaunch train` does.

Each program runs in a fresh interpreter in which nothing of tpulaunch can be imported, on real
TFRecords, with TPUEstimator on the CPU; what it did is read back from its checkpoints and output.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from explained_programs import evaluation_of, explain, run
from own_programs import PROBE, PROBE_JOB, write_project as write_mnist_project
from weight_loading import MODEL_VARIABLES, values, write_project as write_weights_project


def line_of(job: Path, text: str) -> int:
    return next(i for i, line in enumerate(job.read_text().splitlines(), 1) if text in line)


# --------------------------------------------------------------------- an existing TPUEstimator program

@pytest.fixture(scope="module")
def mnist(tmp_path_factory) -> Path:
    """tests/programs/mnist_tpu.py beside its job file (tests/own_programs.py)."""
    return write_mnist_project(tmp_path_factory.mktemp("explain_mnist")) / "job.yaml"


def test_the_program_of_a_model_fn_job_imports_its_functions_and_sets_its_params_and_flags(mnist):
    program = explain(mnist, f"run.model_dir={mnist.parent / 'explained'}")
    lines = Path(program).read_text().splitlines()
    params = line_of(mnist, "params: {data_dir:")
    assert f"PARAMS = {{'data_dir': '{mnist.parent / 'data'}'}}" in lines
    assert any(line.startswith(f"# model.params (job.yaml:{params}): TPUEstimator's params=") for line in lines)
    assert "params=PARAMS" in Path(program).read_text()
    flags = line_of(mnist, "flags:")
    assert lines[lines.index("from absl import flags as absl_flags") + 2:][:6] == [
        f"absl_flags.FLAGS['learning_rate'].parse(0.05)  # flags.learning_rate (job.yaml:{flags})",
        f"absl_flags.FLAGS['use_tpu'].parse(False)  # flags.use_tpu (job.yaml:{flags})",
        "if 'model_dir' in absl_flags.FLAGS:  # the program's own --model_dir, as its main() would get it",
        f"    absl_flags.FLAGS['model_dir'].parse({str(mnist.parent / 'explained')!r})  # run.model_dir (--set)",
        "absl_flags.FLAGS.mark_as_parsed()",
        "absl_flags.FLAGS.validate_all_flags()",
    ]
    by_mode = line_of(mnist, "input_fn: {train:")
    assert [line for line in lines if line.startswith(("from mnist_tpu", "INPUT_FNS"))] == [
        "from mnist_tpu import model_fn as user_model_fn",
        f"from mnist_tpu import train_input_fn as user_train_input_fn  # data.input_fn.train (job.yaml:{by_mode})",
        f"from mnist_tpu import eval_input_fn as user_eval_input_fn  # data.input_fn.eval (job.yaml:{by_mode})",
        "INPUT_FNS = {'train': user_train_input_fn, 'eval': user_eval_input_fn}",
    ]
    # Nothing the program does not use: no record specs, no loss or optimizer of a builder's model_fn.
    assert not [line for line in lines if line.startswith(("FEATURES =", "TRAIN_FILES =", "LOSS =", "OPTIMIZER ="))]

    accuracy, loss, step = trained = evaluation_of(run(program))
    assert (step, accuracy >= 0.9) == (120, True), trained
    assert tf.train.latest_checkpoint(str(mnist.parent / "explained")).endswith("model.ckpt-120")
    # `evaluate` reads the eval input_fn in order: the checkpoint's metrics again, exactly.
    assert evaluation_of(run(program, "evaluate")) == trained


def test_the_jobs_flags_reach_the_program(mnist, tmp_path):
    """learning_rate 0 set with --set: one step of the program leaves every kernel where it started."""
    program = explain(mnist, "flags.learning_rate=0.0", "train.steps=1", "eval=null", f"run.model_dir={tmp_path}")
    assert "absl_flags.FLAGS['learning_rate'].parse(0.0)  # flags.learning_rate (--set)" in Path(program).read_text()
    run(program)
    start, after = values(tmp_path, 0), values(tmp_path, 1)
    kernels = [name for name in start if name.endswith("kernel")]
    assert len(kernels) == 4
    for name in kernels:
        np.testing.assert_array_equal(start[name], after[name], err_msg=name)


def test_one_input_fn_that_names_mode_gets_each_mode_and_the_params(tmp_path):
    """The probe of tests/own_programs.py, run by the explained program: what model_fn and the one input_fn
    receive is what they receive under `tpulaunch train` (test_own_program.py's records, less export's)."""
    (tmp_path / "probe.py").write_text(PROBE)
    job = tmp_path / "job.yaml"
    job.write_text(PROBE_JOB.replace("RECORD", str(tmp_path / "params.jsonl")))
    program = explain(job)
    assert "INPUT_FNS = {'train': user_input_fn, 'eval': user_input_fn, 'predict': user_input_fn}" in \
        Path(program).read_text().splitlines()
    run(program)
    own = ["record_to", "scale"]
    with open(tmp_path / "params.jsonl") as handle:
        assert [json.loads(line) for line in handle] == [
            {"who": "input_fn", "mode": "train", "keys": ["batch_size", *own], "batch_size": 8, "use_tpu": None},
            {"who": "model_fn", "mode": "train", "keys": ["batch_size", *own, "use_tpu"], "batch_size": 8,
             "use_tpu": False},
            {"who": "input_fn", "mode": "eval", "keys": ["batch_size", *own], "batch_size": 4, "use_tpu": None},
            {"who": "model_fn", "mode": "eval", "keys": ["batch_size", *own, "use_tpu"], "batch_size": 4,
             "use_tpu": False},
        ]


# ---------------------------------------------------------------------------------- builder weights

@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """The builder of tests/weight_loading.py, loading kernels-0.0123.h5 (every weight 0.0123), and its records."""
    return write_weights_project(tmp_path_factory.mktemp("explain_weights")) / "job.yaml"


def test_the_program_starts_from_the_weights_the_builder_loaded(weights):
    model_dir = weights.parent / "explained"
    program = explain(weights, f"run.model_dir={model_dir}")
    assert re.search(r"^BUILDER_KWARGS = \{.*'weights': '.*kernels-0\.0123\.h5'", Path(program).read_text(), re.M)
    run(program)
    start = values(model_dir, 0)
    assert sorted(start) == MODEL_VARIABLES
    for name, value in start.items():
        np.testing.assert_array_equal(value, np.full(value.shape, 0.0123, np.float32), err_msg=name)


def test_the_program_warm_starts_the_selected_variables_and_takes_the_rest_from_the_builder(weights, tmp_path):
    first = weights.parent / "explained-first"
    run(explain(weights, f"run.model_dir={first}"))
    warm = tmp_path / "warm"
    program = explain(weights, f"run.model_dir={warm}", f"model.params.weights={weights.parent / 'kernels-0.5.h5'}",
                      f"run.warm_start={{from: {first}, vars: conv2d/}}")
    text = Path(program).read_text()
    assert f"WARM_START_FROM = '{first}'" in text and "# run.warm_start.from (--set)" in text  # long: comment above
    assert "warm_start_from=WARM_START_FROM, warm_start_vars=WARM_START_VARS" in re.sub(r"\s+", " ", text)
    run(program)
    for name, value in values(warm, 0).items():
        expected = 0.0123 if name.startswith("conv2d/") else 0.5
        np.testing.assert_array_equal(value, np.full(value.shape, expected, np.float32), err_msg=name)
