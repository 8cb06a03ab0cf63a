"""The TensorFlow stack a `tpu:` job runs on, checked before a TPU is touched: the installed TensorFlow (from
package metadata, no import), the slice's generation and `tpu.runtime_version`, against `tpu/stack.py`'s
facts. Jobs checked for this machine (`--local`) have no TPU and skip it, and so does a machine whose
TensorFlow is not the job's engine's (validate says that the job's engine is not installed)."""

from __future__ import annotations

from typing import Mapping, Optional

from tpulaunch.job.load import LoadedJob


def stack_problems(loaded: LoadedJob, installed: Optional[Mapping[str, str]] = None) -> list:
    """Located problems of the job's TPU stack; `installed` (distribution -> version) defaults to this machine's."""
    job_tpu = loaded.section("tpu")
    if job_tpu is None:
        return []
    from tpulaunch.checks.engine_rules import job_engine_about
    from tpulaunch.engine.registry import runs_on
    from tpulaunch.tpu import stack
    from tpulaunch.tpu.types import lookup

    about = job_engine_about(loaded)
    api = about.tpu_runtime
    installed = stack.installed_distributions() if installed is None else installed
    found = stack.tensorflow_distributions(installed)
    tensorflow = stack.version_tuple(next(iter(found.values()))) if len(found) == 1 else None
    problems = []
    if found and (len(found) > 1 or runs_on(about.name, tensorflow[:2])):
        problems += _located(loaded, ("tpu",), stack.installed_verdict(installed, api))
    else:
        tensorflow = None  # not this engine's TensorFlow: nothing installed here to hold the job to
    slice_type = lookup(job_tpu.type)
    if slice_type is not None:
        problems += _located(loaded, ("tpu", "type"), stack.generation_verdict(slice_type.generation.name, api, tensorflow))
    if getattr(job_tpu, "runtime_version", None):
        verdict = stack.runtime_verdict(job_tpu.runtime_version, api, tensorflow, installed,
                                        hosts=slice_type.hosts if slice_type else None,
                                        generation=slice_type.generation.name if slice_type else None)
        problems += _located(loaded, ("tpu", "runtime_version"), verdict)
    return problems


def _located(loaded: LoadedJob, path: tuple, verdict) -> list:
    if verdict is None:
        return []
    return [loaded.problem(path, f"tpu-stack-{verdict.code}", verdict.message, verdict.fix,
                           severity=verdict.severity, at_key=len(path) == 1)]
