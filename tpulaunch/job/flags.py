"""The job's `flags:` section: absl flags that the job's own modules define, set before their code runs.

A TPUEstimator program reads its settings from module-level absl `FLAGS`; its `main()` parses them
from the command line. tpulaunch never runs `main()`, so without this the first `FLAGS.learning_rate`
raises `UnparsedFlagAccessError`. Here, before any of the job's functions is called:

1. the job's modules are imported (importing them defines their flags);
2. every flag those modules define is reset to its default;
3. each value under `flags:` is parsed by its flag's own parser (an int flag takes 3 or "3", not 1.5);
4. `FLAGS` is marked parsed and the flags' validators run (`mark_flag_as_required` and the like).

"The job's modules" means every module that is not part of absl, TensorFlow, Keras or tpulaunch: the
modules the job names and the helpers they import. Library flags (`verbosity`, `test_tmpdir`, ...)
are not the program's settings and are refused.

Importing this module imports neither TensorFlow nor absl.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.imports import ImportPathError, resolve
from tpulaunch.job.schema import INPUT_MODES, Data, Job, Model

# Packages whose flags are never a program's own settings.
LIBRARY_PACKAGES = ("absl", "tensorflow", "tensorflow_estimator", "keras", "tf_keras", "tensorboard",
                    "cloud_tpu_client", "tpulaunch")


@dataclass(frozen=True)
class FlagFinding:
    """Something wrong with the job's flags, at the job-file keys it is about."""

    path: Tuple
    code: str
    message: str
    hint: Optional[str] = None


def job_import_paths(model: Model, data: Data) -> List[Tuple[Tuple, str]]:
    """(job-file keys, import path) for every function the job's model and data sections name, in file order."""
    paths: List[Tuple[Tuple, str]] = []
    if model.builder:
        paths.append((("model", "builder"), model.builder))
    if model.model_fn:
        paths.append((("model", "model_fn"), model.model_fn_path))
    paths += model.function_paths()
    if ":" in model.optimizer.name:
        paths.append((("model", "optimizer", "name"), model.optimizer.name))
    if isinstance(data.input_fn, str):
        paths.append((("data", "input_fn"), data.input_fn))
    elif data.input_fn is not None:
        paths += [(("data", "input_fn", mode), data.input_fn_for(mode)) for mode in INPUT_MODES
                  if data.input_fn_for(mode)]
    return paths


def _import_modules(model: Model, data: Data, search_path: Sequence[str], *, strict: bool) -> None:
    """Import the job's modules (defining their flags). Unless `strict`, one that fails is skipped:
    validate reports it at its own key."""
    for _, path in job_import_paths(model, data):
        try:
            resolve(path, search_path=search_path, what="module")
        except ImportPathError:
            if strict:
                raise


def _is_library(module_name: str) -> bool:
    return module_name.split(".")[0] in LIBRARY_PACKAGES


def program_flags() -> Dict[str, Any]:
    """name -> absl Flag for every flag defined by a module outside the libraries, and where each library flag is from."""
    from absl import flags

    own: Dict[str, Any] = {}
    for module, defined in flags.FLAGS.flags_by_module_dict().items():
        if not _is_library(module):
            own.update({flag.name: flag for flag in defined})
    return own


def _library_module(name: str) -> Optional[str]:
    from absl import flags

    for module, defined in flags.FLAGS.flags_by_module_dict().items():
        if _is_library(module) and any(flag.name == name for flag in defined):
            return module
    return None


def _unknown(name: str, own: Dict[str, Any]) -> FlagFinding:
    library = _library_module(name)
    if library is not None:
        hint = f"'{name}' is a flag of {library}, not of the job's modules; flags: sets only the program's own flags"
    else:
        close = difflib.get_close_matches(name, list(own), n=1)
        if close:
            hint = f"did you mean '{close[0]}'?"
        elif own:
            hint = f"the job's modules define: {', '.join(sorted(own)[:20])}{', ...' if len(own) > 20 else ''}"
        else:
            hint = "the job's modules define no absl flags"
    return FlagFinding(("flags", name), "flag-unknown", f"no module of this job defines a flag '{name}'", hint)


def _bad_value(name: str, flag, value: Any, exc: Exception) -> FlagFinding:
    reason = str(exc)
    prefix = f"flag --{name}="
    if reason.startswith(prefix) and ": " in reason:
        reason = reason.split(": ", 1)[1]
    kind = flag.flag_type()
    if kind == "bool":  # absl's own message is a tuple's repr
        reason = "give true or false"
    hint = f"{flag.help} (default: {flag.default!r})" if flag.help else f"default: {flag.default!r}"
    if kind == "string" and not isinstance(value, str):
        hint = f"quote it: '{value}'; {hint}"
    return FlagFinding(("flags", name), "flag-value", f"--{name} is {'an' if kind[0] in 'aeiou' else 'a'} {kind} flag; {value!r} is not one: {reason}", hint)


# The flag a TPUEstimator program's main() hands its model_dir through (tensorflow/tpu's programs all define it;
# their host_call summaries are written under FLAGS.model_dir): set to run.model_dir unless `flags:` sets it.
MODEL_DIR_FLAG = "model_dir"


def set_flags(model: Model, data: Data, values: Dict[str, Any], search_path: Sequence[str] = (), *,
              strict: bool = True, model_dir: Optional[str] = None) -> List[FlagFinding]:
    """Import the job's modules, reset their flags to the defaults, parse `values` into them, mark FLAGS parsed.

    Values that do not parse are left at their defaults and reported; so are unknown names and
    failing flag validators. Calling it again gives the same state (a value from an earlier job does
    not linger).

    Args:
        model, data: the job's sections that name its modules.
        values: the job's `flags:` section.
        search_path: directories for the job's import paths (the job file's directory).
        strict: raise when one of the job's modules cannot be imported (else skip it: validate
            reports it at its key).
        model_dir: run.model_dir, for a `model_dir` flag of the job's modules that `values` leaves out.

    Returns:
        The findings, in the order of `values`, then validator failures.

    Raises:
        ImportPathError: with `strict`, a module that cannot be imported.
    """
    from absl import flags

    _import_modules(model, data, search_path, strict=strict)
    own = program_flags()
    for flag in own.values():
        flag.unparse()
    findings: List[FlagFinding] = []
    for name, value in values.items():
        if name not in own:
            findings.append(_unknown(name, own))
            continue
        try:
            own[name].parse(value)
        except (flags.IllegalFlagValueError, TypeError, ValueError) as exc:
            own[name].unparse()
            findings.append(_bad_value(name, own[name], value, exc))
    if model_dir is not None and MODEL_DIR_FLAG in own and MODEL_DIR_FLAG not in values:
        own[MODEL_DIR_FLAG].parse(model_dir)
    flags.FLAGS.mark_as_parsed()
    findings += _validator_findings(values, own)
    return findings


def _validator_findings(values: Dict[str, Any], own: Dict[str, Any]) -> List[FlagFinding]:
    """The program's flag validators (`mark_flag_as_required`, `register_validator`) on the values now set."""
    from absl import flags

    findings, seen = [], set()
    for flag in own.values():
        for validator in flag.validators:
            if id(validator) in seen:
                continue
            seen.add(id(validator))
            try:
                validator.verify(flags.FLAGS)
            except flags.ValidationError as exc:
                names = [n for n in validator.get_flags_names() if n in values] or validator.get_flags_names()
                path = ("flags", names[0]) if names[0] in values else ("flags",)
                findings.append(FlagFinding(path, "flag-invalid", f"--{', --'.join(names)}: {exc}",
                                            f"set it under flags: {{{names[0]}: ...}}"))
    return findings


def apply_flags(job: Job, search_path: Sequence[str] = ()) -> None:
    """`set_flags`, raising the first finding as a TpuLaunchError (train, evaluate and export use this).

    Raises:
        TpuLaunchError: an unknown flag, a value that does not parse, a failing validator, or a
            module that cannot be imported.
    """
    findings = set_flags(job.model, job.data, job.flags, search_path, model_dir=job.run.model_dir)
    if findings:
        first = findings[0]
        where = ".".join(str(p) for p in first.path)
        raise TpuLaunchError(f"{where}: {first.message}", hint=first.hint)
