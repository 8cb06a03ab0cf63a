"""`tpulaunch explain` on the jax engine: the standalone Keras 3 on JAX program a job file stands for.

`explain_script(loaded, plan)` returns one Python file that needs only Keras 3, JAX and TensorFlow (its tf.data
reads the records) and the job's own model code. Its middle is `portable.py` and the jax engine's `standalone.py`
verbatim (`engine/sources.py`): the input pipeline, the compiled model data-parallel over this machine's devices,
its steps, evaluation and checkpoints that `tpulaunch train` runs on this engine. Before it, a generated head sets
Keras's backend, holds the job's values (the plain values `engine/jax/plain.py` passes, each commented with its job
key and line) and imports the job's own code; after it, a short tail does what `engine/jax/runner.py` does: builds
JaxTraining, restores, trains to each evaluation boundary with a checkpoint every save_checkpoints_steps, and
evaluates (or only evaluates).

Pure Python: neither TensorFlow, Keras nor the job's code is imported here.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tpulaunch.engine import plain as neutral  # the engine-neutral values: the input pipeline
from tpulaunch.engine.jax.plain import training_settings
from tpulaunch.engine.program_parts import (Keys, builder_lines, call, env_reads, files_list, flag_lines,
                                            job_dir_lines, keywords, reference_lines, settings_lines, verbatim_lines)
from tpulaunch.engine.sources import program_source
from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.load import LoadedJob

if TYPE_CHECKING:
    from tpulaunch.plan.build import Plan

STANDALONE = "tpulaunch.engine.jax.standalone"

# The job key each value comes from (besides the engine-neutral ones in engine/plain.py).
SOURCES = {**neutral.SOURCES, "example_shapes": ("data",), "given": ("model",), "label_names": ("data", "labels")}

# What a value means, where its job key alone does not say.
NOTES = {
    "features": "per tensor: record key, stored form, per-example shape (None = unknown), dtype",
    "optimizer": "the Keras optimizer class it names (momentum: SGD with momentum 0.9)",
    "optimizer_args": "the class's arguments for the name, then model.optimizer.args",
    "loss": "a Keras loss by name, or per label (None: the job's own, custom_loss below)",
    "example_shapes": "the features' and the label's (several: by name) per-example shapes and dtypes: the model is "
                      "built on zeros of them before the first step (a subclassed model's variables, a restore)",
    "label_names": "several labels, in declared order: each scored by its own output, as compile() scores them",
    "given": "which of model.loss, model.optimizer and model.metrics the job sets: a model its builder compile()d "
             "keeps its own compile's others",
}


def explain_script(loaded: LoadedJob, plan: "Plan") -> str:
    """The standalone Keras 3 on JAX program for the (valid) job in `loaded`.

    Raises:
        TpuLaunchError: a job this program would not train as `tpulaunch train` does (a tpu: slice, partition:).
    """
    job = loaded.job
    if job is None:
        raise ValueError("the job file has schema problems; run `tpulaunch validate` first")
    for section, what in (("tpu", "on a TPU slice"), ("partition", "split spatially (partition:)")):
        if loaded.section(section) is not None:
            raise TpuLaunchError(f"the jax engine's program trains on this machine's devices, data-parallel; this "
                                 f"job trains {what}, which its program does not do yet",
                                 hint=f"explain it without {section}: (--set {section}=null), or with --engine keras")
    at = Keys(loaded)
    inputs = neutral.input_settings(job)
    training = training_settings(job)
    train_batch = job.train.batch_size if job.train else None
    eval_batch = (job.eval.batch_size or train_batch) if job.eval else None

    lines = [
        "#!/usr/bin/env python3",
        f'"""The Keras 3 on JAX program of job {job.name!r} ({os.path.basename(loaded.file)}), written by '
        "`tpulaunch explain`.",
        "",
        "It needs Keras 3, JAX and TensorFlow (its tf.data reads the records), and the job's own model code: a Keras 3",
        "model, compiled for XLA and trained data-parallel over this machine's devices (keras.distribution.DataParallel).",
        "Its middle is tpulaunch/engine/portable.py and tpulaunch/engine/jax/standalone.py verbatim, the code",
        "`tpulaunch train` runs on the jax engine; the values from the job file come first, each commented with its",
        "key and line.",
        "",
        "Run: python {this file} [train|evaluate]    (from anywhere: it runs from the job's directory)",
        "  train (default): train on this machine's devices, evaluating as the job says, as `tpulaunch train` does.",
        "    XLA_FLAGS=--xla_force_host_platform_device_count=8 splits a CPU into 8 devices.",
        "  evaluate: evaluate the latest checkpoint in MODEL_DIR, as `tpulaunch evaluate` does.",
        '"""',
        "",
        "import importlib.util",
        "import os",
        "",
        "# Keras chooses its backend once, when it (or TensorFlow, which loads part of it) is first imported: JAX, set",
        "# before anything imports either.",
        'os.environ["KERAS_BACKEND"] = "jax"',
        "# Where tf-keras is installed, tf.keras is tf-keras (Keras 2), as under tpulaunch: a builder written with",
        "# tf.keras is told apart from a Keras 3 one (`import keras`), the one kind this program trains. Without it,",
        "# left unset: tf.keras would have nothing to load, and KerasHub (through tensorflow_text) would fail.",
        'if importlib.util.find_spec("tf_keras") is not None:',
        '    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")',
        "",
        "import argparse  # noqa: E402",
        "import math  # noqa: E402",
        "import sys  # noqa: E402",
        "import types  # noqa: E402",
        "",
        *job_dir_lines(loaded),
        "# ------------------------------------------------------------------------------------ job values",
        "",
        f"TRAIN_FILES = {files_list(job.data.train)!r}  # {at('data', 'train')}",
        f"EVAL_FILES = {files_list(job.data.eval)!r}  # {at('data', 'eval')}",
        f"TRAIN_STEPS = {job.train.steps if job.train else None!r}  # {at('train', 'steps')}: train until this global step",
        f"TRAIN_BATCH_SIZE = {train_batch!r}  # {at('train', 'batch_size')}: global, split over the devices",
        f"EVAL_STEPS = {job.eval.steps if job.eval else None!r}  # {at('eval', 'steps')}",
        f"EVAL_BATCH_SIZE = {eval_batch!r}  # {at('eval', 'batch_size')}: global (default: train.batch_size)",
        f"EVAL_EVERY_STEPS = {job.eval.every_steps if job.eval else None!r}  # {at('eval', 'every_steps')}",
        f"SAVE_CHECKPOINTS_STEPS = {job.run.save_checkpoints_steps!r}  # {at('run', 'save_checkpoints_steps')}: a "
        "checkpoint every this many steps, and at the end",
        f"LOG_EVERY_STEPS = {neutral.log_every_steps(job)!r}  # {at('run', 'log_every_steps')}: a progress line every "
        "this many steps",
        "",
        *_precision_lines(job, at),
    ]
    written: dict = {}
    for title, settings in (("make_dataset_fn", inputs), ("JaxTraining", training)):
        lines += settings_lines(f"keywords of {title} (below)", settings, at, written, NOTES, SOURCES)
    lines += ["# ------------------------------------------------------------------------ the job's own code", ""]
    lines += reference_lines(job)
    lines += builder_lines(job, at, search_path=job.search_path, optimizers="the Keras optimizer classes")
    lines.append("")
    lines += flag_lines(job, at)
    lines += verbatim_lines(STANDALONE, "the input pipeline, the model compiled on JAX, its steps, evaluation and "
                            "checkpoints `tpulaunch train` runs on the jax engine", program_source(STANDALONE),
                            _tail(inputs, training))
    return env_reads("\n".join(lines) + "\n", loaded)


def _precision_lines(job, at) -> list:
    """bfloat16: Keras 3's policy, set before the model is built, as `engine/jax/training.py` sets it for train."""
    if job.model.precision != "bfloat16":
        return []
    return ["import keras  # noqa: E402", "",
            f'keras.mixed_precision.set_global_policy("mixed_bfloat16")  # {at("model", "precision")}: float32 '
            "weights, bfloat16 compute", ""]


def _tail(inputs: dict, training: dict) -> str:
    """job_training, job_batches, job_evaluation and main(): what runner.py does with the functions above."""
    return f'''# Running: what `tpulaunch train` and `tpulaunch evaluate` do on the jax engine with the functions above.


def job_training():
    """JaxTraining: the job's model compiled on JAX over this machine's devices, and its checkpoints."""
    try:
        training = {call("JaxTraining", ["build_model", "BUILDER_KWARGS", "custom_loss=custom_loss",
                                          *keywords(training)], 8)}
    except (NotKeras3Model, ImportError) as exc:  # a tf.keras model, or tf.keras without tf-keras installed
        if isinstance(exc, ImportError) and "Keras cannot be imported" not in str(exc):
            raise
        raise SystemExit(f"the model builder: {{exc}}; this program trains Keras 3 models (`import keras`)") from None
    devices = training.devices
    for name, batch in (("train", TRAIN_BATCH_SIZE), ("eval", EVAL_BATCH_SIZE)):
        if batch and batch % len(devices):  # DataParallel splits each batch evenly over them
            raise SystemExit(f"{{name}}.batch_size {{batch}} does not divide over this machine's {{len(devices)}} "
                             f"devices: use a multiple of {{len(devices)}}")
    print(f"data-parallel over {{len(devices)}} {{devices[0].platform}} device{{'s' if len(devices) > 1 else ''}}",
          flush=True)
    if training.compile_note:  # a model its builder compile()d: what the job replaced of it
        print(training.compile_note, flush=True)
    return training


def job_batches(mode, skip=0):
    """The mode's batches (global batch size) as NumPy, read by make_dataset_fn from the mode's files, after the first
    `skip` (a resumed training's: those it trained on)."""
    training = mode == "train"
    try:
        files = expand_files(TRAIN_FILES if training else EVAL_FILES)
    except FilesError as exc:
        raise SystemExit(f"data.{{mode}}: {{exc}}") from None
    dataset_fn = {call("make_dataset_fn", ["files", "training=training", "use_tpu=False", *keywords(inputs)], 4)}
    return numpy_batches(dataset_fn, TRAIN_BATCH_SIZE if training else EVAL_BATCH_SIZE, skip)


def job_evaluation(training):
    """The loss and metrics of the current weights on EVAL_STEPS batches of the eval files."""
    return {{**training.evaluate(job_batches("eval"), EVAL_STEPS), "global_step": training.step}}


def restored(training):
    """MODEL_DIR's latest checkpoint restored (0: none); a checkpoint of other variables stops the program."""
    try:
        return training.restore()
    except (AssertionError, ValueError, tf.errors.OpError) as exc:
        raise SystemExit(f"{{tf.train.latest_checkpoint(MODEL_DIR)}} does not hold this model's variables as this "
                         f"program saves them ({{type(exc).__name__}}): set MODEL_DIR to another directory") from None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=("train", "evaluate"), default="train")
    mode = parser.parse_args(argv).mode
    evaluates = bool(EVAL_STEPS and EVAL_FILES)
    training = job_training()
    if mode == "evaluate":
        if not evaluates:
            raise SystemExit("the job has nothing to evaluate: it needs an eval: section and data.eval")
        if tf.train.latest_checkpoint(MODEL_DIR) is None:
            raise SystemExit(f"no checkpoint in {{MODEL_DIR}} to evaluate: train first")
        restored(training)
        print(job_evaluation(training), flush=True)
        return
    if not (TRAIN_STEPS and TRAIN_FILES):
        raise SystemExit("the job has nothing to train on: it needs a train: section and data.train")
    step = restored(training)
    if step >= TRAIN_STEPS:
        print(f"already at step {{step}} of {{TRAIN_STEPS}} in {{MODEL_DIR}}; nothing to train")
    elif step:
        print(f"resumed from step {{step}} ({{MODEL_DIR}})")
    batches = None

    def train_to(until):
        """Steps to global step `until`, a checkpoint every SAVE_CHECKPOINTS_STEPS and at `until`."""
        nonlocal batches
        if batches is None:
            batches = job_batches("train", skip=training.step)
        while training.step < until:
            features, labels = next(batches)
            loss = training.train_step(features, labels)
            if not math.isfinite(loss):
                raise SystemExit(f"step {{training.step}}: the loss is {{loss}}; no checkpoint of this step is saved")
            if training.step % LOG_EVERY_STEPS == 0 or training.step == TRAIN_STEPS:
                print(f"step {{training.step}}/{{TRAIN_STEPS}} | loss {{loss:.4g}}", flush=True)
            if training.step % SAVE_CHECKPOINTS_STEPS == 0 or training.step == until:
                print(f"checkpoint {{training.save()}}", flush=True)
        return training.step

    def evaluate(_step):
        print(job_evaluation(training), flush=True)

    # The order `tpulaunch train` trains and evaluates in (portable.py, above).
    train_and_evaluate(step, TRAIN_STEPS, EVAL_EVERY_STEPS if evaluates else None, train_to=train_to,
                       evaluate=evaluate if evaluates else None)


if __name__ == "__main__":
    main()'''


__all__ = ["explain_script"]
