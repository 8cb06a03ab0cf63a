"""`tpulaunch explain` on the keras engine: the standalone Keras + tf.distribute program a job file stands for.

`explain_script(loaded, plan)` returns one Python file that needs only TensorFlow 2.16 or later (with
tf-keras when the job's model is written with it; a Keras 3 model needs only the Keras 3 TensorFlow
brings), and the job's own model code. It is written without importing the job's code, so the same
program serves either Keras: standalone.py takes the optimizer, metrics, losses and precision policy
from the Keras the built model is written with. Its middle is `portable.py` and the keras engine's
`standalone.py` verbatim (`engine/sources.py`): the input pipeline, strategy, training step,
evaluation and checkpoints that `tpulaunch train` runs on this engine. Before it, a generated head
holds the job's values (the plain values `engine/keras/plain.py` passes, each commented with its
job key and line) and imports the job's own code; after it, a short tail does what
`engine/keras/runner.py` does: picks the strategy, builds KerasTraining, restores, trains to each
evaluation boundary and evaluates (or only evaluates).

For a TPUEstimator builder job (`tpulaunch explain --engine keras`) this is the job's migration: the
same job file on Keras + tf.distribute. A `model.model_fn` or `data.input_fn` job has none (those are
TPUEstimator's own functions; the checks refuse them on this engine).

Pure Python: TensorFlow is not imported here.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional, Sequence

from tpulaunch.engine import plain as neutral  # the engine-neutral values: input pipeline, optimizer
from tpulaunch.engine.keras import plain
from tpulaunch.engine.program_parts import (Keys, builder_lines, call, env_reads, files_list, flag_lines,
                                            job_dir_lines, keywords, reference_lines, settings_lines, tpu_lines,
                                            verbatim_lines)
from tpulaunch.engine.sources import program_source
from tpulaunch.job.load import LoadedJob

if TYPE_CHECKING:
    from tpulaunch.plan.build import Plan

STANDALONE = "tpulaunch.engine.keras.standalone"

# The job key each value comes from (besides the engine-neutral ones in engine/plain.py).
SOURCES = {
    **neutral.SOURCES,
    "feature_dims": ("partition",),
    "label_dims": ("partition",),
    "computation_shape": ("tpu", "cores_per_replica"),
    "num_replicas": ("tpu", "type"),
    "given": ("model",),
}

# What a value means, where its job key alone does not say.
NOTES = {
    "features": "per tensor: record key, stored form, per-example shape (None = unknown), dtype",
    "optimizer_args": "over standalone's KERAS_OPTIMIZERS defaults for a named optimizer",
    "feature_dims": "per feature, the dims it is split into over a replica's cores (TPU spatial partitioning; "
                    "None = not split)",
    "label_dims": "per label, the dims it is split into over a replica's cores (None = not split)",
    "computation_shape": "the block of the slice's mesh [x, y, z, devices per chip] one replica occupies",
    "num_replicas": "the slice's cores over tpu.cores_per_replica",
    "save_checkpoints_steps": "a checkpoint every this many steps, and at the end",
    "given": "which of model.loss, model.optimizer and model.metrics the job sets: a model its builder compile()d "
             "keeps its own compile's others",
}


def standalone_source() -> str:
    """portable.py and the keras engine's standalone.py, as the program holds them (`engine.sources.program_source`)."""
    return program_source(STANDALONE)


def explain_script(loaded: LoadedJob, plan: "Plan", *,
                   search_path: Optional[Sequence[str]] = None) -> str:
    """The standalone Keras + tf.distribute program for the (valid) job in `loaded`, on its Plan (the gate's).
    The job's own code is looked up from `search_path` (default: the job file's directory).

    Raises:
        ValueError: the job did not validate (`loaded.job` is None), or it names TPUEstimator's own functions
            (`model.model_fn`, `data.input_fn`), which the keras engine does not run.
    """
    job = loaded.job
    if job is None:
        raise ValueError("the job file has schema problems; run `tpulaunch validate` first")
    if job.model.model_fn or job.data.input_fn:
        key = "model.model_fn" if job.model.model_fn else "data.input_fn"
        raise ValueError(f"{key} is TPUEstimator's own function: the keras engine has no program for it")
    if search_path is None:
        search_path = job.search_path
    at = Keys(loaded)
    on_tpu = plan.on_tpu
    inputs = neutral.input_settings(job)
    optimizer = neutral.optimizer_settings(job)
    training = plain.training_settings(job, plan, use_tpu=on_tpu)
    strategy = plain.strategy_settings(job, plan, use_tpu=on_tpu)
    train_batch = job.train.batch_size if job.train else None
    eval_batch = (job.eval.batch_size or train_batch) if job.eval else None

    lines = [
        "#!/usr/bin/env python3",
        f'"""The Keras + tf.distribute program of job {job.name!r} ({os.path.basename(loaded.file)}), written by '
        "`tpulaunch explain`.",
        "",
        "It needs TensorFlow 2.16 or later (and tf-keras when the model is written with it: pip install tf-keras) and",
        "the job's own model code: a tf-keras or a Keras 3 model, trained with that Keras's optimizer, metrics and",
        "losses. Its middle is tpulaunch/engine/portable.py and tpulaunch/engine/keras/standalone.py verbatim,",
        "the code `tpulaunch train` runs on the keras engine; the values from the job file come first, each",
        "commented with its key and line.",
        "",
        "Run: python {this file} [train|evaluate]    (from anywhere: it runs from the job's directory)",
        "  train (default): " + (
            "resolve the Cloud TPU and train with TPUStrategy, evaluating as the job says,\n"
            "    as `tpulaunch train` does."
            if on_tpu else "train on this machine with tf.distribute (MultiWorkerMirrored when $TF_CONFIG names\n"
                           "    several workers, Mirrored over several GPUs, else one device), evaluating as the\n"
                           "    job says, as `tpulaunch train` does."),
        "  evaluate: evaluate the latest checkpoint in MODEL_DIR, as `tpulaunch evaluate` does.",
        "Checkpoints are object-based (tf.train.Checkpoint): a TPUEstimator's checkpoints in MODEL_DIR cannot be",
        "resumed; train into a new MODEL_DIR.",
        '"""',
        "",
        "import os",
        "",
        "# tf.keras must be tf-keras (Keras 2), as a builder written with `from tensorflow import keras` expects: set",
        "# before TensorFlow is imported. `import keras` is Keras 3 either way.",
        'os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")',
        "",
        "import argparse  # noqa: E402",
        "import sys  # noqa: E402",
        "import types  # noqa: E402",
        "",
        *job_dir_lines(loaded),
        "# ------------------------------------------------------------------------------------ job values",
        "",
        f"USE_TPU = {on_tpu!r}  # {'tpu: section present' if on_tpu else 'no tpu: section: runs locally'}",
        f"TRAIN_FILES = {files_list(job.data.train)!r}  # {at('data', 'train')}",
        f"EVAL_FILES = {files_list(job.data.eval)!r}  # {at('data', 'eval')}",
        f"TRAIN_STEPS = {job.train.steps if job.train else None!r}  # {at('train', 'steps')}: train until this global step",
        f"TRAIN_BATCH_SIZE = {train_batch!r}  # {at('train', 'batch_size')}: global, over all replicas",
        f"EVAL_STEPS = {job.eval.steps if job.eval else None!r}  # {at('eval', 'steps')}",
        f"EVAL_BATCH_SIZE = {eval_batch!r}  # {at('eval', 'batch_size')}: global (default: train.batch_size)",
        f"EVAL_EVERY_STEPS = {job.eval.every_steps if job.eval else None!r}  # {at('eval', 'every_steps')}",
        (f"STEPS_PER_CALL = {job.tpu.iterations_per_loop!r}  # {at('tpu', 'iterations_per_loop')}: steps per "
         "compiled call on the TPU" if on_tpu else "STEPS_PER_CALL = 1  # no TPU: one step per call"),
        f"LOG_EVERY_STEPS = {neutral.log_every_steps(job)!r}  # {at('run', 'log_every_steps')}: a progress line every "
        "this many steps",
        f"SEED = {job.run.seed!r}  # {at('run', 'seed')}",
        f"PRECISION = {job.model.precision!r}  # {at('model', 'precision')}",
        "",
    ]
    written: dict = {"seed": job.run.seed}  # SEED, above
    for title, settings in (("make_dataset_fn", inputs), ("keras_optimizer_factory", optimizer),
                            ("KerasTraining", training), ("make_strategy", strategy)):
        if settings:
            lines += settings_lines(f"keywords of {title} (below)", settings, at, written, NOTES, SOURCES)
    if on_tpu:
        lines += tpu_lines(job, at)
    lines += ["# ------------------------------------------------------------------------ the job's own code", ""]
    lines += reference_lines(job)
    lines += builder_lines(job, at, search_path, optimizers="KERAS_OPTIMIZERS")
    lines.append("")
    lines += flag_lines(job, at)
    lines += verbatim_lines(STANDALONE, "the input pipeline, strategy, training step, evaluation and checkpoints "
                            "`tpulaunch train` runs on the keras engine", standalone_source(),
                            _tail(inputs, optimizer, training, strategy, on_tpu))
    return env_reads("\n".join(lines) + "\n", loaded)


def _job_strategy(on_tpu: bool, strategy: dict) -> str:
    """job_strategy(): TPUStrategy on the job's Cloud TPU, else what make_strategy finds on this machine."""
    if not on_tpu:
        return '''def job_strategy():
    """MultiWorkerMirrored when $TF_CONFIG names several workers, Mirrored over several GPUs, else one device."""
    return make_strategy(use_tpu=False)'''
    return f'''def job_strategy():
    """TPUStrategy on the job's Cloud TPU, a replica on each block of COMPUTATION_SHAPE (make_strategy)."""
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=TPU_NAME, zone=TPU_ZONE, project=TPU_PROJECT)
    return {call("make_strategy", ["use_tpu=True", "cluster_resolver=resolver", *keywords(strategy)], 4)}'''


def _tail(inputs: dict, optimizer: dict, training: dict, strategy: dict, on_tpu: bool) -> str:
    """job_strategy, job_training, job_dataset and main(): what runner.py does with the functions above."""
    optimizer_args = ", ".join(name.upper() for name in optimizer)
    return f'''# Running: what `tpulaunch train` and `tpulaunch evaluate` do on the keras engine with the functions above.


{_job_strategy(on_tpu, strategy)}


def job_training(strategy):
    """KerasTraining: the job's model, optimizer and global step under `strategy`, and their checkpoints."""
    replicas = strategy.num_replicas_in_sync
    for name, batch in (("train", TRAIN_BATCH_SIZE), ("eval", EVAL_BATCH_SIZE)):
        if batch and batch % replicas:
            raise SystemExit(f"{{name}}.batch_size {{batch}} does not divide over the {{replicas}} replicas of "
                             f"{{type(strategy).__name__}}: use a multiple of {{replicas}}")
    if SEED is not None:
        set_random_seed(SEED)
    policy = policy_name(PRECISION, use_tpu=USE_TPU)
    set_precision_policy(policy)  # in the Keras the model's code imported (KerasTraining checks it took)
    make_optimizer = keras_optimizer_factory({optimizer_args}, make=custom_optimizer)
    training = {call("KerasTraining", ["build_model", "BUILDER_KWARGS", "strategy=strategy", "policy=policy",
                                       "make_optimizer=make_optimizer", "custom_loss=custom_loss",
                                       "custom_losses=CUSTOM_LOSSES", "custom_metrics=CUSTOM_METRICS",
                                       *keywords(training)], 4)}
    if training.compile_note:  # a compiled model, or one with its own train_step: what it trains with
        print(training.compile_note, flush=True)
    return training


def job_dataset(keras_training, mode, skip=0):
    """make_dataset_fn on the mode's files, one pipeline per worker or TPU host, distributed over the replicas (each
    batch through the model's preprocessor, where it has one), after what `skip` steps trained on (a resumed
    training's step)."""
    training = mode == "train"
    try:
        files = expand_files(TRAIN_FILES if training else EVAL_FILES)
    except FilesError as exc:
        raise SystemExit(f"data.{{mode}}: {{exc}}") from None
    dataset_fn = {call("make_dataset_fn", ["files", "training=training", "use_tpu=USE_TPU", *keywords(inputs)], 4)}
    return distributed_dataset(keras_training.strategy, dataset_fn, TRAIN_BATCH_SIZE if training else EVAL_BATCH_SIZE,
                               keras_training.preprocess, skip_steps=skip)


def job_evaluation(training):
    """The metrics of the current weights on EVAL_STEPS batches of the eval files."""
    per_replica = EVAL_BATCH_SIZE // training.strategy.num_replicas_in_sync
    return training.evaluate(job_dataset(training, "eval"), EVAL_STEPS, per_replica_batch=per_replica)


def refuse_estimator_checkpoints():
    """TPUEstimator's name-based checkpoints in MODEL_DIR cannot be restored into this program's objects."""
    path = tf.train.latest_checkpoint(MODEL_DIR)
    names = {{name for name, _ in tf.train.list_variables(path)}} if path else set()
    if "global_step" in names and "global_step/.ATTRIBUTES/VARIABLE_VALUE" not in names:
        raise SystemExit(f"{{MODEL_DIR}} holds TPUEstimator checkpoints ({{os.path.basename(path)}}), which this "
                         "program cannot resume: set MODEL_DIR to another directory")


def progress(start):
    """on_steps for train_loop: a line every LOG_EVERY_STEPS steps (and at the last)."""
    last = [start]

    def on_steps(step, loss, _input_wait):
        if step // LOG_EVERY_STEPS > last[0] // LOG_EVERY_STEPS or step == TRAIN_STEPS:
            print(f"step {{step}}/{{TRAIN_STEPS}} | loss {{loss:.4g}}", flush=True)
        last[0] = step

    return on_steps


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=("train", "evaluate"), default="train")
    mode = parser.parse_args(argv).mode
    evaluates = bool(EVAL_STEPS and EVAL_FILES)
    refuse_estimator_checkpoints()
    strategy = job_strategy()
    training = job_training(strategy)
    if mode == "evaluate":
        if not evaluates:
            raise SystemExit("the job has nothing to evaluate: it needs an eval: section and data.eval")
        if tf.train.latest_checkpoint(MODEL_DIR) is None:
            raise SystemExit(f"no checkpoint in {{MODEL_DIR}} to evaluate: train first")
        training.restore()
        print(job_evaluation(training), flush=True)
        return
    if not (TRAIN_STEPS and TRAIN_FILES):
        raise SystemExit("the job has nothing to train on: it needs a train: section and data.train")
    step = training.restore()
    if step >= TRAIN_STEPS:
        print(f"already at step {{step}} of {{TRAIN_STEPS}} in {{MODEL_DIR}}; nothing to train")
    elif step:
        print(f"resumed from step {{step}} ({{MODEL_DIR}})")
    iterator = None

    def train_to(boundary):
        nonlocal iterator
        if iterator is None:
            iterator = iter(job_dataset(training, "train", skip=training.step))
        return train_loop(training, iterator, until=boundary, steps_per_call=STEPS_PER_CALL,
                          on_steps=progress(training.step),
                          on_checkpoint=lambda at, path: print(f"checkpoint {{path}}"))

    def evaluate(_step):
        print(job_evaluation(training), flush=True)

    # The order `tpulaunch train` trains and evaluates in (portable.py, above).
    train_and_evaluate(step, TRAIN_STEPS, EVAL_EVERY_STEPS if evaluates else None, train_to=train_to,
                       evaluate=evaluate if evaluates else None)


if __name__ == "__main__":
    main()'''


__all__ = ["explain_script", "standalone_source"]
