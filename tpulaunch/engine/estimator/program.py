"""`tpulaunch explain`: the standalone TPUEstimator program a job file stands for.

`explain_script(loaded)` returns one Python file that needs only TensorFlow 2.15 (and the job's own
model code). Its middle is `portable.py` and `standalone.py` verbatim (`engine/sources.py`): the input pipeline, model_fn and estimator
settings that `tpulaunch train` runs. Before it, a generated head holds the job's values (the same
plain values the engine passes, from plain.py, each commented with its job key and line) and imports
the job's own code; after it, a short tail builds the TPUEstimator and trains (with evaluations) or
evaluates, as `tpulaunch train` and `tpulaunch evaluate` do.

Pure Python: TensorFlow is not imported here.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Sequence

from tpulaunch.engine import plain as neutral
from tpulaunch.engine.estimator import plain
from tpulaunch.engine.estimator.params import mode_params
from tpulaunch.engine.program_parts import (Keys, builder_lines, call, call_lines, env_reads, files_list, flag_lines,
                                            import_line, input_fn_lines, job_dir_lines, keywords, reference_lines,
                                            settings_lines, tpu_lines, verbatim_lines)
from tpulaunch.engine.sources import program_source
from tpulaunch.job.load import LoadedJob

if TYPE_CHECKING:
    from tpulaunch.plan.build import Plan

STANDALONE = "tpulaunch.engine.estimator.standalone"


def standalone_source() -> str:
    """portable.py and standalone.py, as the program holds them (`engine.sources.program_source`)."""
    return program_source(STANDALONE)


def _own_code(job, at, search_path: Sequence[str]) -> list:
    spec = job.model
    lines = ["# ------------------------------------------------------------------------ the job's own code", ""]
    lines += reference_lines(job)
    if isinstance(spec.model_fn, str):
        lines += [f"# {at('model', 'model_fn')}: the job's own TPUEstimator model_fn, used unchanged.",
                  import_line(spec.model_fn, "user_model_fn")]
    elif spec.model_fn is not None:
        lines += [f"# {at('model', 'model_fn')}: the job's own TPUEstimator model_fn, made as the program makes it."]
        lines += call_lines(spec.model_fn, "user_model_fn", at("model", "model_fn"))
    else:
        lines += builder_lines(job, at, search_path, optimizers="V1_OPTIMIZERS")
    if job.data.input_fn:
        lines += input_fn_lines(job.data, at)
    return lines + [""]


# ------------------------------------------------------------------------------------ the job values

# What a value means, where its job key alone does not say.
_NOTES = {
    "features": "per tensor: record key, stored form, per-example shape (None = unknown), dtype",
    "train_batch_size": "global, over all replicas",
    "eval_batch_size": "global, over all replicas",
    "summary_steps": f"TensorBoard scalars every this many steps (default {plain.DEFAULT_SUMMARY_STEPS})",
    "log_every_steps": f"else iterations_per_loop on a TPU, else {neutral.DEFAULT_LOG_EVERY_STEPS}",
    "optimizer_args": "over standalone's OPTIMIZER_DEFAULTS for a named optimizer",
    "input_partition_dims": "[features dims, labels dims], mirroring the structure input_fn yields (a dict for "
                            "several tensors; None = replicated to every core of a replica)",
}


def explain_script(loaded: LoadedJob, plan: "Plan", *, search_path: Sequence[str] = ()) -> str:
    """The standalone script for the (valid) job in `loaded`, on its Plan (the gate's).

    A job with its own `model.model_fn` gets it unchanged, with `model.params` as TPUEstimator's
    `params=`; a job with its own `data.input_fn` gets its function for each mode; either way the
    job's `flags:` are set first. Only the values the program uses are written.

    Raises:
        ValueError: the job did not validate (`loaded.job` is None).
    """
    job = loaded.job
    if job is None:
        raise ValueError("the job file has schema problems; run `tpulaunch validate` first")
    at = Keys(loaded)
    on_tpu = plan.on_tpu
    own_model_fn, own_input_fn = bool(job.model.model_fn), bool(job.data.input_fn)
    inputs = {} if own_input_fn else neutral.input_settings(job)
    optimizer = {} if own_model_fn else neutral.optimizer_settings(job)
    model = {} if own_model_fn else plain.model_settings(job)
    config = plain.config_settings(job, plan, use_tpu=on_tpu)
    estimator = plain.estimator_settings(job, plan)
    notes = {"params": ("TPUEstimator's params=: model_fn and every input_fn get these keys beside batch_size "
                        "(and use_tpu in model_fn, context on a TPU)" if own_model_fn else
                        "None: a builder job's model.params are BUILDER_KWARGS, not TPUEstimator's params")}
    if not on_tpu:
        notes["iterations_per_loop"] = "no TPU: one step per session run"
    elif not config["num_cores_per_replica"]:
        notes["num_cores_per_replica"] = "1 core per replica = no model parallelism"

    written: dict = {}
    lines = [
        "#!/usr/bin/env python3",
        f'"""The TPUEstimator program of job {job.name!r} ({os.path.basename(loaded.file)}), written by `tpulaunch explain`.',
        "",
        "It needs only TensorFlow 2.15 (tensorflow-estimator 2.15) and the job's own model code. Its middle is",
        "tpulaunch/engine/portable.py and tpulaunch/engine/estimator/standalone.py verbatim, the code",
        "`tpulaunch train` runs; the values from the job file come first, each commented with its key and line.",
        "",
        "Run: python {this file} [train|evaluate]    (from anywhere: it runs from the job's directory)",
        "  train (default): " + (
            "resolve the Cloud TPU, train and evaluate, as `tpulaunch train` does."
            if on_tpu else "train on this machine's CPU/GPU with TPUEstimator(use_tpu=False), and evaluate,"
                           "\n    as `tpulaunch train` does."),
        "  evaluate: evaluate the latest checkpoint in MODEL_DIR, as `tpulaunch evaluate` does.",
        '"""',
        "",
        "import argparse",
        "import os",
        "import sys",
        "import types",
        "",
        *job_dir_lines(loaded),
        "# ------------------------------------------------------------------------------------ job values",
        "",
        f"USE_TPU = {on_tpu!r}  # {'tpu: section present' if on_tpu else 'no tpu: section: runs locally'}",
    ]
    if not own_input_fn:
        lines += [f"TRAIN_FILES = {files_list(job.data.train)!r}  # {at('data', 'train')}",
                  f"EVAL_FILES = {files_list(job.data.eval)!r}  # {at('data', 'eval')}"]
    lines += [
        f"TRAIN_STEPS = {job.train.steps if job.train else None!r}  # {at('train', 'steps')}: train until this global step",
        f"EVAL_STEPS = {job.eval.steps if job.eval else None!r}  # {at('eval', 'steps')}",
        f"EVAL_EVERY_STEPS = {job.eval.every_steps if job.eval else None!r}  # {at('eval', 'every_steps')}",
    ]
    if not own_model_fn:
        lines.append(f"PRECISION = {job.model.precision!r}  # {at('model', 'precision')}")
    lines.append("")
    for title, settings in (("make_dataset_fn", inputs), ("optimizer_factory and make_model_fn", {**optimizer, **model}),
                            ("run_config and tpu_estimator", {**config, **estimator})):
        if settings:
            lines += settings_lines(f"keywords of {title} (below)", settings, at, written, {**_NOTES, **notes},
                                    plain.SOURCES)
    eval_params = mode_params(job, "eval")
    if eval_params:
        lines += [f"# {at('eval', 'params')}: over PARAMS in the graphs that do not train (evaluation, export), as",
                  "# a TPUEstimator program makes its evaluation estimator with other params",
                  f"EVAL_PARAMS = {eval_params!r}", ""]
    if on_tpu:
        lines += tpu_lines(job, at)
    lines += _own_code(job, at, search_path)
    lines += flag_lines(job, at)
    lines += verbatim_lines(STANDALONE, "the input pipeline, model_fn and estimator settings `tpulaunch train` runs",
                            standalone_source(),
                            _tail(inputs, optimizer, model, config, estimator, eval_params=bool(eval_params)))
    return env_reads("\n".join(lines) + "\n", loaded)


def _job_model_fn(optimizer: dict, model: dict) -> str:
    """job_model_fn(): the job's own model_fn (`model` empty), else make_model_fn around its builder."""
    if not model:
        return '''def job_model_fn():
    """The job's own model_fn, unchanged: TPUEstimator hands it PARAMS beside the keys it sets itself."""
    return user_model_fn'''
    return f'''def job_model_fn():
    """make_model_fn around the job's builder."""
    policy = policy_name(PRECISION, use_tpu=USE_TPU)
    tf.keras.mixed_precision.set_global_policy(policy)
    make_optimizer = {call("optimizer_factory", [*keywords(optimizer), "make=custom_optimizer"], 4)}
    return {call("make_model_fn", ["build_model", "BUILDER_KWARGS", "use_tpu=USE_TPU", "policy=policy",
                                    "make_optimizer=make_optimizer", "custom_loss=custom_loss",
                                    "custom_losses=CUSTOM_LOSSES",
                                    "custom_metrics=CUSTOM_METRICS", *keywords(model)], 4)}'''


def _job_input_fn(inputs: dict) -> str:
    """job_input_fn(mode): the job's own input_fn for the mode (`inputs` empty), else make_dataset_fn on its files."""
    if not inputs:
        return '''def job_input_fn(mode):
    """The job's own input_fn for the mode, unchanged; None when it has none. TPUEstimator calls it with
    params (PARAMS beside batch_size), and with `mode` and `config` when it names them."""
    return INPUT_FNS.get(mode)'''
    return f'''def job_input_fn(mode):
    """make_dataset_fn on the mode's files, called as TPUEstimator calls an input_fn(params); None when the job
    has none."""
    training = mode == "train"
    patterns = TRAIN_FILES if training else EVAL_FILES
    if not patterns:
        return None
    try:
        files = expand_files(patterns)
    except FilesError as exc:
        raise SystemExit(f"data.{{mode}}: {{exc}}") from None
    dataset_fn = {call("make_dataset_fn", ["files", "training=training", "use_tpu=USE_TPU", *keywords(inputs)], 4)}
    return params_input_fn(dataset_fn, training=training, segment_steps=EVAL_EVERY_STEPS if EVAL_FILES else None)'''


def _tail(inputs: dict, optimizer: dict, model: dict, config: dict, estimator: dict, *, eval_params: bool) -> str:
    """make_estimator, the input_fns and main(): what runner.py does with the functions above (`eval_params`: the
    evaluation gets an estimator of its own, with EVAL_PARAMS over PARAMS)."""
    arguments = keywords(estimator)
    if eval_params:
        arguments = ["params=params" if a == "params=PARAMS" else a for a in arguments]
    evaluator = "make_estimator({**PARAMS, **EVAL_PARAMS})" if eval_params else "estimator"
    return f'''# Running: what `tpulaunch train` and `tpulaunch evaluate` do with the functions above.


{_job_model_fn(optimizer, model)}


def make_estimator({"params=PARAMS" if eval_params else ""}):
    resolver = None
    if USE_TPU:
        from tensorflow.python.distribute.cluster_resolver import TPUClusterResolver

        resolver = TPUClusterResolver(tpu=TPU_NAME, zone=TPU_ZONE, project=TPU_PROJECT)
    config = {call("run_config", ["use_tpu=USE_TPU", "cluster_resolver=resolver", *keywords(config)], 4)}
    return {call("tpu_estimator", ["job_model_fn()", "config", "use_tpu=USE_TPU", *arguments], 4)}


{_job_input_fn(inputs)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=("train", "evaluate"), default="train")
    mode = parser.parse_args(argv).mode
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    estimator = make_estimator()
    evaluator = {evaluator}
    eval_input = job_input_fn("eval") if EVAL_STEPS else None
    if mode == "evaluate":
        if eval_input is None:
            raise SystemExit("the job has nothing to evaluate: it needs an eval: section and its data")
        print(evaluator.evaluate(eval_input, steps=EVAL_STEPS))
        return
    train_input = job_input_fn("train") if TRAIN_STEPS else None
    if train_input is None:
        raise SystemExit("the job has nothing to train on: it needs a train: section and its data")
    checkpoint = tf.train.latest_checkpoint(MODEL_DIR)
    step = int(tf.train.load_variable(checkpoint, "global_step")) if checkpoint else 0

    def train_to(boundary):
        estimator.train(train_input, max_steps=boundary)
        return boundary

    def evaluate(_step):
        print(evaluator.evaluate(eval_input, steps=EVAL_STEPS))

    # The order `tpulaunch train` trains and evaluates in (portable.py, above).
    train_and_evaluate(step, TRAIN_STEPS, EVAL_EVERY_STEPS if eval_input else None, train_to=train_to,
                       evaluate=evaluate if eval_input else None)


if __name__ == "__main__":
    main()'''


__all__ = ["explain_script", "standalone_source"]
