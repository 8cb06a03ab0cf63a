"""The jax engine's numbers against Keras 3 on JAX itself (a differential oracle): on the same records in the same
order and the same seed, `tpulaunch train`'s weights equal `model.fit`'s; every metric `train` and `evaluate` print
and the run record holds equals `model.evaluate` over the same eval set; `export`'s SavedModel answers what
`model.predict` answers; a model its builder compile()d trains with its own compile where the job sets none; and a
run stopped at step 3 and resumed ends with the weights of one that never stopped.

The oracle is a plain Keras 3 program (`ORACLE`), run in a process of its own with KERAS_BACKEND=jax; it reads the
records with tf.data in file order, nothing of tpulaunch imported.

Tolerances: weights rtol 1e-5, atol 1e-6 (the same XLA step on the same CPU; only the order of float sums may
differ); evaluation rtol 1e-5, atol 1e-6 (the same test step, the same weights); the SavedModel, served by
TensorFlow, against JAX's predict: rtol 1e-5, atol 1e-5 (two compilers of the same graph).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml

import test_user_models as corpus
from keras_engine.test_jax_engine import TPULAUNCH, _env, _variables

WEIGHTS = dict(rtol=1e-5, atol=1e-6)
METRICS = dict(rtol=1e-5, atol=1e-6)
SERVED = dict(rtol=1e-5, atol=1e-5)

MODELS = textwrap.dedent('''
    import keras


    def classifier():
        inputs = keras.Input(shape=(8, 8, 1), name="image")
        x = keras.layers.Flatten()(inputs)
        x = keras.layers.Dense(16, activation="relu")(x)
        return keras.Model(inputs, keras.layers.Dense(3)(x))


    def compiled():
        """A model that compiles itself, as a KerasHub task does: its own optimizer, loss and metric."""
        model = classifier()
        model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.02),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")])
        return model
''')

# Keras 3 as its users write it: fit on the records in file order, evaluate and predict a checkpoint's weights.
ORACLE = textwrap.dedent('''
    import json, math, os, sys
    os.environ["KERAS_BACKEND"] = "jax"
    import numpy as np
    import tensorflow as tf
    import keras

    config = json.load(open(sys.argv[1]))
    sys.path.insert(0, config["project"])
    import oraclemodels

    def records(path):
        spec = {"image": tf.io.FixedLenFeature([8, 8, 1], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64)}
        parsed = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(path)]
        return np.stack([p["image"].numpy() for p in parsed]), np.stack([p["label"].numpy() for p in parsed])

    keras.utils.set_random_seed(config["seed"])
    model = getattr(oraclemodels, config["builder"])()
    if config["compile"]:  # the job's optimizer, loss and metrics, as a Keras user compiles them
        model.compile(optimizer=keras.optimizers.Adam(learning_rate=config["learning_rate"]),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    x, y = records(config["train"])
    batch, steps = config["batch_size"], config["steps"]
    epochs = math.ceil(steps * batch / len(x))  # the records in file order, epoch after epoch
    x, y = np.concatenate([x] * epochs)[:steps * batch], np.concatenate([y] * epochs)[:steps * batch]
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    np.savez(config["out"] + ".fit.npz", *model.get_weights())

    checkpoint = np.load(config["checkpoint"])
    model.set_weights([checkpoint[f"arr_{i}"] for i in range(len(model.weights))])
    ex, ey = records(config["eval"])
    evaluated = model.evaluate(ex, ey, batch_size=config["eval_batch_size"], steps=config["eval_steps"], verbose=0,
                               return_dict=True)
    np.save(config["out"] + ".predict.npy", model.predict(ex, verbose=0))
    json.dump({k: float(v) for k, v in evaluated.items()}, open(config["out"] + ".evaluate.json", "w"))
''')

STEPS, BATCH, EVAL_STEPS, SEED = 6, 8, 5, 7


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """32 training records (4 batches: step 5 starts the second epoch), 40 eval records (5 batches, all evaluated),
    read in file order (shuffle_buffer 0): the order the oracle reads them in."""
    root = tmp_path_factory.mktemp("oracle_jax")
    specs = {**corpus.IMAGE, **corpus.CLASS}
    corpus.write_records(root / "train.tfrecord", specs, 32, seed=11)
    corpus.write_records(root / "eval.tfrecord", specs, 40, seed=12)
    (root / "oraclemodels.py").write_text(MODELS)
    job = {
        "name": "oracle-jax",
        "model": {"builder": "oraclemodels:classifier", "loss": "sparse_categorical_crossentropy",
                  "optimizer": {"name": "adam", "learning_rate": 0.01}, "metrics": ["accuracy"]},
        "data": {"train": "train.tfrecord", "eval": "eval.tfrecord", "features": corpus.IMAGE, "labels": corpus.CLASS,
                 "shuffle_buffer": 0},
        "train": {"batch_size": BATCH, "steps": STEPS},
        "eval": {"batch_size": BATCH, "steps": EVAL_STEPS},
        "run": {"model_dir": "runs/j", "save_checkpoints_steps": 3, "log_every_steps": 1, "seed": SEED,
                "engine": "jax"},
    }
    (root / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return root


def _run(verb: str, project: Path, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([*TPULAUNCH, verb, str(project / "job.yaml"), *args], capture_output=True, text=True,
                            env=_env(), timeout=300, cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _model_weights(model_dir: Path, count: int) -> list:
    """The model's weights in a jax-engine checkpoint: the first `count` of variables/0, variables/1, ..."""
    found = _variables(model_dir)
    return [found[f"variables/{i}/.ATTRIBUTES/VARIABLE_VALUE"] for i in range(count)]


def _oracle(project: Path, tmp: Path, checkpoint: list, *, builder: str = "classifier", compile: bool = True) -> dict:
    """What Keras 3 on JAX computes: the weights `fit` ends with, `evaluate`'s metrics and `predict`'s outputs of
    `checkpoint`'s weights on the eval set."""
    np.savez(tmp / "checkpoint.npz", *checkpoint)
    config = {"project": str(project), "builder": builder, "compile": compile, "seed": SEED, "learning_rate": 0.01,
              "train": str(project / "train.tfrecord"), "eval": str(project / "eval.tfrecord"), "batch_size": BATCH,
              "steps": STEPS, "eval_batch_size": BATCH, "eval_steps": EVAL_STEPS,
              "checkpoint": str(tmp / "checkpoint.npz"), "out": str(tmp / "oracle")}
    (tmp / "oracle.json").write_text(json.dumps(config))
    (tmp / "oracle.py").write_text(ORACLE)
    env = {k: v for k, v in _env().items() if k != "PYTHONPATH"}  # nothing of tpulaunch
    ran = subprocess.run([sys.executable, str(tmp / "oracle.py"), str(tmp / "oracle.json")], capture_output=True,
                         text=True, env=env, timeout=300, cwd=tmp)
    assert ran.returncode == 0, ran.stderr[-3000:]
    fitted = np.load(tmp / "oracle.fit.npz")
    return {"fit": [fitted[f"arr_{i}"] for i in range(len(fitted.files))],
            "evaluate": json.loads((tmp / "oracle.evaluate.json").read_text()),
            "predict": np.load(tmp / "oracle.predict.npy")}


def _recorded_evals(model_dir: Path, command: str) -> list:
    """The metrics of each evaluation in the run record's last line of `command`."""
    lines = [json.loads(line) for line in (model_dir / "tpulaunch-runs.jsonl").read_text().splitlines()]
    return [e["metrics"] for e in [line for line in lines if line["command"] == command][-1]["evals"]]


def _close(ours: dict, theirs: dict) -> None:
    for name, value in theirs.items():
        np.testing.assert_allclose(ours[name], value, err_msg=name, **METRICS)


@pytest.fixture(scope="module")
def trained(project, tmp_path_factory) -> tuple:
    """`tpulaunch train` of the job: (model_dir, stdout)."""
    model_dir = tmp_path_factory.mktemp("trained") / "run"
    return model_dir, _run("train", project, "--model-dir", str(model_dir)).stdout


def test_train_evaluate_and_export_equal_keras_fit_evaluate_and_predict(project, trained, tmp_path):
    from tpulaunch.run.text import format_value

    model_dir, stdout = trained
    ours = _model_weights(model_dir, 4)
    oracle = _oracle(project, tmp_path, ours)
    for i, (mine, theirs) in enumerate(zip(ours, oracle["fit"])):
        np.testing.assert_allclose(mine, theirs, err_msg=f"weight {i}", **WEIGHTS)

    # The evaluation at the end of train: the mean over the eval set, in the run record and on the eval line.
    expected = oracle["evaluate"]
    assert set(expected) == {"loss", "accuracy"}
    (recorded,) = _recorded_evals(model_dir, "train")
    _close(recorded, expected)
    shown = f"eval | step {STEPS} | accuracy {format_value(expected['accuracy'])} | loss {format_value(expected['loss'])}"
    assert shown in stdout.splitlines(), stdout

    evaluated = _run("evaluate", project, "--set", f"run.model_dir={model_dir}")
    assert shown in evaluated.stdout.splitlines(), evaluated.stdout
    _close(_recorded_evals(model_dir, "evaluate")[-1], expected)

    exported = _run("export", project, str(tmp_path / "exported"), "--set", f"run.model_dir={model_dir}")
    path = re.search(r"^exported (\S+)$", exported.stdout, re.MULTILINE).group(1)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    images = np.stack([features for features, _ in _eval_records(project)])
    np.testing.assert_allclose(serve(image=tf.constant(images))["outputs"].numpy(), oracle["predict"], **SERVED)


def _eval_records(project: Path) -> list:
    spec = {"image": tf.io.FixedLenFeature([8, 8, 1], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64)}
    return [(p["image"].numpy(), p["label"].numpy()) for p in
            (tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(str(project / "eval.tfrecord")))]


def test_a_model_compiled_by_its_builder_trains_with_its_own_compile_where_the_job_sets_none(project, tmp_path):
    job = yaml.safe_load((project / "job.yaml").read_text())
    for key in ("loss", "optimizer", "metrics"):
        del job["model"][key]
    job["model"]["builder"] = "oraclemodels:compiled"
    (project / "compiled.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    model_dir = tmp_path / "run"
    result = subprocess.run([*TPULAUNCH, "train", str(project / "compiled.yaml"), "--model-dir", str(model_dir)],
                            capture_output=True, text=True, env=_env(), timeout=300, cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Functional was compiled: its loss SparseCategoricalCrossentropy; its optimizer Adam; its metrics " \
           "[SparseCategoricalAccuracy]" in result.stdout, result.stdout

    ours = _model_weights(model_dir, 4)
    oracle = _oracle(project, tmp_path, ours, builder="compiled", compile=False)
    for i, (mine, theirs) in enumerate(zip(ours, oracle["fit"])):
        np.testing.assert_allclose(mine, theirs, err_msg=f"weight {i}", **WEIGHTS)
    assert set(oracle["evaluate"]) == {"loss", "acc"}  # its own metric, evaluated as evaluate() does
    _close(_recorded_evals(model_dir, "train")[-1], oracle["evaluate"])


def test_a_run_stopped_at_step_3_and_resumed_equals_one_that_never_stopped(project, tmp_path):
    """Shuffled (a seeded buffer, reshuffled each epoch): the resumed run reads on from batch 4 of the same order."""
    shuffled = ("--set", "data.shuffle_buffer=16", "--set", "eval=null")
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    _run("train", project, "--model-dir", str(whole), *shuffled)
    _run("train", project, "--model-dir", str(parts), *shuffled, "--set", "train.steps=3")
    resumed = _run("train", project, "--model-dir", str(parts), *shuffled)
    assert f"resumed from step 3 ({parts})" in resumed.stdout.splitlines()
    ours, theirs = _variables(parts), _variables(whole)
    assert sorted(ours) == sorted(theirs) and ours["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == STEPS
    for name in theirs:
        np.testing.assert_allclose(ours[name], theirs[name], err_msg=name, **WEIGHTS)
