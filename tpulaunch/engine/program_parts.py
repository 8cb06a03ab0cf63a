"""What the engines' `tpulaunch explain` programs are written with: job values commented with their key and
line, the job's own code imported (tpulaunch's reference models copied in), the job's absl flags set.

`engine/estimator/program.py` (TPUEstimator) and `engine/keras/program.py` (Keras + tf.distribute) write
their own head and tail around these. Pure Python: neither TensorFlow nor the job's code is imported here
when the builder's signature can be read from its source (`builder_parameters`).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import pprint
import re
import sys
import textwrap
from importlib.machinery import PathFinder
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple

from tpulaunch.job.yamlfile import value_at
from tpulaunch.job.flags import MODEL_DIR_FLAG, job_import_paths
from tpulaunch.engine.sources import module_source
from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.load import LoadedJob
from tpulaunch.job.schema import INPUT_MODES
from tpulaunch.job.yamlfile import dotted, env_parts, looks_secret


class Keys:
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

# The reference models shipped with tpulaunch: a program that uses one gets a copy of its source, so
# it runs without tpulaunch installed.
REFERENCE_PACKAGE = "tpulaunch.models."


def import_line(spec: str, alias: str) -> str:
    """The statement binding `alias` to the object `module:attr` names (a reference model's copy for tpulaunch's)."""
    module, _, attr = spec.partition(":")
    if module.startswith(REFERENCE_PACKAGE):
        return f"{alias} = {_reference_name(module)}.{attr}"
    if "." in attr:  # module:Class.method
        head, rest = attr.split(".", 1)
        return f"from {module} import {head} as _{alias}_owner\n{alias} = _{alias}_owner.{rest}"
    return f"from {module} import {attr} as {alias}"


def _reference_name(module: str) -> str:
    return "_" + module[len(REFERENCE_PACKAGE):].replace(".", "_")


def reference_blocks(specs: Sequence[str]) -> list:
    """For each reference model module the job names, its source as a module object in the program."""
    lines: list = []
    seen: set = set()
    modules = [spec.partition(":")[0] for spec in specs]
    for module in _with_reference_imports(modules):
        if not module.startswith(REFERENCE_PACKAGE) or module in seen:
            continue
        seen.add(module)
        # A reference module's imports of its siblings (which_keras) read the copies above it.
        source = module_source(module).replace(f"from {REFERENCE_PACKAGE}", "from reference_models.")
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


def _with_reference_imports(modules: Sequence[str]) -> list:
    """`modules` with the reference modules each imports (`from tpulaunch.models.X import ...`) before it."""
    out: list = []
    for module in modules:
        if module.startswith(REFERENCE_PACKAGE):
            out += [REFERENCE_PACKAGE + found for found in
                    re.findall(rf"^from {re.escape(REFERENCE_PACKAGE)}(\w+) import", module_source(module), re.M)]
        out.append(module)
    return out


def _module_file(module: str, search_path: Sequence[str]) -> Optional[str]:
    """The .py file of `module`, found as `import` would find it from `search_path` then sys.path, without
    importing it or its packages (tpulaunch's own modules: through its import system, as module_source)."""
    if module.split(".")[0] == "tpulaunch":
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
    else:
        path: Optional[list] = [*search_path, *sys.path]
        spec = None
        for part in module.split("."):
            if not path:
                return None
            spec = PathFinder.find_spec(part, path)
            if spec is None:
                return None
            path = list(spec.submodule_search_locations or [])
    origin = getattr(spec, "origin", None)
    return origin if origin and origin.endswith(".py") and os.path.isfile(origin) else None


def _bindings(tree: ast.Module, name: str) -> list:
    """Every node of the module that binds `name`, at any depth."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            found.append(node)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == name:
            found.append(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
            found.append(node)
        elif isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            found.append(node)
    return found


def builder_parameters(spec: str, search_path: Sequence[str] = ()) -> Optional[set]:
    """The parameter names of the function `module:function` names, read from its module's source; None when
    that cannot be told without running the module (not found, decorated, bound more than once, a method)."""
    module, _, attr = spec.partition(":")
    if not attr or "." in attr:
        return None
    path = _module_file(module, search_path)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    bound = _bindings(tree, attr)
    if len(bound) != 1 or bound[0] not in tree.body or not isinstance(bound[0], ast.FunctionDef) \
            or bound[0].decorator_list:
        return None
    args = bound[0].args
    return {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}


def builder_kwargs_for(job, search_path: Sequence[str]) -> dict:
    """The builder's keyword arguments, as `tpulaunch train` passes them (params, plus input shapes).

    The builder's parameters are read from its source when they can be (nothing is imported: neither
    the job's code nor TensorFlow), else from the imported builder; when it cannot be imported either,
    only the params are written (and `input_shape(s)` added when the job has none).
    """
    from tpulaunch.job.builder_args import builder_kwargs

    names = builder_parameters(job.model.builder, search_path)
    if names is not None:
        def signature_only(**kwargs):  # stands in for the builder: builder_kwargs reads only its parameter names
            return kwargs

        signature_only.__signature__ = _signature(names)  # type: ignore[attr-defined]
        return builder_kwargs(signature_only, job.model.params, job.data.features)
    try:
        from tpulaunch.job.imports import resolve

        builder = resolve(job.model.builder, search_path=search_path, what="model builder")
        return builder_kwargs(builder, job.model.params, job.data.features)
    except Exception:  # pylint: disable=broad-except  # best effort: fall back to the plain params
        return dict(job.model.params)


def _signature(names: Iterable[str]):
    import inspect

    return inspect.Signature([inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in sorted(names)])


def builder_lines(job, at, search_path: Sequence[str], *, optimizers: str) -> list:
    """A builder job's own code: build_model, BUILDER_KWARGS, custom_optimizer, its losses and metrics.

    `optimizers` names the table of the engine's built-in optimizer names (for the comment).
    """
    spec = job.model
    lines = [f"# {at('model', 'builder')}: returns an inference-only tf.keras.Model.",
             import_line(spec.builder, "build_model"),
             f"# {at('model', 'params')}, plus input_shape(s) from data.features when the builder takes them",
             f"BUILDER_KWARGS = {literal(builder_kwargs_for(job, search_path), 17)}"]
    if ":" in spec.optimizer.name:
        lines += [f"# {at('model', 'optimizer', 'name')}", import_line(spec.optimizer.name, "custom_optimizer")]
    else:
        lines.append(f"custom_optimizer = None  # OPTIMIZER names one of {optimizers}")
    # Losses and metrics given as import paths, per label too, keyed by their path as the engine keys them.
    names: dict = {}
    for key, path in spec.function_paths():
        if path not in names:
            names[path] = f"custom_{'loss' if key[1] == 'loss' else 'metric'}_{len(names)}"
            lines.append(import_line(path, names[path]) + f"  # {at(*key)}")
    losses = {path: names[path] for key, path in spec.function_paths() if key[1] == "loss"}
    metrics = {path: names[path] for key, path in spec.function_paths() if key[1] == "metrics"}
    lines.append("CUSTOM_LOSSES = {" + ", ".join(f"{p!r}: {n}" for p, n in losses.items()) + "}")
    lines.append("CUSTOM_METRICS = {" + ", ".join(f"{p!r}: {n}" for p, n in metrics.items()) + "}")
    whole = losses.get(spec.loss) if isinstance(spec.loss, str) else None
    lines.append(f"custom_loss = {whole}  # one import-path loss gets all labels and outputs" if whole else
                 "custom_loss = None  # LOSS names Keras losses (per label when a mapping)")
    return lines


def reference_lines(job) -> list:
    """The reference models the job names, copied in (`reference_blocks`)."""
    return reference_blocks([path for _, path in job_import_paths(job.model, job.data)])


def input_fn_lines(data, at) -> list:
    """INPUT_FNS: the job's own input_fn for each mode it names, imported once per function."""
    if isinstance(data.input_fn, str):
        return [f"# {at('data', 'input_fn')}: the job's own input_fn for every mode, used instead of make_dataset_fn.",
                import_line(data.input_fn, "user_input_fn"),
                "INPUT_FNS = {'train': user_input_fn, 'eval': user_input_fn, 'predict': user_input_fn}"]
    lines = [f"# {at('data', 'input_fn')}: the job's own input_fn per mode, used instead of make_dataset_fn."]
    aliases: dict = {}  # one name per function as written (a path, or a factory with its arguments)
    names = {}
    for mode in INPUT_MODES:
        spec = data.input_fn_spec(mode)
        if spec is None:
            continue
        written = repr(spec)
        if written not in aliases:
            alias = aliases[written] = f"user_{mode}_input_fn"
            made = data.input_fn_call(mode)
            if made is None:
                lines.append(f"{import_line(spec, alias)}  # {at('data', 'input_fn', mode)}")
            else:
                lines += call_lines(made, alias, at("data", "input_fn", mode))
        names[mode] = aliases[written]
    by_mode = ", ".join(f"{mode!r}: {name}" for mode, name in names.items())
    return lines + ["INPUT_FNS = {" + by_mode + "}"]


def call_lines(made, alias: str, comment: str) -> list:
    """Statements binding `alias` to what a job-file call makes (schema.Call), as job.imports.make_call makes it:
    the imports, then one expression (a value under args that is itself a call is made in place)."""
    imports: list = []
    expression = _call_expression(made, alias, imports)
    return imports + [f"{alias} = {expression}  # {comment}"]


def _call_expression(made, alias: str, imports: list) -> str:
    from tpulaunch.job.schema import Call, is_call

    name = f"_{alias}_{len(imports)}"
    imports.append(import_line(made.path, name))
    args = ", ".join(f"{key}={_call_expression(Call.model_validate(value), alias, imports) if is_call(value) else repr(value)}"
                     for key, value in made.args.items())
    if made.function:
        if "import functools" not in imports:
            imports.insert(0, "import functools")
        return f"functools.partial({name}{', ' + args if args else ''})"
    result = f"{name}({args})"
    return f"{result}.{made.method}" if made.method else result


def flag_lines(job, at) -> list:
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
    if MODEL_DIR_FLAG not in job.flags:
        lines += [f"if {MODEL_DIR_FLAG!r} in absl_flags.FLAGS:  # the program's own --{MODEL_DIR_FLAG}, as its main() "
                  "would get it",
                  f"    absl_flags.FLAGS[{MODEL_DIR_FLAG!r}].parse({job.run.model_dir!r})  # {at('run', 'model_dir')}"]
    return lines + ["absl_flags.FLAGS.mark_as_parsed()", "absl_flags.FLAGS.validate_all_flags()", ""]


# ------------------------------------------------------------------------------------ the job values

def literal(value: Any, indent: int = 0) -> str:
    """`value` as Python source, lines after the first `indent` spaces in."""
    text = pprint.pformat(value, width=100 - indent, sort_dicts=False)
    return text.replace("\n", "\n" + " " * indent)


# Values whose comment always goes above them (long dicts that read better on their own lines).
COMMENT_ABOVE = ("features", "labels", "input_partition_dims", "feature_dims", "label_dims")


def assignment(name: str, value: Any, where: str, note: Optional[str] = None) -> list:
    """`NAME = value  # where: note`, the comment above when the value is long or spans lines."""
    constant = name.upper()
    comment = f"# {where}" + (f": {note}" if note else "")
    text = f"{constant} = {literal(value, len(constant) + 3)}"
    if "\n" in text or len(text) + len(comment) > 108 or name in COMMENT_ABOVE:
        return [*textwrap.wrap(comment, width=110, subsequent_indent="# "), text]
    return [f"{text}  {comment}"]


def settings_lines(title: str, settings: dict, at, written: dict, notes: Dict[str, str],
                   sources: Dict[str, Tuple]) -> list:
    """One constant per setting not yet `written` (a value that feeds two functions is written once), each
    commented with its job key (`sources`) and what it means (`notes`)."""
    lines = [f"# {title}"]
    for name, value in settings.items():
        if name in written:
            assert written[name] == value, (name, written[name], value)  # one constant must serve both
            continue
        written[name] = value
        lines += assignment(name, value, at(*sources[name]), notes.get(name))
    return lines + [""]


def call(head: str, arguments: Iterable[str], indent: int) -> str:
    """`head(` and the arguments on the lines below, wrapped at 110 columns, `indent` spaces in."""
    pad = " " * (indent + 4)
    body = textwrap.fill(", ".join(arguments), width=110, initial_indent=pad, subsequent_indent=pad,
                         break_long_words=False, break_on_hyphens=False)
    return f"{head}(\n{body})"


def keywords(settings: dict) -> list:
    """`name=NAME` for each setting: the keyword and the constant the head wrote for it."""
    return [f"{name}={name.upper()}" for name in settings]


def files_list(value) -> Optional[list]:
    """A data.train / data.eval value as a list of patterns (None: no files)."""
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def tpu_lines(job, at) -> list:
    """TPU_NAME, TPU_ZONE, TPU_PROJECT and TPU_TYPE, for a job with a tpu: section."""
    tpu = job.tpu
    return [
        (f"TPU_NAME = {tpu.name!r}  # {at('tpu', 'name')}" if tpu.name else
         "TPU_NAME = os.environ.get('TPU_NAME')  # tpu.name (default: $TPU_NAME)"),
        f"TPU_ZONE = {tpu.zone!r}  # {at('tpu', 'zone')}",
        f"TPU_PROJECT = {tpu.project!r}  # {at('tpu', 'project')}",
        f"TPU_TYPE = {tpu.type!r}  # {at('tpu', 'type')} (for reference; the slice is what TPU_NAME names)",
        "",
    ]


def job_dir_lines(loaded: LoadedJob) -> list:
    """JOB_DIR (then python_path) first on sys.path, and JOB_DIR the working directory, as under `tpulaunch train`
    (`engine/job_code.running_job_code`)."""
    job_dir, *python_path = loaded.search_path
    lines = ["# The job file's directory comes first on the import path and is the working directory, as under",
             "# `tpulaunch train`: relative paths the job hands its own code (params, args) are relative to it.",
             f"JOB_DIR = {job_dir!r}"]
    if python_path:
        lines += [f"# {Keys(loaded)('python_path')}: the program's source tree, after JOB_DIR.",
                  f"sys.path[:0] = [JOB_DIR, *{python_path!r}]"]
    else:
        lines += ["sys.path.insert(0, JOB_DIR)"]
    return lines + ["if __name__ == \"__main__\":  # run, not imported: from the job's directory",
                    "    os.chdir(JOB_DIR)", ""]


BANNER = "# " + "=" * 98


def verbatim_lines(standalone_module: str, runs: str, source: str, tail: str) -> list:
    """The program's second half: portable.py and the engine's standalone module printed verbatim (`source`,
    what `runs` says they hold), then `tail`, the program's own main on the job's values."""
    path = standalone_module.replace(".", "/") + ".py"
    heading = textwrap.wrap(f"tpulaunch/engine/portable.py and {path}, verbatim: {runs}.", width=len(BANNER) - 2)
    return [BANNER, *(f"# {line}" for line in heading), BANNER, "", source.rstrip("\n"), "", "", BANNER, tail]



# ------------------------------------------------------------------------------ ${VAR} values

def env_reads(program: str, loaded: LoadedJob) -> str:
    """`program` with every string value that a `${VAR}` of the job file filled read from the environment
    when the program runs (`os.environ['API_TOKEN']`, `'gs://' + os.environ['BUCKET'] + '/data'`), never
    written in it. A secret (`job/secrets.py`: every `${VAR}` outside tpu: and the paths), or a value from a
    secret-looking variable, that would still be in the program (a value the program holds in another form)
    refuses the program, naming the key; so does a secret given with --set, which has no variable to be read from."""
    marks = loaded.marks
    _refuse_secret_sets(loaded)
    head, banner, verbatim = program.partition(BANNER)  # tpulaunch's own code after the banner holds no job value
    reads_written: list = []  # a read's default (`os.environ.get('N', '0.01')`) is the job file's text, no secret
    for path, text in marks.env_texts.items():
        value = value_at(loaded.data, path)
        parts = env_parts(text)
        secret = loaded.secrets.covers(path) or any(
            looks_secret(part[0]) for part in parts if not isinstance(part, str))
        if _set_on_command_line(marks, path) or value is None or value == "" or not (
                isinstance(value, str) or secret):
            continue
        reads = [repr(part) if isinstance(part, str) else
                 f"os.environ[{part[0]!r}]" if part[1] is None else f"os.environ.get({part[0]!r}, {part[1]!r})"
                 for part in parts]
        read = reads[0] if len(reads) == 1 else "(" + " + ".join(reads) + ")"
        if isinstance(value, str):
            head = head.replace(repr(value), read)
        elif isinstance(value, (int, float)) and len(reads) == 1:  # `api_key: ${KEY}` that YAML read as a number
            number = re.compile(rf"(?<![\w.]){re.escape(repr(value))}(?![\w.])")
            if len(number.findall(head)) == 1:  # one place only: another number that equals it is not touched
                head = number.sub(f"{type(value).__name__}({read})", head)
        reads_written.append(read)
        unread = functools.reduce(lambda text, written: text.replace(written, ""), reads_written, head)
        shown = value if isinstance(value, str) else repr(value)
        if secret and re.search(rf"(?<![\w.]){re.escape(shown)}(?![\w.])" if not isinstance(value, str) else
                                re.escape(shown), unread):
            names = ", ".join(f"${{{part[0]}}}" for part in parts if not isinstance(part, str))
            raise TpuLaunchError(
                f"{dotted(path)}: the value of {names} would be written into the program in clear (the program "
                "holds it in another form than the job file's)",
                hint="quote it in the job file (\"${VAR}\": the program reads a string from the environment), pass "
                     "it another way (the job's code reading the environment itself), or run the job with "
                     "`tpulaunch train`")
    return head + banner + verbatim


def _refuse_secret_sets(loaded: LoadedJob) -> None:
    """A secret given with --set (under a secret-looking key): the program would hold its value in clear."""
    from tpulaunch.job.secrets import set_secret_fix

    for path in sorted(loaded.secrets.from_command_line, key=lambda path: tuple(map(str, path))):
        raise TpuLaunchError(f"{dotted(path)}: a secret given with --set would be written into the program in clear",
                             hint=set_secret_fix(path, "the program reads it from the environment when it runs"))


def _set_on_command_line(marks, path: tuple) -> bool:
    """Whether --set replaced the value at `path` (or a mapping above it): then it is not the file's ${VAR}."""
    return any(path[:length] in marks.sources for length in range(len(path) + 1))
