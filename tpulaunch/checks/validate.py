"""`tpulaunch validate`: every check that can run before a TPU is paid for, all problems at once."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence

from tpulaunch.errors import JobFileError, Problem
from tpulaunch.job.load import LoadedJob, load_job

if TYPE_CHECKING:
    from tpulaunch.plan.build import Plan


@dataclass
class Validation:
    file: str
    loaded: Optional[LoadedJob]
    problems: list = field(default_factory=list)
    checked: list = field(default_factory=list)
    data_reports: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # what deeper checks built (e.g. TensorFlow's own verdict)
    # The job's Plan for this target, built once when the static checks pass: the deeper checks read it and
    # the gate hands it to the verb (`app/gate.py`).
    plan: Optional[Plan] = None

    @property
    def ok(self) -> bool:
        return not any(p.is_error for p in self.problems)


def _sorted(problems: Sequence[Problem]) -> list:
    # Stable: file order, then as found. `--set` problems (file "--set") come first. A message that quotes a
    # secret of the job (a check's, the job's own code's) shows it masked.
    from tpulaunch.job.secrets import redact

    return sorted((replace(p, message=redact(p.message), hint=redact(p.hint)) for p in problems),
                  key=lambda p: (p.file != "--set", p.file, p.line, p.column))


def validate_job(
    filename: str,
    overrides: Sequence[str] = (),
    *,
    static: bool = False,
    records_per_file: int = 2,
    all_records: bool = False,
    use_tf: bool = False,
    local: bool = False,
    env: Optional[Mapping[str, str]] = None,
    on_stage: Optional[Callable[[str], None]] = None,
) -> Validation:
    """Run the checks. `static` keeps to those needing neither TensorFlow nor the network.

    `local` checks the job for a run on this machine (`train --local`): its tpu: and partition:
    sections are kept in the file but not applied, so TPU-only rules (gs:// paths, replicas) are off.
    """
    stage = on_stage or (lambda name: None)
    stage("schema")
    try:
        loaded = load_job(filename, overrides, env=env)
    except JobFileError as exc:
        return Validation(filename, None, exc.problems, ["file"])
    loaded.local = local
    # Which engine's rules the job is checked against is part of what was checked (run.engine as written,
    # or the installed framework's engine): worked out once, the one answer every rule and the Plan get.
    about = loaded.engine_about
    result = Validation(filename, loaded, list(loaded.problems), ["schema", about.display])
    if not isinstance(loaded.data, dict):
        return result

    from tpulaunch.checks.own_program import own_program_problems
    from tpulaunch.checks.static import static_problems

    stage("partition and batch arithmetic")
    result.problems.extend(static_problems(loaded))
    result.problems.extend(own_program_problems(loaded))
    result.checked += ["slice", "partition", "batch", "paths"]
    if loaded.job is not None and result.ok:
        from tpulaunch.checks.static import layout_padding_problems
        from tpulaunch.plan.build import build_plan

        result.plan = build_plan(loaded.job, local=local, engine=loaded.engine)
        result.problems.extend(layout_padding_problems(loaded, result.plan))

    if not static:
        from tpulaunch.seam.registry import missing_for

        missing = missing_for(about.name)
        if missing:  # every check below runs the engine's own TensorFlow code
            path = ("run", "engine") if loaded.section("run") is not None and loaded.section("run").engine else ("run",)
            result.problems.append(loaded.problem(
                path, "engine-not-installed", f"the job runs on the {about.display}, but {missing}",
                f"{about.install_hint}; or check only what needs no TensorFlow: validate --static"))
            result.problems = _sorted(_dedupe(result.problems))
            return result
        if not local and loaded.section("tpu") is not None:
            from tpulaunch.checks.stack import machine_warnings

            result.problems.extend(machine_warnings(loaded))  # what `train` here would refuse
        search_path = loaded.search_path
        from tpulaunch.tf_env import import_tensorflow

        os.environ.update(about.process_environment)  # the engine's own, before the job's code loads

        import_tensorflow()  # before the job's own modules import it: its start-up lines stay off the terminal
        result.problems.extend(code_problems(loaded, search_path, result.checked, prior_ok=result.ok, stage=stage))
        if loaded.usable("run", "model", "data") and loaded.section("run") and loaded.section("run").warm_start:
            stage("warm start")
            from tpulaunch.checks.warm_start import warm_start_problems

            # Before the build, which warm-starts as train does. The model is built again only when the model check passed (no second failure, no second download).
            result.problems.extend(warm_start_problems(loaded, search_path, build=result.ok))
            result.checked.append("warm_start")
        if result.plan is not None and result.ok:
            stage("build")  # the engine's own graphs, as train builds them: what fails here fails there
            from tpulaunch.seam.registry import engine

            result.problems.extend(engine(result.plan.engine).check_build(loaded, result.plan))
            result.checked.append("build")
            if not local and result.ok:
                from tpulaunch.checks.xla_fit import xla_fit_problems
                from tpulaunch.plan.xla_home import compiler_python

                if compiler_python() is not None:  # XLA's TPU compiler's own verdict on the step, where installed
                    stage("XLA's TPU compiler")
                    result.problems.extend(xla_fit_problems(loaded, result.plan))
                    result.checked.append("xla")
        if loaded.usable("data", "tpu", "train", "eval"):
            stage("data")
            problems, reports = data_problems(loaded, records_per_file=records_per_file, all_records=all_records,
                                              reports=True)
            result.problems.extend(problems)
            result.data_reports = reports
            result.checked.append("data")
    if use_tf and result.plan is not None and result.ok:
        stage(f"the {loaded.engine_about.display}'s own framework checks (--tf)")
        problems, built = tensorflow_verdict(loaded, result.plan)
        result.problems.extend(problems)
        result.extra["tensorflow"] = built
        result.checked.append("tensorflow")
    result.problems = _sorted(_dedupe(result.problems))
    return result


def tensorflow_verdict(loaded: LoadedJob, plan: "Plan") -> tuple:
    """`--tf`: the job's engine builds its graphs for the declared slice with TensorFlow's own code, offline (a
    job that passed the static checks, its Plan); returns (the problems, sorted, what was built per mode)."""
    from tpulaunch.seam.registry import engine

    problems, built = engine(plan.engine).preflight(loaded, plan)
    return _sorted(_dedupe(problems)), built


def code_problems(loaded, search_path: Sequence[str], checked: list, *, prior_ok: bool = True,
                  stage: Callable[[str], None] = lambda name: None) -> list:
    """The checks of the job's own code that need TensorFlow but build nothing: its flags, its import paths and
    the builder's parameters, what its input_fns yield. `train`, `evaluate` and `export` run them too, once
    TensorFlow is loaded, so what validate refuses here they refuse before they build anything."""
    problems: list = []
    if loaded.usable("model", "data", "flags"):
        stage("flags")  # first: the job's functions called below read the flags it sets
        from tpulaunch.checks.flags import flag_problems

        problems.extend(flag_problems(loaded, search_path))
        checked.append("flags")
    if loaded.usable("model", "data"):
        stage("model")
        from tpulaunch.checks.model import model_problems

        problems.extend(model_problems(loaded, search_path=search_path))
        checked.append("model")
    ok = prior_ok and not any(p.is_error for p in problems)
    if loaded.job is not None and loaded.job.data.input_fn is not None and ok:
        from tpulaunch.seam.about import load_attribute

        for name, check in loaded.engine_about.code_checks:  # the engine's own contract for the job's code
            stage(name)
            problems.extend(load_attribute(check)(loaded, search_path))
            checked.append(name)
    return problems


def data_problems(loaded, *, records_per_file: int = 2, all_records: bool = False, reports: bool = False,
                  splits: tuple = ("train", "eval")):
    """The data stage (`checks/data.py`'s dry run: the files, a sample of records, the counts against the batches)
    of `splits`, which `train` runs too; with `reports`, (problems, the splits' reports)."""
    if not loaded.usable("data", "tpu", "train", "eval"):
        return ([], []) if reports else []
    from tpulaunch.checks.data import dry_run

    problems, found = dry_run(loaded, records_per_file=records_per_file, all_records=all_records, splits=splits)
    return (problems, found) if reports else problems


def _dedupe(problems):
    seen, out = set(), []
    for p in problems:
        key = (p.file, p.line, p.column, p.code, p.message)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out
