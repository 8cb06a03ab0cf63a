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
import pprint
import textwrap
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

from tpulaunch.engine.estimator import plain
from tpulaunch.engine.sources import module_source, program_source
from tpulaunch.engine.estimator.flags import job_import_paths
from tpulaunch.job.builder_args import builder_kwargs
from tpulaunch.job.load import LoadedJob
from tpulaunch.job.schema import INPUT_MODES

if TYPE_CHECKING:
    from tpulaunch.plan.build import Plan

STANDALONE = "tpulaunch.engine.estimator.standalone"


def standalone_source() -> str:
    """portable.py and standalone.py, as the program holds them (`engine.sources.program_source`)."""
    return program_source(STANDALONE)


class _Keys:
    """Where a job value came from: 'tpu.cores_per_replica (job.yaml:22)', '(--set)' or '(default)'."""

    def __init__(self, loaded: LoadedJob):
        self.loaded = loaded
        self.base = os.path.basename(loaded.file)

    def __call__(self, *path: Any) -> str:
        marks = self.loaded.marks
        key = ".".join(str(p) for p in path)
        source, mark = marks.locate(tuple(path))
        if source != marks.file:  # set (or inside a mapping set) on the command line
            return f"{key} ({source})"
        if tuple(path) in marks.values or tuple(path) in marks.keys:
            return f"{key} ({self.base}:{mark.line})"
        return f"{key} (default)"


# ------------------------------------------------------------------------------- the job's own code

# The reference models shipped with tpulaunch: a script that uses one gets a copy of its source, so
# it runs without tpulaunch installed.
REFERENCE_PACKAGE = "tpulaunch.models."


def _import_line(spec: str, alias: str) -> str:
    module, _, attr = spec.partition(":")
    if module.startswith(REFERENCE_PACKAGE):
        return f"{alias} = {_reference_name(module)}.{attr}"
    if "." in attr:  # module:Class.method
        head, rest = attr.split(".", 1)
        return f"from {module} import {head} as _{alias}_owner\n{alias} = _{alias}_owner.{rest}"
    return f"from {module} import {attr} as {alias}"


def _reference_name(module: str) -> str:
    return "_" + module[len(REFERENCE_PACKAGE):].replace(".", "_")


def _reference_blocks(specs: Sequence[str]) -> list:
    """For each reference model module the job names, its source as a module object in the script."""
    lines: list = []
    seen: set = set()
    for spec in specs:
        module = spec.partition(":")[0]
        if not module.startswith(REFERENCE_PACKAGE) or module in seen:
            continue
        seen.add(module)
        source = module_source(module)
        name = _reference_name(module)
        private = "reference_models." + module[len(REFERENCE_PACKAGE):]  # never shadows an installed tpulaunch
        # Verbatim in a raw string, so it reads as the module; repr() where that could not round-trip.
        verbatim = "\'\'\'" not in source and not source.endswith("\\")
        text = f"r\'\'\'{source}\'\'\'" if verbatim else repr(source)
        lines += [
            f"# {module} (tpulaunch's reference model), copied so this script runs without tpulaunch.",
            f"{name} = sys.modules[{private!r}] = types.ModuleType({private!r})",
            f"exec(compile({text}, {module!r}, 'exec'), {name}.__dict__)",
            "",
        ]
    return lines


def _builder_kwargs(job, search_path: Sequence[str]) -> dict:
    """The builder's keyword arguments, as `tpulaunch train` passes them (params, plus input shapes).

    Resolving the builder needs its module; when it cannot be imported here, only the params are
    written (and `input_shape(s)` added when the job has none).
    """
    try:
        from tpulaunch.job.imports import resolve

        builder = resolve(job.model.builder, search_path=search_path, what="model builder")
        return builder_kwargs(builder, job.model.params, job.data.features)
    except Exception:  # pylint: disable=broad-except  # best effort: fall back to the plain params
        return dict(job.model.params)


def _own_code(job, at, search_path: Sequence[str]) -> list:
    spec = job.model
    lines = ["# ------------------------------------------------------------------------ the job's own code", ""]
    lines += _reference_blocks([path for _, path in job_import_paths(spec, job.data)])
    if spec.model_fn:
        lines += [f"# {at('model', 'model_fn')}: the job's own TPUEstimator model_fn, used unchanged.",
                  _import_line(spec.model_fn, "user_model_fn")]
    else:
        lines += [f"# {at('model', 'builder')}: returns an inference-only tf.keras.Model.",
                  _import_line(spec.builder, "build_model"),
                  f"# {at('model', 'params')}, plus input_shape(s) from data.features when the builder takes them",
                  f"BUILDER_KWARGS = {_literal(_builder_kwargs(job, search_path), 17)}"]
        if ":" in spec.optimizer.name:
            lines += [f"# {at('model', 'optimizer', 'name')}", _import_line(spec.optimizer.name, "custom_optimizer")]
        else:
            lines.append("custom_optimizer = None  # OPTIMIZER names one of V1_OPTIMIZERS")
        # Losses and metrics given as import paths, per label too, keyed by their path as the engine keys them.
        names: dict = {}
        for key, path in spec.function_paths():
            if path not in names:
                names[path] = f"custom_{'loss' if key[1] == 'loss' else 'metric'}_{len(names)}"
                lines.append(_import_line(path, names[path]) + f"  # {at(*key)}")
        losses = {path: names[path] for key, path in spec.function_paths() if key[1] == "loss"}
        metrics = {path: names[path] for key, path in spec.function_paths() if key[1] == "metrics"}
        lines.append("CUSTOM_LOSSES = {" + ", ".join(f"{p!r}: {n}" for p, n in losses.items()) + "}")
        lines.append("CUSTOM_METRICS = {" + ", ".join(f"{p!r}: {n}" for p, n in metrics.items()) + "}")
        whole = losses.get(spec.loss) if isinstance(spec.loss, str) else None
        lines.append(f"custom_loss = {whole}  # one import-path loss gets all labels and outputs" if whole else
                     "custom_loss = None  # LOSS names Keras losses (per label when a mapping)")
    if job.data.input_fn:
        lines += _input_fn_lines(job.data, at)
    return lines + [""]


def _input_fn_lines(data, at) -> list:
    """INPUT_FNS: the job's own input_fn for each mode it names, imported once per function."""
    if isinstance(data.input_fn, str):
        return [f"# {at('data', 'input_fn')}: the job's own input_fn for every mode, used instead of make_input_fn.",
                _import_line(data.input_fn, "user_input_fn"),
                "INPUT_FNS = {'train': user_input_fn, 'eval': user_input_fn, 'predict': user_input_fn}"]
    lines = [f"# {at('data', 'input_fn')}: the job's own input_fn per mode, used instead of make_input_fn."]
    aliases: dict = {}
    for mode in INPUT_MODES:
        path = data.input_fn_for(mode)
        if path and path not in aliases:
            aliases[path] = f"user_{mode}_input_fn"
            lines.append(f"{_import_line(path, aliases[path])}  # {at('data', 'input_fn', mode)}")
    by_mode = ", ".join(f"{mode!r}: {aliases[data.input_fn_for(mode)]}" for mode in INPUT_MODES
                        if data.input_fn_for(mode))
    return lines + ["INPUT_FNS = {" + by_mode + "}"]


def _flag_lines(job, at) -> list:
    """The job's absl flags, set as flags.py sets them for `tpulaunch train`, in plain absl calls.

    Written when the job has `flags:` or names a module of its own (which may read FLAGS: the engine
    marks them parsed for every job). A fresh process has every flag at its default already.
    """
    own_modules = [path for _, path in job_import_paths(job.model, job.data) if not path.startswith(REFERENCE_PACKAGE)]
    if not job.flags and not own_modules:
        return []
    lines = ["# ---------------------------------------------------------------------------------- absl flags", ""]
    if job.flags:
        lines += [f"# {at('flags')}: the absl flags the job's modules define (importing them above defined them), set",
                  "# before any of their functions runs: each value parsed by its flag's own parser, the other",
                  "# flags at their defaults; then FLAGS is marked parsed and the flags' validators run."]
    else:
        lines += ["# The job sets no flags: whatever absl flags the job's modules define stay at their defaults;",
                  "# FLAGS is marked parsed (so reading one works) and the flags' validators run."]
    lines.append("from absl import flags as absl_flags")
    lines.append("")
    for name, value in job.flags.items():
        lines.append(f"absl_flags.FLAGS[{name!r}].parse({value!r})  # {at('flags', name)}")
    return lines + ["absl_flags.FLAGS.mark_as_parsed()", "absl_flags.FLAGS.validate_all_flags()", ""]


# ------------------------------------------------------------------------------------ the job values

def _literal(value: Any, indent: int = 0) -> str:
    text = pprint.pformat(value, width=100 - indent, sort_dicts=False)
    return text.replace("\n", "\n" + " " * indent)


# What a value means, where its job key alone does not say.
_NOTES = {
    "features": "per tensor: record key, stored form, per-example shape (None = unknown), dtype",
    "train_batch_size": "global, over all replicas",
    "eval_batch_size": "global, over all replicas",
    "summary_steps": f"TensorBoard scalars every this many steps (default {plain.DEFAULT_SUMMARY_STEPS})",
    "log_every_steps": f"else iterations_per_loop on a TPU, else {plain.DEFAULT_LOG_EVERY_STEPS}",
    "optimizer_args": "over standalone's OPTIMIZER_DEFAULTS for a named optimizer",
    "input_partition_dims": "[features dims, labels dims], mirroring the structure input_fn yields (a dict for "
                            "several tensors; None = replicated to every core of a replica)",
}


def _assignment(name: str, value: Any, where: str, note: Optional[str] = None) -> list:
    """`NAME = value  # where: note`, the comment above when the value is long or spans lines."""
    constant = name.upper()
    comment = f"# {where}" + (f": {note}" if note else "")
    text = f"{constant} = {_literal(value, len(constant) + 3)}"
    if "\n" in text or len(text) + len(comment) > 108 or name in ("features", "labels", "input_partition_dims"):
        return [*textwrap.wrap(comment, width=110, subsequent_indent="# "), text]
    return [f"{text}  {comment}"]


def _settings_lines(title: str, settings: dict, at, written: dict, notes: dict) -> list:
    """One constant per setting not yet `written` (learning_rate and model_dir feed two functions)."""
    lines = [f"# {title}"]
    for name, value in settings.items():
        if name in written:
            assert written[name] == value, (name, written[name], value)  # one constant must serve both
            continue
        written[name] = value
        lines += _assignment(name, value, at(*plain.SOURCES[name]), {**_NOTES, **notes}.get(name))
    return lines + [""]


def _call(head: str, arguments: Iterable[str], indent: int) -> str:
    """`head(` and the arguments on the lines below, wrapped at 110 columns, `indent` spaces in."""
    pad = " " * (indent + 4)
    body = textwrap.fill(", ".join(arguments), width=110, initial_indent=pad, subsequent_indent=pad,
                         break_long_words=False, break_on_hyphens=False)
    return f"{head}(\n{body})"


def _keywords(settings: dict) -> list:
    """`name=NAME` for each setting: the keyword and the constant the head wrote for it."""
    return [f"{name}={name.upper()}" for name in settings]


def _files(value) -> Optional[list]:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def explain_script(loaded: LoadedJob, plan: Optional["Plan"] = None, *, search_path: Sequence[str] = ()) -> str:
    """The standalone script for the (valid) job in `loaded`, on its plan (built from the job when None).

    A job with its own `model.model_fn` gets it unchanged, with `model.params` as TPUEstimator's
    `params=`; a job with its own `data.input_fn` gets its function for each mode; either way the
    job's `flags:` are set first. Only the values the program uses are written.

    Raises:
        ValueError: the job did not validate (`loaded.job` is None).
    """
    job = loaded.job
    if job is None:
        raise ValueError("the job file has schema problems; run `tpulaunch validate` first")
    if plan is None:
        from tpulaunch.plan.build import build_plan

        plan = build_plan(job)
    at = _Keys(loaded)
    on_tpu = plan.on_tpu
    own_model_fn, own_input_fn = bool(job.model.model_fn), bool(job.data.input_fn)
    job_dir = os.path.dirname(os.path.abspath(loaded.file))
    inputs = {} if own_input_fn else plain.input_settings(job)
    optimizer = {} if own_model_fn else plain.optimizer_settings(job)
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
        "Run: python {this file} [train|evaluate]    (from anywhere; the job's directory is put on sys.path)",
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
        "# The job file's directory comes first on the import path, as under `tpulaunch train`.",
        f"JOB_DIR = {job_dir!r}",
        "sys.path.insert(0, JOB_DIR)",
        "",
        "# ------------------------------------------------------------------------------------ job values",
        "",
        f"USE_TPU = {on_tpu!r}  # {'tpu: section present' if on_tpu else 'no tpu: section: runs locally'}",
    ]
    if not own_input_fn:
        lines += [f"TRAIN_FILES = {_files(job.data.train)!r}  # {at('data', 'train')}",
                  f"EVAL_FILES = {_files(job.data.eval)!r}  # {at('data', 'eval')}"]
    lines += [
        f"TRAIN_STEPS = {job.train.steps if job.train else None!r}  # {at('train', 'steps')}: train until this global step",
        f"EVAL_STEPS = {job.eval.steps if job.eval else None!r}  # {at('eval', 'steps')}",
        f"EVAL_EVERY_STEPS = {job.eval.every_steps if job.eval else None!r}  # {at('eval', 'every_steps')}",
    ]
    if not own_model_fn:
        lines.append(f"PRECISION = {job.model.precision!r}  # {at('model', 'precision')}")
    lines.append("")
    for title, settings in (("make_input_fn", inputs), ("optimizer_factory and make_model_fn", {**optimizer, **model}),
                            ("run_config and tpu_estimator", {**config, **estimator})):
        if settings:
            lines += _settings_lines(f"keywords of {title} (below)", settings, at, written, notes)
    if on_tpu:
        tpu = job.tpu
        lines += [
            (f"TPU_NAME = {tpu.name!r}  # {at('tpu', 'name')}" if tpu.name else
             "TPU_NAME = os.environ.get('TPU_NAME')  # tpu.name (default: $TPU_NAME)"),
            f"TPU_ZONE = {tpu.zone!r}  # {at('tpu', 'zone')}",
            f"TPU_PROJECT = {tpu.project!r}  # {at('tpu', 'project')}",
            f"TPU_TYPE = {tpu.type!r}  # {at('tpu', 'type')} (for reference; the slice is what TPU_NAME names)",
            "",
        ]
    lines += _own_code(job, at, search_path)
    lines += _flag_lines(job, at)
    lines += [
        "# " + "=" * 98,
        "# tpulaunch/engine/portable.py and tpulaunch/engine/estimator/standalone.py, verbatim: the input pipeline,",
        "# model_fn and estimator settings `tpulaunch train` runs.",
        "# " + "=" * 98,
        "",
        standalone_source().rstrip("\n"),
        "",
        "",
        "# " + "=" * 98,
        _tail(inputs, optimizer, model, config, estimator),
    ]
    return "\n".join(lines) + "\n"


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
    make_optimizer = {_call("optimizer_factory", [*_keywords(optimizer), "make=custom_optimizer"], 4)}
    return {_call("make_model_fn", ["build_model", "BUILDER_KWARGS", "use_tpu=USE_TPU", "policy=policy",
                                    "make_optimizer=make_optimizer", "custom_loss=custom_loss",
                                    "custom_losses=CUSTOM_LOSSES",
                                    "custom_metrics=CUSTOM_METRICS", *_keywords(model)], 4)}'''


def _job_input_fn(inputs: dict) -> str:
    """job_input_fn(mode): the job's own input_fn for the mode (`inputs` empty), else make_input_fn on its files."""
    if not inputs:
        return '''def job_input_fn(mode):
    """The job's own input_fn for the mode, unchanged; None when it has none. TPUEstimator calls it with
    params (PARAMS beside batch_size), and with `mode` and `config` when it names them."""
    return INPUT_FNS.get(mode)'''
    return f'''def job_input_fn(mode):
    """make_input_fn on the mode's files; None when the job has none."""
    training = mode == "train"
    patterns = TRAIN_FILES if training else EVAL_FILES
    if not patterns:
        return None
    try:
        files = expand_files(patterns)
    except FilesError as exc:
        raise SystemExit(f"data.{{mode}}: {{exc}}") from None
    return {_call("make_input_fn", ["files", "training=training", "use_tpu=USE_TPU", *_keywords(inputs)], 4)}'''


def _tail(inputs: dict, optimizer: dict, model: dict, config: dict, estimator: dict) -> str:
    """make_estimator, the input_fns and main(): what runner.py does with the functions above."""
    return f'''# Running: what `tpulaunch train` and `tpulaunch evaluate` do with the functions above.


{_job_model_fn(optimizer, model)}


def make_estimator():
    resolver = None
    if USE_TPU:
        from tensorflow.python.distribute.cluster_resolver import TPUClusterResolver

        resolver = TPUClusterResolver(tpu=TPU_NAME, zone=TPU_ZONE, project=TPU_PROJECT)
    config = {_call("run_config", ["use_tpu=USE_TPU", "cluster_resolver=resolver", *_keywords(config)], 4)}
    return {_call("tpu_estimator", ["job_model_fn()", "config", "use_tpu=USE_TPU", *_keywords(estimator)], 4)}


{_job_input_fn(inputs)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=("train", "evaluate"), default="train")
    mode = parser.parse_args(argv).mode
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    estimator = make_estimator()
    eval_input = job_input_fn("eval") if EVAL_STEPS else None
    if mode == "evaluate":
        if eval_input is None:
            raise SystemExit("the job has nothing to evaluate: it needs an eval: section and its data")
        print(estimator.evaluate(eval_input, steps=EVAL_STEPS))
        return
    train_input = job_input_fn("train") if TRAIN_STEPS else None
    if train_input is None:
        raise SystemExit("the job has nothing to train on: it needs a train: section and its data")
    checkpoint = tf.train.latest_checkpoint(MODEL_DIR)
    step = int(tf.train.load_variable(checkpoint, "global_step")) if checkpoint else 0
    for boundary in boundaries(step, TRAIN_STEPS, EVAL_EVERY_STEPS if eval_input else None):
        if step >= boundary:
            continue
        estimator.train(train_input, max_steps=boundary)
        step = boundary
        if eval_input and (EVAL_EVERY_STEPS or boundary == TRAIN_STEPS):
            print(estimator.evaluate(eval_input, steps=EVAL_STEPS))


if __name__ == "__main__":
    main()'''


__all__ = ["explain_script", "standalone_source"]
