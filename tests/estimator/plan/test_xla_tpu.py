"""XLA's own answer: the job's step compiled for its TPU type by XLA's TPU compiler (jax + libtpu in the side
environment, made by the `xla` session from requirements/xla.txt: the `compiler` fixture), on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from paths import REPO, SUITE_XLA_PYTHON
from tpulaunch.plan import xla_home
from xla_plans import cnn_job, compile_children, counting_compiler, plan_json

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first


def test_plan_reports_xlas_per_core_figures_and_says_xla_answered(planned_twice):
    (memory, _, children), _ = planned_twice  # the first plan: a cache of its own, so XLA compiled it
    assert children >= 1
    xla = memory["xla_tpu"]
    assert memory["answered_by"] == "xla" and xla["answered"] == "xla"
    assert xla["topology"] == "v3:2x2" and xla["per_replica_batch"] == 8 and xla["fits"]
    assert xla["usable_bytes"] == int(15.48 * 1024 ** 3)
    # Weights and Adam's two slots are donated into the step's outputs: charged once, not twice.
    assert xla["aliased"] > 3 * 94538 * 4
    assert xla["buffers_total"] == (xla["arguments"] + xla["outputs"] - xla["aliased"] + xla["temporaries"]
                                    + xla["generated_code"])
    assert 0 < xla["per_core_bytes"] <= xla["buffers_total"]  # XLA's peak: not every buffer is live at once
    assert memory["verdict"] == "fits" and memory["estimate_verdict"] == "fits"


def test_a_2x2_spatial_split_lowers_per_core_temporaries(tmp_path, compiler):
    from tpulaunch.job.load import load_job
    from tpulaunch.plan.build import build_plan
    from tpulaunch.plan.xla_tpu import compile_step

    whole = load_job(cnn_job(tmp_path, image=64, batch=64)).job
    split = load_job(cnn_job(tmp_path, image=64, batch=16, extra="partition: {features: {image: [1, 2, 2, 1]}}\n"),
                     ["tpu.cores_per_replica=4"]).job
    unsplit = compile_step(whole, build_plan(whole), 8)
    tiled = compile_step(split, build_plan(split), 8)
    assert tiled["partitions"] == 4 and tiled["dims"] == [1, 2, 2, 1]
    assert tiled["temporaries"] < 0.6 * unsplit["temporaries"]


def test_validate_refuses_what_xla_says_does_not_fit_with_its_words_and_the_nearest_batch(tmp_path, compiler):
    from tpulaunch.checks.xla_fit import xla_fit_problems
    from tpulaunch.job.load import load_job
    from tpulaunch.plan.build import build_plan

    loaded = load_job(cnn_job(tmp_path, image=512, batch=2048, tpu_type="v5litepod-8"))  # 256 per v5e chip
    problems = xla_fit_problems(loaded, build_plan(loaded.job))
    assert [p.code for p in problems] == ["xla-does-not-fit"]
    problem = problems[0]
    assert problem.path == "train.batch_size" and problem.line == 14
    assert "RESOURCE_EXHAUSTED: Ran out of memory on HBM" in problem.message and "(15.75G)" in problem.message
    assert "examples per replica fit (train.batch_size:" in problem.hint


def test_without_the_compiler_plan_answers_with_the_estimate_and_says_how_to_get_xlas(tmp_path):
    env = dict(os.environ, **{xla_home.ENV_VAR: str(tmp_path / "no-such-python")})
    memory = plan_json(cnn_job(tmp_path), env)
    assert memory["answered_by"] == "estimate" and memory["verdict"] == "fits"
    assert memory["xla_tpu"]["answered"] == "estimate" and "is not a file" in memory["xla_tpu"]["reason"]
    assert "requirements" not in memory["xla_tpu"]["hint"] and "libtpu==0.0.42.1" in memory["xla_tpu"]["hint"]


def test_a_topology_libtpu_does_not_know_is_one_located_message(compiler):
    done = subprocess.run([compiler, "-I", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r}); "
                           "from tpulaunch.plan.xla_compile import topology_devices; topology_devices('v9:2x2')"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "ValueError: libtpu does not know the topology 'v9:2x2'" in done.stderr


def test_the_pins_it_names_are_the_requirements_files():
    pinned = [line.strip() for line in (REPO / "requirements" / "xla.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert tuple(pinned) == xla_home.PINS


def test_a_model_fn_job_falls_back_to_the_estimate_and_says_why(compiler):
    from tpulaunch.job.schema import Job
    from tpulaunch.plan.build import build_plan
    from tpulaunch.plan.xla_tpu import ask_xla

    job = Job.model_validate({
        "name": "own", "model": {"model_fn": "model_fns:momentum"},
        "data": {"features": {"image": {"shape": [32, 32, 3]}}, "labels": {"label": {"shape": [], "dtype": "int64"}}},
        "tpu": {"type": "v3-8"}, "train": {"batch_size": 64, "steps": 10}, "run": {"model_dir": "gs://bucket/run"}})
    answer = ask_xla(job, build_plan(job))
    assert answer["answered"] == "estimate" and "model.model_fn" in answer["reason"]
    assert "TPU rewrite" in answer["reason"] and "hint" not in answer  # the compiler is there: no install line


def test_a_step_xla_cannot_be_given_is_a_located_warning_and_the_estimate_answers(tmp_path, compiler):
    from tpulaunch.checks.xla_fit import xla_fit_problems
    from tpulaunch.job.load import load_job
    from tpulaunch.plan.build import build_plan

    (tmp_path / "upsampling.py").write_text(textwrap.dedent("""\
        import tensorflow as tf


        def build(input_shape=(16, 16, 3)):  # nearest-neighbour upsampling: its gradient has no XLA CPU kernel
            inputs = tf.keras.Input(shape=tuple(input_shape))
            x = tf.keras.layers.Conv2D(4, 3, padding="same")(inputs)
            x = tf.keras.layers.UpSampling2D(2)(x)
            return tf.keras.Model(inputs, tf.keras.layers.Dense(10)(tf.keras.layers.GlobalAveragePooling2D()(x)))
        """))
    job_file = cnn_job(tmp_path, image=16, batch=16)
    with open(job_file) as f:
        text = f.read().replace("tpulaunch.models.cnn:build", "upsampling:build").replace("params: {num_classes: 10}",
                                                                                           "params: {}")
    with open(job_file, "w") as f:
        f.write(text)
    loaded = load_job(job_file)
    problems = xla_fit_problems(loaded, build_plan(loaded.job))
    assert [(p.code, p.path, p.severity) for p in problems] == [("xla-no-answer", "model.builder", "warning")]
    assert "ResizeNearestNeighborGrad" in problems[0].message


@pytest.fixture(scope="module")
def planned_twice(tmp_path_factory):
    """`plan` of one job twice, with a cache of its own: (first, second), each (memory section, stderr, compile
    children that ran)."""
    if not os.path.isfile(SUITE_XLA_PYTHON):
        pytest.fail(f"XLA's TPU compiler is not installed at {SUITE_XLA_PYTHON}: make it with `nox -s xla`")
    tmp_path = tmp_path_factory.mktemp("planned-twice")
    python, log = counting_compiler(tmp_path, SUITE_XLA_PYTHON)
    env = dict(os.environ, **{xla_home.ENV_VAR: python, xla_home.CACHE_ENV_VAR: str(tmp_path / "cache")})
    job = cnn_job(tmp_path, batch=64)  # 8 examples per v3 core: fits, with room for more
    runs = []
    for _ in range(2):
        before = compile_children(log)
        done = subprocess.run([sys.executable, "-m", "tpulaunch", "plan", job, "--format", "json"],
                              capture_output=True, text=True, cwd=str(REPO), env=env, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append((json.loads(done.stdout)["memory"], done.stderr, compile_children(log) - before))
    return runs


def test_the_verdict_and_the_estimate_are_held_to_xlas_own_usable_line(planned_twice):
    (memory, said, _), _ = planned_twice
    xla = memory["xla_tpu"]
    # One line: XLA's own limit for the topology (its out-of-memory message's "available HBM"), shown as the
    # section's usable HBM and the one the verdict is held to.
    assert memory["usable_bytes"] == xla["usable_bytes"] == int(15.48 * 1024 ** 3)
    assert memory["verdict"] == "fits" and xla["per_core_bytes"] <= xla["usable_bytes"]
    for compiled in xla["nearest"]["compiled"]:  # no batch is called fitting above the line
        assert compiled["fits"] == (compiled["bytes"] <= xla["usable_bytes"]), compiled


def test_the_recommended_batch_is_the_largest_one_xla_compiled_that_fits(planned_twice):
    (memory, said, children), _ = planned_twice
    compiled = memory["xla_tpu"]["nearest"]["compiled"]
    recommended = memory["recommendation"]
    assert recommended["source"] == "xla" and recommended["action"] == "batch"
    fitting = [c["per_replica_batch"] for c in compiled if c["fits"]]
    assert recommended["per_replica_batch"] == max(fitting) and recommended["global_batch"] == 8 * max(fitting)
    # Each batch named was compiled, each compile said while it ran.
    assert children == len(compiled) == said.count("plan: XLA's TPU compiler: compiling the step at"), said
    assert memory["estimate_recommendation"]["per_replica_batch"] in [c["per_replica_batch"] for c in compiled]


def test_a_second_plan_of_the_same_job_answers_from_the_cache_without_compiling(planned_twice):
    (first, _, compiled_first), (second, said, compiled_second) = planned_twice
    assert compiled_first >= 1 and compiled_second == 0, (compiled_first, compiled_second)
    assert "compiling" not in said and said.count("the answer cached in") == compiled_first, said
    assert "/cache/xla/" in second["xla_tpu"]["cached"]  # under TPULAUNCH_CACHE, not the repository
    for key in ("verdict", "usable_bytes", "recommendation"):
        assert second[key] == first[key], key
