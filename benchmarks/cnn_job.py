"""The job the training benchmarks time: the quickstart CNN (or another builder) on `tpulaunch data synth
--example quickstart` records (32x32x3 images, 10 classes). One copy, so every benchmark trains the same
network on the same data and only what it compares differs."""

from __future__ import annotations

from typing import Mapping, Optional


def cnn_job(name: str, *, data: str, model_dir: str, steps: int, batch: int = 64,
            builder: str = "tpulaunch.models.cnn:build", optimizer: str = "adam", learning_rate: float = 0.003,
            run: Optional[Mapping[str, object]] = None) -> str:
    """The job file's text; `run` adds keys to run: (save_checkpoints_steps, engine, ...)."""
    run_keys = ", ".join(f"{key}: {value}" for key, value in {"model_dir": model_dir, **(run or {})}.items())
    return f"""\
name: {name}
model:
  builder: {builder}
  params: {{num_classes: 10}}
  loss: sparse_categorical_crossentropy
  optimizer: {{name: {optimizer}, learning_rate: {learning_rate}}}
data:
  train: {data}/train-*.tfrecord
  features:
    image: {{shape: [32, 32, 3], dtype: float32}}
  labels:
    label: {{shape: [], dtype: int64}}
train: {{batch_size: {batch}, steps: {steps}}}
run: {{{run_keys}}}
"""
