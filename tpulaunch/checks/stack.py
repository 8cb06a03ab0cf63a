"""The framework stack a `tpu:` job runs on, checked before a TPU is touched: the installed framework (from
package metadata, no import), the slice's generation and `tpu.runtime_version`, against the facts of the job's
engine's stack (`EngineAbout.tpu_stack`: `tpu/stack.py` for TensorFlow's engines). Jobs checked for this machine (`--local`) have no TPU and skip it, and so does a machine whose
TensorFlow is not the job's engine's (validate says that the job's engine is not installed)."""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Optional

from tpulaunch.job.load import LoadedJob


def stack_problems(loaded: LoadedJob, installed: Optional[Mapping[str, str]] = None, *,
                   this_machine: bool = False) -> list:
    """Located problems of the job's TPU stack; `installed` (distribution -> version) defaults to this machine's.

    `this_machine`: also hold the job to the TensorFlow installed here (what `up` and `status` do, on the machine
    that drives the TPU). Without it (validate, plan: run on laptops and in CI, `--tf` on a CPU) only the job's
    own stack is checked: its generation and runtime version against its engine."""
    job_tpu = loaded.section("tpu")
    if job_tpu is None or loaded.engine_about.tpu_stack is None:  # an engine on no TPU refuses tpu: itself
        return []
    from tpulaunch.tpu.types import lookup

    about, installed, found, tensorflow = _installed_for(loaded, installed)
    stack, api = about.stack(), about.on_tpu.runtime
    problems = []
    if this_machine and (len(found) > 1 or tensorflow is not None):
        problems += _located(loaded, ("tpu",), stack.installed_verdict(installed, api))
    else:
        tensorflow = None  # nothing installed here to hold the job to
    slice_type = lookup(job_tpu.type)
    if slice_type is not None:
        problems += _located(loaded, ("tpu", "type"), stack.generation_verdict(slice_type.generation.name, api, tensorflow))
    if getattr(job_tpu, "runtime_version", None):
        verdict = stack.runtime_verdict(job_tpu.runtime_version, api, tensorflow, installed,
                                        hosts=slice_type.hosts if slice_type else None,
                                        generation=slice_type.generation.name if slice_type else None)
        problems += _located(loaded, ("tpu", "runtime_version"), verdict)
    return problems


def _installed_for(loaded: LoadedJob, installed: Optional[Mapping[str, str]]) -> tuple:
    """(the job's engine, the installed distributions, its TensorFlow ones, the TensorFlow version when it is
    the one installed TensorFlow and the engine runs on it, else None)."""
    from tpulaunch.seam.registry import runs_on

    about = loaded.engine_about
    stack = about.stack()
    installed = stack.installed_distributions() if installed is None else installed
    found = stack.framework_distributions(installed)
    tensorflow = stack.version_tuple(next(iter(found.values()))) if len(found) == 1 else None
    if tensorflow is not None and not runs_on(about.name, tensorflow[:2]):
        tensorflow = None
    return about, installed, found, tensorflow


def _located(loaded: LoadedJob, path: tuple, verdict) -> list:
    if verdict is None:
        return []
    return [loaded.problem(path, f"tpu-stack-{verdict.code}", verdict.message, verdict.fix,
                           severity=verdict.severity, at_key=len(path) == 1)]


def node_problems(loaded: LoadedJob, node_name: str, runtime: Optional[str],
                  installed: Optional[Mapping[str, str]] = None) -> list:
    """The node's own runtime version (its runtimeVersion) against the installed TensorFlow and the job's engine,
    located at tpu.runtime_version when the job sets one, else at tpu.name (the key that names the node)."""
    job_tpu = loaded.section("tpu")
    if job_tpu is None or not runtime or loaded.engine_about.tpu_stack is None:
        return []
    from tpulaunch.tpu.types import lookup

    about, installed, _found, tensorflow = _installed_for(loaded, installed)
    slice_type = lookup(job_tpu.type)
    verdict = about.stack().runtime_verdict(runtime, about.on_tpu.runtime, tensorflow, installed,
                                    hosts=slice_type.hosts if slice_type else None,
                                    generation=slice_type.generation.name if slice_type else None)
    if verdict is None:
        return []
    key = "runtime_version" if getattr(job_tpu, "runtime_version", None) else "name"
    if key == "name" and not getattr(job_tpu, "name", None):
        key = "type"
    fix = f"{verdict.fix}: recreate the node with it (tpulaunch down, then up with tpu.runtime_version set) " \
          "or install the TensorFlow the node runs"
    return [loaded.problem(("tpu", key), f"tpu-stack-node-{verdict.code}",
                           f"TPU node '{node_name}' runs {verdict.message}"
                           if verdict.message.startswith(runtime) else f"TPU node '{node_name}': {verdict.message}",
                           fix, severity=verdict.severity)]


def machine_warnings(loaded: LoadedJob) -> list:
    """What `train` on this machine would refuse about its TensorFlow (`refuse_unless_runnable`), as warnings:
    validate usually runs on a workstation or in CI, not on the machine that drives the TPU, so a TensorFlow
    here that cannot drive one is said, not held against the job."""
    own = stack_problems(loaded)
    warnings = []
    for problem in stack_problems(loaded, this_machine=True):
        if problem.is_error and problem not in own:
            warnings.append(replace(problem.with_severity("warning"), hint=(
                f"{problem.hint}; `tpulaunch train` on this machine refuses the job for this, so run it where "
                f"the TPU's {loaded.engine_about.framework.name} is installed (the TPU VM)")))
    return warnings


def refuse_unless_runnable(loaded: LoadedJob, file: str, verb: str) -> None:
    """Before a verb touches the TPU (`up`, `status`): stop with the located problems of the job's stack on this
    machine's TensorFlow."""
    errors = [p for p in stack_problems(loaded, this_machine=True) if p.is_error]
    if errors:
        from tpulaunch.errors import TpuLaunchError

        raise TpuLaunchError(f"not {verb} {file}: this machine's TensorFlow cannot drive the job's TPU (fix the "
                             "problems above)", problems=errors)
