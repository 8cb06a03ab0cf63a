"""Will it fit, on the jax engine: plan's estimate from the engine's own step (the residuals JAX saves for the
backward pass) and XLA's answer for that step, Keras 3's train step lowered by JAX for the TPU and compiled by XLA's
TPU compiler for the job's TPU type (the suite's own: the `compiler` fixture); validate refuses a step XLA
cannot fit, at train.batch_size, with XLA's words and a batch it compiled that fits.

`plan` runs as a `tpulaunch` process of its own: Keras chooses its backend once per process, and this pytest
process's is TensorFlow (validate's stage exports the step in a child process, which loads Keras on JAX)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Optional

import xla_plans
from paths import REPO
from tpulaunch.plan import xla_home

import pytest

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

KERAS3_CNN = textwrap.dedent('''
    import keras


    def cnn(num_classes=10, input_shape=(32, 32, 3)):
        inputs = keras.Input(shape=tuple(input_shape), name="image")
        x = inputs
        for stage in range(3):
            x = keras.layers.Conv2D(32 * 2 ** stage, 3, padding="same", activation="relu")(x)
            x = keras.layers.MaxPooling2D(2, padding="same")(x)
        x = keras.layers.GlobalAveragePooling2D()(x)
        return keras.Model(inputs, keras.layers.Dense(num_classes)(x))
''')


def jax_job(tmp_path, *, image: int, batch: int, tpu_type: str) -> str:
    """The Keras 3 CNN as a jax engine job on `tpu_type` (its data and model_dir on gs://: nothing is read)."""
    (tmp_path / "k3cnn.py").write_text(KERAS3_CNN)
    path = xla_plans.cnn_job(tmp_path, image=image, batch=batch, tpu_type=tpu_type)
    with open(path) as f:
        text = (f.read().replace("tpulaunch.models.cnn:build", "k3cnn:cnn")
                .replace("run: {model_dir: gs://my-bucket/run}", "run: {model_dir: gs://my-bucket/run, engine: jax}"))
    with open(path, "w") as f:
        f.write(text)
    return path


def test_plan_shows_xlas_figures_for_the_jax_engines_step_beside_its_estimate_and_a_second_plan_is_cached(
        tmp_path, compiler):
    job = jax_job(tmp_path, image=32, batch=64, tpu_type="v5litepod-4")  # 16 examples per v5e chip
    python, log = xla_plans.counting_compiler(tmp_path, compiler)
    env = {xla_home.ENV_VAR: python, xla_home.CACHE_ENV_VAR: str(tmp_path / "cache")}
    first = _tpulaunch("plan", job, env=env)
    out, compiled = first.stdout, xla_plans.compile_children(log)
    # The estimate's table, from the engine's own step: the CNN's weights and Adam's two slots, counted.
    assert "optimizer slots (2 per weight)" in out and "built at tile" in out, out
    # XLA's answer for the step JAX lowered, beside it, held to XLA's own line, and its batch one it compiled.
    assert ("answered by XLA: XLA's TPU compiler (v5e:2x2, 1 core(s) per replica, 16 examples per replica): "
            "compiled" in out), out
    assert "usable HBM: 15.75 GiB per core, XLA's own limit for v5e:2x2" in out, out
    assert "the estimate says fits at" in out and "memory: fits (XLA's TPU compiler)" in out, out
    assert "the largest batch compiled that fits, not a bound" in out and "large headroom: up to" not in out, out
    assert compiled >= 1 and first.stderr.count("plan: XLA's TPU compiler: compiling the step") == compiled

    second = _tpulaunch("plan", job, env=env)  # the same job: every answer from the cache, no compiler started
    assert xla_plans.compile_children(log) == compiled, log.read_text()
    assert "compiling" not in second.stderr and second.stderr.count("the answer cached in") == compiled, second.stderr
    assert "XLA's answer from the cache" in second.stdout
    summary = [line for line in out.splitlines() if line.strip().startswith("XLA: ")]
    assert summary and summary == [line for line in second.stdout.splitlines() if line.strip().startswith("XLA: ")]


def test_validate_refuses_a_jax_step_xla_cannot_fit_with_its_words_and_a_batch(tmp_path, compiler):
    # validate's own stage (`checks/xla_fit.py`, after the build), here without its data stage: the job's records
    # are on gs://, which this test does not serve.
    from tpulaunch.checks.xla_fit import xla_fit_problems
    from tpulaunch.job.load import load_job
    from tpulaunch.plan.build import build_plan

    loaded = load_job(jax_job(tmp_path, image=512, batch=1024, tpu_type="v5litepod-4"))  # 256 per v5e chip
    problems = xla_fit_problems(loaded, build_plan(loaded.job, engine="jax"))
    assert [p.code for p in problems] == ["xla-does-not-fit"], problems
    problem = problems[0]
    assert problem.path == "train.batch_size" and problem.line == 14
    assert "RESOURCE_EXHAUSTED: Ran out of memory on HBM" in problem.message and "(15.75G)" in problem.message
    assert "examples per replica fit (train.batch_size:" in problem.hint


def _tpulaunch(*args: str, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    done = subprocess.run([sys.executable, "-m", "tpulaunch", *args], capture_output=True, text=True, cwd=str(REPO),
                          env=dict(base, COLUMNS="400", **(env or {})), timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done
