"""Spatial partitioning on the jax engine, for real on this CPU split into 8 devices: a small UNet-style model
trained with its images and masks split 2x2 (2 replicas of 4 devices, XLA's SPMD partitioner splitting the
convolutions), ends with the weights of the same job unsplit on one device, and with the weights Keras 3's own
fit() on JAX gives on one device without tpulaunch (the differential oracle, `oracle.py`; its tolerances); an
uneven split is refused at its key, and a replica that does not divide the devices before anything is built."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

import user_models as corpus
from jax_runs import TPULAUNCH, checkpoint_variables, run_env
from oracle import assert_weights_equal, run_oracle

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

UNET = textwrap.dedent('''
    import keras


    def unet(num_classes=3):
        inputs = keras.Input(shape=(16, 16, 1), name="image")
        down = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
        x = keras.layers.MaxPooling2D()(down)
        x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(x)
        x = keras.layers.UpSampling2D()(x)
        x = keras.layers.Concatenate()([x, down])
        return keras.Model(inputs, keras.layers.Conv2D(num_classes, 1)(x))  # a class per pixel
''')
IMAGE = {"image": {"shape": [16, 16, 1]}}
MASK = {"mask": {"shape": [16, 16, 1], "dtype": "int64"}}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """One batch of 8 records read in order (every step trains on the same examples), split 2x2 on each image
    and its mask."""
    root = tmp_path_factory.mktemp("jax_partition")
    corpus.write_records(root / "train.tfrecord", {**IMAGE, **MASK}, 8, seed=1)
    (root / "unet.py").write_text(UNET)
    job = {
        "name": "jax-unet",
        "model": {"builder": "unet:unet", "loss": "sparse_categorical_crossentropy",
                  "optimizer": {"name": "sgd", "learning_rate": 0.1}},
        "data": {"train": "train.tfrecord", "features": IMAGE, "labels": MASK, "shuffle_buffer": 0},
        "partition": {"features": {"image": [1, 2, 2, 1]}, "labels": {"mask": [1, 2, 2, 1]}},
        "train": {"batch_size": 8, "steps": 3},
        "run": {"model_dir": "runs/u", "save_checkpoints_steps": 3, "log_every_steps": 1, "seed": 3, "engine": "jax"},
    }
    (root / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return root


def _run(verb: str, project: Path, *args: str, devices: int) -> subprocess.CompletedProcess:
    return subprocess.run([*TPULAUNCH, verb, str(project / "job.yaml"), *args], capture_output=True, text=True,
                          env=run_env(devices), timeout=300, cwd=project)


@pytest.fixture(scope="module")
def split(project, tmp_path_factory) -> Path:
    """The job trained 3 steps split 2x2 over 8 devices: its model_dir."""
    model_dir = tmp_path_factory.mktemp("jax_partition_runs") / "split"
    trained = _run("train", project, "--model-dir", str(model_dir), "--set", "train.steps=3", devices=8)
    assert trained.returncode == 0, trained.stderr
    assert "jax | 2 replicas × 4 cores (spatial 2×2 on image) over 8 cpu devices" in trained.stdout.splitlines()
    return model_dir


def test_a_2x2_spatial_split_over_8_devices_trains_to_the_weights_of_the_unsplit_job_on_one_device(
        project, split, tmp_path):
    """(Resume reads and writes a split run's checkpoints as any other: the variables are replicated.)"""
    whole = tmp_path / "whole"
    unsplit = _run("train", project, "--model-dir", str(whole), "--set", "partition=null", devices=1)
    assert unsplit.returncode == 0, unsplit.stderr
    assert "jax | data-parallel over 1 cpu device" in unsplit.stdout.splitlines()

    first, second = checkpoint_variables(whole), checkpoint_variables(split)
    assert sorted(first) == sorted(second)
    assert second["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == 3
    for name in first:
        np.testing.assert_allclose(second[name], first[name], rtol=1e-5, atol=1e-5, err_msg=name)


def test_the_split_runs_weights_are_those_of_keras_fit_on_jax_on_one_device(project, split, tmp_path):
    """The framework's answer (oracle.py): Keras 3's own fit() on JAX, one device, nothing of tpulaunch, on the same
    records (images and masks) in the same order from the same seed, with the job's SGD(0.1) on the crossentropy of
    the per-pixel logits; the split run's checkpoint holds its weights (variables/i: model.weights[i])."""
    oracle = run_oracle(project, tmp_path, run_env(1), backend="jax", builder="unet:unet")
    found = checkpoint_variables(split)
    ours = [found[f"variables/{i}/.ATTRIBUTES/VARIABLE_VALUE"] for i in range(len(oracle["fit"]))]
    assert_weights_equal(ours, oracle["fit"])


def test_an_uneven_split_is_refused_at_its_key_and_a_replica_that_does_not_divide_the_devices_before_the_build(
        project, tmp_path):
    uneven = _run("validate", project, "--static", "--set", "partition.features.image=[1,3,2,1]",
                  "--set", "partition.labels.mask=[1,3,2,1]", devices=8)
    said = uneven.stdout + uneven.stderr
    assert uneven.returncode == 1, said
    assert "--set:1:1: partition.features.image[1]: axis 1 of 'image' has size 16, which 3 does not divide: the jax " \
           "engine shards an axis into equal pieces only" in said
    assert "[partition-uneven-split]" in said and "Traceback" not in said

    six = _run("train", project, "--model-dir", str(tmp_path / "six"), devices=6)
    said = six.stdout + six.stderr
    assert six.returncode == 1, said
    assert "error: partition: building the train graph: a replica spans 4 devices (the product of the dims of " \
           "'image'), which do not divide this machine's 6 cpu devices" in said
    assert "phase | initialise" not in said and "Traceback" not in said
    assert not (tmp_path / "six").exists() or not list((tmp_path / "six").glob("model.ckpt-*"))


def test_a_local_plan_of_the_split_job_shows_the_replicas_its_run_takes_of_this_machines_devices(project):
    """8 devices in replicas of 4: 2 replicas, each batch of 8 split in 2 along its first axis, then 2x2 spatially,
    as the run's own first line says it."""
    planned = _run("plan", project, "--no-memory", "--format", "json", devices=8)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["local_devices"] == {"count": 8, "platform": "cpu", "replicas": 2, "mesh": [2, 2, 2],
                                     "text": "2 replicas × 4 cores (spatial 2×2 on image) over 8 cpu devices"}
    (train,) = plan["batches"]
    assert (train["global_batch"], train["per_replica"]) == (8, 4)
    assert {t["name"]: (t["shape"], t["piece"]) for t in plan["tensors"]} == {
        "image": ([4, 16, 16, 1], [4, 8, 8, 1]), "mask": ([4, 16, 16, 1], [4, 8, 8, 1])}
