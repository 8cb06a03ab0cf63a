"""The one gate every verb that acts on a job passes: load it, run validate's checks for the target,
hand their warnings to the caller, and hand over the Job and its Plan, or stop with the located problems.

validate, plan, train, evaluate, export, explain and status all come through `load_checked`, so a
job that `validate --static` accepts is one they accept, and no rule is checked anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from tpulaunch.errors import TpuLaunchError


@dataclass
class CheckedJob:
    """A job that passed the checks for its target, with the Plan everything downstream reads."""

    file: str
    loaded: "object"  # tpulaunch.job.load.LoadedJob: the file, its marks, its sections
    job: "object"  # tpulaunch.job.schema.Job (None only when `sections` let other errors through)
    plan: "object"  # tpulaunch.plan.build.Plan
    warnings: list
    local: bool

    @property
    def engine(self):
        """The job's Engine (`tpulaunch.seam.engine.Engine`): the one its Plan was built for, worked out once by the
        checks."""
        from tpulaunch.seam.registry import engine

        return engine(self.plan.engine)


class JobRefused(TpuLaunchError):
    """The job has errors: they are printed, located, then one line says what was not done."""

    show_message = "plain"

    def __init__(self, message: str, *, problems, loaded=None):
        super().__init__(message, problems=problems)
        self.loaded = loaded  # the job as read, for a verb that may go on despite some problems (`down`)


def load_checked(job_file: str, overrides: Sequence[str] = (), *, local: bool = False, verb: str = "running",
                 sections: Optional[Sequence[str]] = None, warn: Optional[Callable[[list], None]] = None,
                 env=None) -> CheckedJob:
    """Load `job_file` with `overrides`, run the static checks for this target (`local`: this machine's
    CPU/GPU, where tpu: and partition: do not apply) and return it with its Plan.

    Args:
        verb: what the caller was about to do, for the refusal line ("running", "planning", ...).
        sections: only errors in these top-level sections stop the caller (`status` needs only tpu:);
            None: every error does.
        warn: called with the warnings (the located problems that do not stop the caller), when there are any.
        env: the environment its `${VAR}`s are filled from (None: this process's).

    Raises:
        JobRefused: with every located problem, when the job has errors that matter here.
    """
    from tpulaunch.checks.validate import validate_job

    result = validate_job(job_file, overrides, static=True, local=local, env=env)
    blocking = [p for p in result.problems if p.is_error and _in(p, sections)]
    if blocking or result.loaded is None or (sections is None and result.loaded.job is None):
        shown = blocking or result.problems
        raise JobRefused(f"not {verb} {job_file}: fix the problems above (tpulaunch validate {job_file})",
                         problems=shown, loaded=result.loaded)
    warnings = [p for p in result.problems if not p.is_error]
    if warn is not None and warnings:
        warn(warnings)
    job = result.loaded.job
    plan = result.plan  # built once, by the checks (None only when `sections` let other errors through)
    if plan is not None:
        plan.warnings = warnings
    return CheckedJob(job_file, result.loaded, job, plan, warnings, local)


def _in(problem, sections) -> bool:
    return sections is None or problem.path.split(".")[0].split("[")[0] in sections
