"""A small keras-engine job the keras suite trains end to end (tests/keras_engine/test_keras_train.py, and under
lease faults test_keras_lease_outage.py and test_keras_fencing.py): the `project` fixture."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import user_models as corpus


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A two-layer classifier on 8x8 images, 64 training records in one file (so every run reads one order)."""
    root = tmp_path_factory.mktemp("keras_job")
    specs = {**corpus.IMAGE, **corpus.CLASS}
    corpus.write_records(root / "train.tfrecord", specs, 64, seed=1)
    corpus.write_records(root / "eval.tfrecord", specs, 32, seed=2)
    job = {
        "name": "keras-engine",
        "model": {"builder": "tpulaunch.models.cnn:build", "params": {"num_classes": 3},
                  "loss": "sparse_categorical_crossentropy", "optimizer": {"name": "sgd", "learning_rate": 0.05},
                  "metrics": ["accuracy"]},
        "data": {"train": "train.tfrecord", "eval": "eval.tfrecord", "features": corpus.IMAGE, "labels": corpus.CLASS,
                 "shuffle_buffer": 0},
        "train": {"batch_size": 8, "steps": 12},
        "eval": {"batch_size": 8, "steps": 4},
        "run": {"model_dir": "runs/k", "save_checkpoints_steps": 5, "log_every_steps": 1, "seed": 3, "engine": "keras"},
    }
    (root / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return root
