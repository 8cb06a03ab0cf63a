"""The differential oracle of tests/keras_engine/test_oracle_keras.py and tests/jax_engine/test_oracle_jax.py:
Keras 3 as its users write it, in a process of its own on the backend an engine runs (JAX, or TensorFlow), nothing
of tpulaunch imported. On the job's records in file order and the job's seed it fits the model, and on a
checkpoint's weights it evaluates and predicts the eval set. `run_oracles` answers several such calls of one backend
from one process (a module trains its models first, then asks once): each call as its own process would answer it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import tensorflow as tf
import yaml

import user_models as corpus

# Tolerances: weights rtol 1e-5, atol 1e-6 (the same step on the same CPU; only the order of float sums may differ);
# evaluation rtol 1e-5, atol 1e-6 (the same weights, the same metrics); a SavedModel served by TensorFlow against
# the framework's predict: rtol 1e-5, atol 1e-5.
WEIGHTS = dict(rtol=1e-5, atol=1e-6)
METRICS = dict(rtol=1e-5, atol=1e-6)
SERVED = dict(rtol=1e-5, atol=1e-5)

STEPS, BATCH, EVAL_STEPS, SEED, LEARNING_RATE = 6, 8, 5, 7, 0.01

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


    def sequential():
        """A Sequential model given without an Input: built at its first batch."""
        return keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"),
                                 keras.layers.Dense(3)])


    class TwoLayers(keras.Model):
        """A subclassed model with its own call: no Input, built at its first call."""

        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(16, activation="relu")
            self.logits = keras.layers.Dense(3)

        def call(self, image, training=False):
            return self.logits(self.hidden(keras.ops.reshape(image, (-1, 64))))


    def subclassed():
        return TwoLayers()


    def two_heads():
        """Two heads on one trunk, returned as a dict keyed like the labels: class logits and a box."""
        inputs = keras.Input(shape=(8, 8, 1), name="image")
        x = keras.layers.Dense(16, activation="relu")(keras.layers.Flatten()(inputs))
        return keras.Model(inputs, {"cls": keras.layers.Dense(3, name="cls")(x),
                                    "box": keras.layers.Dense(4, name="box")(x)})


    def two_heads_list():
        """The same heads returned as a list, [box, cls]: output layers named like the labels, in another order than
        the job declares them."""
        inputs = keras.Input(shape=(8, 8, 1), name="image")
        x = keras.layers.Dense(16, activation="relu")(keras.layers.Flatten()(inputs))
        return keras.Model(inputs, [keras.layers.Dense(4, name="box")(x), keras.layers.Dense(3, name="cls")(x)])
''')

# Keras 3 as its users write it: fit on the records in file order; evaluate and predict a checkpoint's weights (a
# jax-engine checkpoint's as arrays; a keras-engine one restored by tf.train.Checkpoint, as it was written, into a
# model whose weights were zeroed first, so a weight the restore misses is seen). Records of any declared features
# and labels; without an eval set, fit alone.
PROGRAM = textwrap.dedent('''
    import importlib, json, math, os, sys
    config = json.load(open(sys.argv[1]))
    os.environ["KERAS_BACKEND"] = config["backend"]
    import numpy as np
    import tensorflow as tf
    import keras

    sys.path.insert(0, config["project"])
    module, name = config["builder"].split(":")

    def records(path):
        declared = {**config["features"], **config["labels"]}
        specs = {key: tf.io.FixedLenFeature(spec["shape"], spec.get("dtype", "float32"))
                 for key, spec in declared.items()}
        parsed = [tf.io.parse_single_example(r, specs) for r in tf.data.TFRecordDataset(path)]
        column = {key: np.stack([p[key].numpy() for p in parsed]) for key in declared}
        x, y = ({key: column[key] for key in config[part]} for part in ("features", "labels"))
        return tuple(d if len(d) > 1 else next(iter(d.values())) for d in (x, y))

    keras.utils.set_random_seed(config["seed"])
    model = getattr(importlib.import_module(module), name)()
    if config["compile"]:  # the job's optimizer, loss and metrics, as a Keras user compiles them
        optimizer = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD}[config["optimizer"]]
        losses = config.get("losses")  # several labels: {label: a Keras loss's config or name}
        loss = ({label: keras.losses.get(spec) for label, spec in losses.items()} if losses else
                keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.compile(optimizer=optimizer(learning_rate=config["learning_rate"]), loss=loss,
                      metrics=config["metrics"])
    x, y = records(config["train"])
    batch, steps = config["batch_size"], config["steps"]
    count = len(next(iter(x.values())) if isinstance(x, dict) else x)
    epochs = math.ceil(steps * batch / count)  # the records in file order, epoch after epoch
    repeat = lambda a: np.concatenate([a] * epochs)[:steps * batch]
    x, y = ({k: repeat(v) for k, v in d.items()} if isinstance(d, dict) else repeat(d) for d in (x, y))
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    np.savez(config["out"] + ".fit.npz", *model.get_weights())
    if not config["eval"]:
        sys.exit(0)

    if config.get("tf_checkpoint"):
        model.set_weights([np.zeros_like(w) for w in model.get_weights()])
        tf.train.Checkpoint(model=model).read(config["tf_checkpoint"]).expect_partial()
    else:
        checkpoint = np.load(config["checkpoint"])
        model.set_weights([checkpoint[f"arr_{i}"] for i in range(len(model.weights))])
    np.savez(config["out"] + ".checkpoint.npz", *model.get_weights())
    ex, ey = records(config["eval"])
    evaluated = model.evaluate(ex, ey, batch_size=config["eval_batch_size"], steps=config["eval_steps"], verbose=0,
                               return_dict=True)
    predicted = model.predict(ex, verbose=0)
    if isinstance(predicted, (list, tuple)):  # several outputs: by name
        predicted = dict(zip(model.output_names, predicted))
    if isinstance(predicted, dict):
        np.savez(config["out"] + ".predict.npz", **predicted)
    else:
        np.save(config["out"] + ".predict.npy", predicted)
    json.dump({k: float(v) for k, v in evaluated.items()}, open(config["out"] + ".evaluate.json", "w"))
''')


# A builder that compiles two named heads itself (the keras and jax engines' two-label oracle tests).
TWO_HEADS_COMPILED = textwrap.dedent('''
    import keras


    def build():
        """Two named heads compiled by the builder: a class scored by a crossentropy, a box by a squared error,
        with loss weights and a weighted metric (a KerasHub-style model that brings its own compile)."""
        image = keras.Input(shape=(8, 8, 1), name="image")
        x = keras.layers.Dense(8, activation="relu")(keras.layers.Flatten()(image))
        model = keras.Model(image, {"cls": keras.layers.Dense(3, name="cls")(x),
                                    "box": keras.layers.Dense(4, name="box")(x)})
        model.compile(optimizer=keras.optimizers.Adam(0.02),
                      loss={"cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "box": "mse"},
                      loss_weights={"cls": 0.25, "box": 2.0},
                      metrics={"cls": [keras.metrics.SparseCategoricalAccuracy(name="acc")], "box": ["mae"]},
                      weighted_metrics={"box": ["mse"]})
        return model
''')


def write_project(root: Path, engine: str) -> Path:
    """32 training records (4 batches: step 5 starts the second epoch), 40 eval records (5 batches, all evaluated),
    read in file order (shuffle_buffer 0): the order the oracle reads them in."""
    specs = {**corpus.IMAGE, **corpus.CLASS}
    corpus.write_records(root / "train.tfrecord", specs, 32, seed=11)
    corpus.write_records(root / "eval.tfrecord", specs, 40, seed=12)
    (root / "oraclemodels.py").write_text(MODELS)
    job = {
        "name": f"oracle-{engine}",
        "model": {"builder": "oraclemodels:classifier", "loss": "sparse_categorical_crossentropy",
                  "optimizer": {"name": "adam", "learning_rate": LEARNING_RATE}, "metrics": ["accuracy"]},
        "data": {"train": "train.tfrecord", "eval": "eval.tfrecord", "features": corpus.IMAGE, "labels": corpus.CLASS,
                 "shuffle_buffer": 0},
        "train": {"batch_size": BATCH, "steps": STEPS},
        "eval": {"batch_size": BATCH, "steps": EVAL_STEPS},
        "run": {"model_dir": "runs/j", "save_checkpoints_steps": 3, "log_every_steps": 1, "seed": SEED,
                "engine": engine},
    }
    (root / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return root


def model_style_cases(compiled_job: str) -> dict:
    """The models each oracle module trains on its project, one `train` each: {case: (its job file, its --set, its
    oracle's builder and compile)}: the job's classifier, a model its builder compiled (`compiled_job`, from
    write_compiled_job), a Sequential and a subclassed model."""
    return {"classifier": ("job.yaml", (), {}),
            "compiled": (compiled_job, (), {"builder": "compiled", "compile": False}),
            **{style: ("job.yaml", ("--set", f"model.builder=oraclemodels:{style}"), {"builder": style})
               for style in ("sequential", "subclassed")}}


def write_compiled_job(project: Path, builder: str, *, source: str = "job.yaml",
                       unset: tuple = ("loss", "optimizer", "metrics")) -> str:
    """project/compiled.yaml: the job `source` with `builder` (one that compiles its model itself) and without the
    model keys `unset`, so the builder's own compile decides them. Returns its file name."""
    job = yaml.safe_load((project / source).read_text())
    for key in unset:
        del job["model"][key]
    job["model"]["builder"] = builder
    (project / "compiled.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return "compiled.yaml"


def write_compiled_project(root: Path, *, engine: str, labels: dict, module: str, source: str) -> tuple:
    """A project of its own for a model its builder compiles (`module`.py holding `source`, builder `module:build`),
    the job setting no model.loss: 32 training records and an eval set that ends in a partial batch (37 records at
    batch 8: 4 whole batches and 5 records more), in file order. Returns (root, job)."""
    specs = {**corpus.IMAGE, **labels}
    corpus.write_records(root / "train.tfrecord", specs, 32, seed=11)
    corpus.write_records(root / "eval.tfrecord", specs, 37, seed=12)
    (root / f"{module}.py").write_text(source)
    job = {"name": module, "model": {"builder": f"{module}:build"},
           "data": {"train": "train.tfrecord", "eval": "eval.tfrecord", "features": corpus.IMAGE, "labels": labels,
                    "shuffle_buffer": 0},
           "train": {"batch_size": BATCH, "steps": 4}, "eval": {"batch_size": BATCH, "steps": 5},
           "run": {"model_dir": "run", "save_checkpoints_steps": 4, "seed": SEED, "engine": engine}}
    (root / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    return root, job


def run_oracle(project: Path, tmp: Path, env: dict, *, backend: str, checkpoint=None, tf_checkpoint=None,
               builder: str = "classifier", compile: bool = True, job: str = "job.yaml", losses=None,
               metrics=None) -> dict:
    """What Keras 3 computes for the project's `job` (its records, batch, steps, seed, eval set; compile=True: its
    optimizer, learning rate and metrics, with a crossentropy on logits): the weights `fit` ends with ("fit"), and
    where the job has an eval set, the checkpoint's weights as Keras reads them ("checkpoint"), `evaluate`'s metrics
    and `predict`'s outputs of the checkpoint on it (several: a dict by output name). `builder`: a name in oraclemodels,
    or module:name. Several labels: `losses` ({label: a Keras loss's config or name}) and `metrics` (as compile()
    takes them) say what it compiles with in the job's place."""
    config = _oracle_config(project, tmp, backend=backend, checkpoint=checkpoint, tf_checkpoint=tf_checkpoint,
                            builder=builder, compile=compile, job=job, losses=losses, metrics=metrics)
    (tmp / "oracle.py").write_text(PROGRAM)
    _run_programs(tmp, env, [(tmp / "oracle.py", tmp / "oracle.json")])
    return _oracle_answers(config)


def _oracle_config(project: Path, tmp: Path, *, backend: str, checkpoint=None, tf_checkpoint=None,
                   builder: str = "classifier", compile: bool = True, job: str = "job.yaml", losses=None,
                   metrics=None) -> dict:
    """PROGRAM's config for run_oracle's arguments, written to tmp/oracle.json (the checkpoint's arrays beside it);
    PROGRAM writes its answers to tmp/oracle.*."""
    spec = yaml.safe_load((project / job).read_text())
    model, data, evaluation = spec["model"], spec["data"], spec.get("eval") or {}
    # The one it compiles with, unless told each label's.
    assert not compile or losses or model.get("loss") == "sparse_categorical_crossentropy", model
    optimizer = model.get("optimizer") or {}
    optimizer = {"name": optimizer} if isinstance(optimizer, str) else optimizer
    config = {"project": str(project), "backend": backend, "compile": compile, "seed": spec["run"]["seed"],
              "builder": builder if ":" in builder else f"oraclemodels:{builder}",
              "optimizer": optimizer.get("name"), "learning_rate": optimizer.get("learning_rate"),
              "metrics": model.get("metrics", []) if metrics is None else metrics, "losses": losses,
              "features": data["features"], "labels": data["labels"],
              "train": str(project / data["train"]), "eval": data.get("eval") and str(project / data["eval"]),
              "batch_size": spec["train"]["batch_size"], "steps": spec["train"]["steps"],
              "eval_batch_size": evaluation.get("batch_size"), "eval_steps": evaluation.get("steps"),
              "out": str(tmp / "oracle"), "tf_checkpoint": tf_checkpoint}
    if checkpoint is not None:
        np.savez(tmp / "checkpoint.npz", *checkpoint)
        config["checkpoint"] = str(tmp / "checkpoint.npz")
    (tmp / "oracle.json").write_text(json.dumps(config))
    return config


def _oracle_answers(config: dict) -> dict:
    """What PROGRAM wrote for `config`: run_oracle's answer."""
    tmp = Path(config["out"]).parent

    def arrays(name):
        found = np.load(tmp / f"oracle.{name}.npz")
        return [found[f"arr_{i}"] for i in range(len(found.files))]

    if not config["eval"]:
        return {"fit": arrays("fit")}
    return {"fit": arrays("fit"), "checkpoint": arrays("checkpoint"),
            "evaluate": json.loads((tmp / "oracle.evaluate.json").read_text()),
            "predict": _predicted(tmp)}


# Runs each (program, config) of argv[1]'s list in this one process, as `python program config` would: Keras's global
# state cleared first (PROGRAM then seeds every generator, keras.utils.set_random_seed, before it builds its model:
# the initial weights a fresh process gives), and the project's own modules (its builders) forgotten after, so the
# next config imports its own project's.
EACH = textwrap.dedent('''
    import json, runpy, sys
    for program, config in json.load(open(sys.argv[1])):
        if "keras" in sys.modules:
            sys.modules["keras"].backend.clear_session()
        sys.argv = [program, config]
        try:
            runpy.run_path(program, run_name="__main__")
        except SystemExit as stop:
            if stop.code not in (None, 0):
                raise
        project = json.load(open(config))["project"].rstrip("/") + "/"
        for name, module in list(sys.modules.items()):
            if (getattr(module, "__file__", None) or "").startswith(project):
                del sys.modules[name]
''')


def _run_programs(tmp: Path, env: dict, runs: list) -> None:
    """Each (program, config) of `runs` (paths): one alone as `python program config`, several in one process (EACH),
    started in `tmp`."""
    env = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "KERAS_BACKEND", "TF_USE_LEGACY_KERAS")}
    if len(runs) == 1:
        command = [str(path) for path in runs[0]]
    else:
        (tmp / "each.json").write_text(json.dumps([[str(program), str(config)] for program, config in runs]))
        (tmp / "each.py").write_text(EACH)
        command = [str(tmp / "each.py"), str(tmp / "each.json")]
    ran = subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env,
                         timeout=300 * len(runs), cwd=tmp)
    assert ran.returncode == 0, ran.stderr[-3000:]


def oracle_call(project: Path, **kwargs) -> tuple:
    """One call of run_oracle (its keywords, backend included) for `run_oracles`."""
    return ("oracle", project, kwargs)


def evaluate_call(project: Path, **kwargs) -> tuple:
    """One call of keras_evaluate (its keywords) for `run_oracles`."""
    return ("evaluate", project, kwargs)


def run_oracles(tmp: Path, env: dict, calls: dict) -> dict:
    """The answers of several oracle calls ({name: oracle_call(...) or evaluate_call(...)}) from ONE process, each as
    run_oracle or keras_evaluate answers it, by name, each call's files under tmp/name. Keras picks its backend once
    per process, so the calls share one backend; what they share is the process's start (TensorFlow's, Keras's and
    JAX's import: seconds each on this CPU), not any state (EACH)."""
    backends = {kwargs.get("backend", "tensorflow") for _, _, kwargs in calls.values()}
    assert len(backends) == 1, f"one backend a process: {backends}"
    (tmp / "oracle.py").write_text(PROGRAM)
    (tmp / "evaluate.py").write_text(EVALUATE)
    configs, runs = {}, []
    for name, (kind, project, kwargs) in calls.items():
        folder = tmp / name
        folder.mkdir()
        if kind == "oracle":
            configs[name] = _oracle_config(project, folder, **kwargs)
            runs.append((tmp / "oracle.py", folder / "oracle.json"))
        else:
            configs[name] = _evaluate_config(project, folder, **kwargs)
            runs.append((tmp / "evaluate.py", folder / "evaluate.json.config"))
    _run_programs(tmp, env, runs)
    return {name: _oracle_answers(config) if calls[name][0] == "oracle" else json.loads(Path(config["out"]).read_text())
            for name, config in configs.items()}


def _predicted(tmp: Path):
    if (tmp / "oracle.predict.npz").exists():
        found = np.load(tmp / "oracle.predict.npz")
        return {name: found[name] for name in found.files}
    return np.load(tmp / "oracle.predict.npy")


def assert_weights_equal(ours: list, theirs: list) -> None:
    assert len(ours) == len(theirs)
    for i, (mine, other) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(mine, other, err_msg=f"weight {i}", **WEIGHTS)


def recorded_evals(model_dir: Path, command: str) -> list:
    """The metrics of each evaluation in the run record's last line of `command`."""
    lines = [json.loads(line) for line in (model_dir / "tpulaunch-runs.jsonl").read_text().splitlines()]
    return [e["metrics"] for e in [line for line in lines if line["command"] == command][-1]["evals"]]


def assert_metrics_equal(ours: dict, theirs: dict) -> None:
    for name, value in theirs.items():
        np.testing.assert_allclose(ours[name], value, err_msg=name, **METRICS)


def assert_reported_as_evaluated(model_dir: Path, trained: str, evaluated: str, expected: dict,
                                 step: int = STEPS) -> None:
    """What `train` printed (`trained`, its stdout) and recorded of its evaluation, and what `evaluate` printed
    (`evaluated`) and recorded, all equal `expected`: Keras's evaluate() of the same checkpoint."""
    (recorded,) = recorded_evals(model_dir, "train")
    assert_metrics_equal(recorded, expected)
    assert eval_line(step, expected) in trained.splitlines(), trained
    assert eval_line(step, expected) in evaluated.splitlines(), evaluated
    assert_metrics_equal(recorded_evals(model_dir, "evaluate")[-1], expected)


def eval_images(project: Path) -> np.ndarray:
    spec = {"image": tf.io.FixedLenFeature([8, 8, 1], tf.float32)}
    return np.stack([tf.io.parse_single_example(r, spec)["image"].numpy()
                     for r in tf.data.TFRecordDataset(str(project / "eval.tfrecord"))])


def eval_line(step: int, metrics: dict, left_out=None) -> str:
    """The eval line `train` and `evaluate` print for these metrics (4 significant digits, in its order), and
    `left_out` (examples evaluated, records left out) when the eval set ended in a partial batch."""
    from tpulaunch.run.events import EvalResult, LeftOut
    from tpulaunch.cli.render.run_text import eval_text

    return eval_text(EvalResult(step=step, metrics=metrics, left_out=left_out and LeftOut(*left_out)))


LEFT_OUT_5 = " | over 32 examples: the last 5 records, not a whole batch, left out"  # 37 records at batch 8


# Keras 3's evaluate() of a checkpoint of any builder of the project's (a keras-engine one restored by
# tf.train.Checkpoint; a jax-engine one's arrays on JAX), on records of any declared features and labels.
EVALUATE = textwrap.dedent('''
    import importlib, json, os, sys
    config = json.load(open(sys.argv[1]))
    os.environ["KERAS_BACKEND"] = config["backend"]
    import numpy as np
    import tensorflow as tf
    import keras

    sys.path.insert(0, config["project"])
    module, name = config["builder"].split(":")
    model = getattr(importlib.import_module(module), name)()
    if config["backend"] == "tensorflow":
        tf.train.Checkpoint(model=model).read(config["tf_checkpoint"]).expect_partial()
    else:
        reader = tf.train.load_checkpoint(config["tf_checkpoint"])
        model.set_weights([reader.get_tensor(f"variables/{i}/.ATTRIBUTES/VARIABLE_VALUE")
                           for i in range(len(model.weights))])
    specs = {key: tf.io.FixedLenFeature(spec["shape"], spec.get("dtype", "float32"))
             for key, spec in {**config["features"], **config["labels"]}.items()}
    parsed = [tf.io.parse_single_example(r, specs) for r in tf.data.TFRecordDataset(config["eval"])]
    column = lambda key: np.stack([p[key].numpy() for p in parsed])
    x = {key: column(key) for key in config["features"]}
    y = {key: column(key) for key in config["labels"]}
    y = y if len(y) > 1 else next(iter(y.values()))
    evaluated = model.evaluate(x if len(x) > 1 else next(iter(x.values())), y, batch_size=config["batch_size"],
                               steps=config["steps"], verbose=0, return_dict=True)
    json.dump({k: float(v) for k, v in evaluated.items()}, open(config["out"], "w"))
''')


def keras_evaluate(project: Path, tmp: Path, env: dict, *, builder: str, job: dict, tf_checkpoint: str,
                   backend: str = "tensorflow") -> dict:
    """Keras 3's `evaluate` (on `backend`: the keras engine's TensorFlow, the jax engine's JAX) of `builder`'s model
    holding a checkpoint's weights, over `job`'s eval set at its eval batch and steps."""
    config = _evaluate_config(project, tmp, builder=builder, job=job, tf_checkpoint=tf_checkpoint, backend=backend)
    (tmp / "evaluate.py").write_text(EVALUATE)
    _run_programs(tmp, env, [(tmp / "evaluate.py", tmp / "evaluate.json.config")])
    return json.loads((tmp / "evaluate.json").read_text())


def _evaluate_config(project: Path, tmp: Path, *, builder: str, job: dict, tf_checkpoint: str,
                     backend: str = "tensorflow") -> dict:
    """EVALUATE's config for keras_evaluate's arguments, written to tmp/evaluate.json.config; EVALUATE writes its
    answer to tmp/evaluate.json."""
    config = {"project": str(project), "backend": backend, "builder": builder, "tf_checkpoint": tf_checkpoint,
              "features": job["data"]["features"], "labels": job["data"]["labels"],
              "eval": str(project / job["data"]["eval"]), "batch_size": job["eval"]["batch_size"],
              "steps": job["eval"]["steps"], "out": str(tmp / "evaluate.json")}
    (tmp / "evaluate.json.config").write_text(json.dumps(config))
    return config
