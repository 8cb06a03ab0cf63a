"""On the keras and jax engines too, what cannot run stops at its job key: class ids a sparse categorical
crossentropy cannot take (JAX would take them silently), an evaluation of no whole batch (never metrics of 0), a
builder value that builds an output of no elements, a batch that cannot fit this machine's memory. Real CLI
processes, each under an address-space limit (RLIMIT_AS)."""

import json
import os
import resource
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import yaml

from paths import REPO
from records import write_examples

# Room for TensorFlow's and JAX's own address space, far below what a refused batch needs.
ADDRESS_SPACE = 16 << 30

KERAS3_MODELS = textwrap.dedent('''
    import keras


    def classifier(num_classes=3):
        inputs = keras.Input(shape=(8, 8, 1), name="image")
        x = keras.layers.Flatten()(inputs)
        return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


    def tf_keras_classifier(num_classes=3):
        import tf_keras

        inputs = tf_keras.Input(shape=(8, 8, 1), name="image")
        x = tf_keras.layers.Flatten()(inputs)
        return tf_keras.Model(inputs, tf_keras.layers.Dense(num_classes)(x))
''')

# The model each engine trains: the reference tf.keras cnn on the keras engine, a Keras 3 one on jax.
BUILDERS = {"keras": {"builder": "tpulaunch.models.cnn:build",
                      "params": {"num_classes": 3, "input_shape": [8, 8, 1], "filters": 4}},
            "jax": {"builder": "k3models:classifier", "params": {"num_classes": 3}}}


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _records(count: int, labels=None, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [{"image": rng.normal(size=64).astype(np.float32),
             "label": np.int64(labels[i] if labels is not None else rng.integers(0, 3))} for i in range(count)]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("limits_keras")
    write_examples(root / "train.tfrecord.gz", _records(8), compression="GZIP")
    write_examples(root / "eval.tfrecord.gz", _records(6, seed=1), compression="GZIP")
    # One batch of the whole file, read in order: the first batch holds both bad ids.
    write_examples(root / "badlabels.tfrecord.gz", _records(8, labels=[0, 1, 999, 2, -3, 1, 0, 1]),
                   compression="GZIP")
    (root / "k3models.py").write_text(KERAS3_MODELS)
    for engine, model in BUILDERS.items():
        job = {"name": f"limits-{engine}",
               "model": {**model, "loss": "sparse_categorical_crossentropy",
                         "optimizer": {"name": "sgd", "learning_rate": 0.05}, "metrics": ["accuracy"]},
               # Compressed records: nothing tells their count before reading them all, so runs reach the engine.
               "data": {"train": "train.tfrecord.gz", "eval": "eval.tfrecord.gz", "compression": "GZIP",
                        "shuffle_buffer": 0, "features": {"image": {"shape": [8, 8, 1]}},
                        "labels": {"label": {"shape": [], "dtype": "int64"}}},
               "train": {"batch_size": 4, "steps": 2},
               "eval": {"batch_size": 2, "steps": 1},
               "run": {"model_dir": f"runs/{engine}", "save_checkpoints_steps": 2, "engine": engine}}
        (root / f"{engine}.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return root


def _run(project, engine: str, verb: str, *sets: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "tpulaunch", verb, str(project / f"{engine}.yaml"),
            *(["--local"] if verb == "train" else [])]
    for value in sets:
        args += ["--set", value]
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "KERAS_BACKEND")}
    path = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return subprocess.run(args, capture_output=True, text=True, cwd=project, preexec_fn=_limited, timeout=300,
                          env=dict(env, CI="1", PYTHONPATH=path))


@pytest.mark.parametrize("engine", ["keras", "jax"])
def test_class_ids_outside_the_loss_range_stop_training_at_the_first_batch_naming_them(project, engine):
    result = _run(project, engine, "train", "data.train=badlabels.tfrecord.gz", "train.batch_size=8",
                  f"run.model_dir=runs/{engine}-ids")
    assert result.returncode == 1, result.stdout + result.stderr
    assert ("error: data.labels.label: a batch of data.train holds class ids from -3 to 999, but only ids in [0, 3) "
            "are classes") in result.stderr
    assert "checkpoint |" not in result.stdout  # the bad batch trained nothing


@pytest.mark.parametrize("engine", ["keras", "jax"])
def test_class_ids_outside_the_loss_range_in_the_eval_set_stop_the_evaluation_naming_them(project, engine):
    """The eval batches are read inside Keras's evaluate(): the error is still the label's, not the model's."""
    result = _run(project, engine, "train", "data.eval=badlabels.tfrecord.gz", "eval.batch_size=8",
                  f"run.model_dir=runs/{engine}-eval-ids")
    assert result.returncode == 1, result.stdout + result.stderr
    assert ("error: data.labels.label: a batch of data.eval holds class ids from -3 to 999, but only ids in [0, 3) "
            "are classes") in result.stderr, result.stderr
    assert "eval |" not in result.stdout


@pytest.mark.parametrize("engine", ["keras", "jax"])
def test_an_evaluation_of_no_whole_batch_is_an_error_never_metrics_of_0(project, engine):
    result = _run(project, engine, "train", "eval.batch_size=10", f"run.model_dir=runs/{engine}-no-batch")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "error: eval.batch_size: data.eval holds fewer records than one batch" in result.stderr
    assert "eval |" not in result.stdout
    record = json.loads((project / "runs" / f"{engine}-no-batch" / "tpulaunch-runs.jsonl").read_text().splitlines()[-1])
    assert record["evals"] == [] and record["outcome"].startswith("failed: eval.batch_size")


def test_an_output_of_no_elements_is_refused_at_the_param_set_to_0_by_validate_and_train(project):
    """tf.keras makes a Dense of 0 units without a word (TensorFlow's CPU kernels then abort the first step): the
    build check refuses the model it builds."""
    for verb in ("validate", "train"):
        result = _run(project, "keras", verb, "model.builder=k3models:tf_keras_classifier",
                      "model.params={num_classes: 0}", "run.model_dir=runs/keras-zero")
        said = result.stdout + result.stderr
        assert result.returncode == 1, said
        assert "model.params.num_classes: " in said and "has shape [None, 0]" in said, said


def test_a_batch_that_cannot_fit_this_machine_is_refused_before_jax_allocates_it(project):
    result = _run(project, "jax", "train", "train.batch_size=1000000000", "run.model_dir=runs/jax-huge")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "train.batch_size: one batch of 1000000000 examples is" in result.stdout + result.stderr
    assert not (project / "runs" / "jax-huge").exists()
