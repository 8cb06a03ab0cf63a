"""A small job file for a Cloud TPU node (`tpu:` naming the local Cloud TPU API server's project and zone), for the
tests of the verbs that act on the node: up, down, status, and the stack rule."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tpu_api_server import DEFAULT_PROJECT, DEFAULT_ZONE


def tpu_job(tmp_path: Path, tpu_lines: str, *, name: str = "tpu-job", run: str = "") -> Path:
    """`tpu_lines` (one key per line) go under tpu: after name, zone and project (lines 9-11), from line 12;
    `run` adds keys to run: (", engine: keras")."""
    tpu = "\n".join(f"  {line.strip()}" for line in tpu_lines.strip().splitlines())
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: {name}
        model: {{builder: tpulaunch.models.cnn:small_cnn, optimizer: {{name: sgd, learning_rate: 0.1}}}}
        data:
          train: data/train.tfrecord
          features: {{image: {{shape: [8, 8, 1]}}}}
          labels: {{label: {{shape: [], dtype: int64}}}}
        train: {{batch_size: 8, steps: 10}}
        tpu:
          name: my-tpu
          zone: {DEFAULT_ZONE}
          project: {DEFAULT_PROJECT}
        """) + tpu + f"\nrun: {{model_dir: runs/x{run}}}\n")
    return path
