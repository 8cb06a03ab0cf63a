"""`tpulaunch plan` answered by XLA's TPU compiler, as the engines' suites drive it: a small CNN job (`cnn_job`),
its plan's memory section from a `plan` process (`plan_json`), and a compiler interpreter that logs each compile
child it starts (`counting_compiler`, `compile_children`)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from paths import REPO


def cnn_job(tmp_path, *, image: int = 32, batch: int = 64, tpu_type: str = "v3-8", extra: str = "") -> str:
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: xla-cnn
        model:
          builder: tpulaunch.models.cnn:build
          params: {{num_classes: 10}}
          loss: sparse_categorical_crossentropy
          optimizer: {{name: adam, learning_rate: 0.003}}
        data:
          train: gs://my-bucket/train-*.tfrecord
          features:
            image: {{shape: [{image}, {image}, 3], dtype: float32}}
          labels:
            label: {{shape: [], dtype: int64}}
        tpu: {{name: t, zone: europe-west4-a, project: my-project, type: {tpu_type}, iterations_per_loop: 10}}
        train: {{batch_size: {batch}, steps: 10}}
        run: {{model_dir: gs://my-bucket/run}}
        """) + extra)
    return str(path)


def plan_json(job: str, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-m", "tpulaunch", "plan", job, "--format", "json"], capture_output=True,
                          text=True, cwd=str(REPO), env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)["memory"]


def counting_compiler(tmp_path, real: str) -> tuple:
    """An interpreter for the compiler's environment that logs each start (its arguments) before running the real
    one: the log says which compile children ran."""
    log = tmp_path / "compiler-starts.log"
    wrapper = tmp_path / "xla-python"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper), log


def compile_children(log) -> int:
    return sum("xla_compile import main" in line for line in log.read_text().splitlines()) if log.exists() else 0
