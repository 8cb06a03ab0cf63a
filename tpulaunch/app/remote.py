"""What `run`, `rehearse`, `logs` and `cancel` do before the remote run is followed: the job read and checked for
its TPU, its secrets, its stage, and the Controller wired to the Cloud TPU API (`remote/controller.py`).

No printing here: the commands hand in `say` (notes, stderr) and `out` (progress, stdout) and render the rest.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from tpulaunch.errors import ExitCode, TpuLaunchError

LOCAL_PATH_ON_TPU = "local-path-on-tpu"  # validate's rule that a rehearsal waives: its local folders stand for the bucket


def secret_references(job_file: str, overrides) -> list:
    """The job's `${VAR}`s that the VM reads from Secret Manager (read from the file alone: no value needed)."""
    from tpulaunch.errors import JobFileError
    from tpulaunch.job.load import load_job
    from tpulaunch.remote.secret_manager import references, vm_references

    try:
        return vm_references(references(load_job(job_file, overrides, env={})))
    except JobFileError:
        return []  # validate says what is wrong with the file


def checked_for_tpu(job_file: str, overrides, *, rehearsal: bool, env=None, warn=None):
    """The job through validate's static checks for its TPU; in a rehearsal, local paths are allowed (they stand
    for the bucket) and the job is then checked as the VM's `train --local` checks it. `env`: what its `${VAR}`s
    are filled with here (the ones the VM reads from Secret Manager stand as a placeholder). `warn`: called with
    the job's warnings (`app/gate.py`)."""
    from tpulaunch.app.gate import JobRefused, load_checked

    try:
        return load_checked(job_file, overrides, local=False, verb="running", warn=warn, env=env)
    except JobRefused as refused:
        errors = [problem for problem in refused.problems if problem.is_error]
        if not rehearsal or not errors or any(problem.code != LOCAL_PATH_ON_TPU for problem in errors):
            raise
    return load_checked(job_file, overrides, local=True, verb="running", warn=warn, env=env)


def staged_controller(job_file: str, overrides, *, target: str, api_endpoint: Optional[str], recreate: int,
                      poll_s: float, timeout_s: float, host_timeout_s: float, try_wait_s: float, keep_tpu: bool,
                      say: Callable[[str], None], out: Callable[[str], None], warn=None,
                      after_preemption: str = "same-zone", rehearsal_python: Optional[str] = None,
                      secrets_url: Optional[str] = None,
                      on_step=None):
    """The job checked (validate's static checks for its TPU), staged, and a Controller for it, with the run's
    record (`remote/controller.py`'s `RunRecord`). `say`: the run's notes (stderr); `out`: its progress (stdout);
    `warn`: called with the job's warnings."""
    from tpulaunch.tpu import api

    api.require_client()  # before anything is staged: a missing client leaves nothing behind
    from tpulaunch.remote.controller import Controller, RunRecord
    from tpulaunch.remote.stage import stage_job
    from tpulaunch.remote.startup import startup_script
    from tpulaunch.tpu.lifecycle import Fallback, Lifecycle, placements, spec_for
    from tpulaunch.tpu.node import resolve_node

    from tpulaunch.remote import secret_manager

    secret_refs = secret_references(job_file, overrides)
    checked = checked_for_tpu(job_file, overrides, rehearsal=target == "local",
                              env=secret_manager.validation_env(secret_refs), warn=warn)
    job = checked.job
    if job.tpu is None:
        raise TpuLaunchError(f"{job_file} has no tpu: section: there is no TPU to run it on",
                             hint="add tpu: {name: ..., zone: ..., project: ..., type: ...}; "
                                  "`tpulaunch train --local` runs it on this machine")
    engine = checked.plan.engine
    ref = resolve_node(job.tpu)
    spec = spec_for(job.tpu, engine)
    secrets = secret_manager.require(checked.loaded, job, secret_refs, ref.project, job_file=job_file, url=secrets_url,
                                     rehearsal=target == "local")
    if secrets:
        say(f"secrets | the VM reads {', '.join(item['name'] for item in secrets)} from Secret Manager "
            f"(project '{ref.project}') into train's environment")
    stage = stage_job(checked, job_file, overrides, engine=engine, target=target,
                      secrets={"project": ref.project, "names": secrets})
    say(f"stage | {stage.uploaded} new of {stage.total} files | {stage.url}")
    def make(node_ref, node_spec):
        return Lifecycle(node_ref, node_spec, job_file=job_file, api_endpoint=api_endpoint, poll_s=min(poll_s, 2.0),
                         on_progress=lambda text: say(f"tpu | {text}"))

    tries = placements(job.tpu, spec)
    fallback = Fallback(ref, spec, tries, make=make, try_wait_s=try_wait_s,
                        on_progress=lambda text: say(f"tpu | {text}"))
    record = RunRecord(job=job.name, job_file=job_file, stage=stage.digest, node=ref.name, zone=ref.zone,
                       project=ref.project, started=time.time())
    made = Controller(fallback, stage, startup_script(stage, rehearsal_python=rehearsal_python), job_file=job_file,
                      recreate=recreate, poll_s=poll_s, create_timeout_s=timeout_s,
                      host_timeout_s=host_timeout_s,
                      keep_tpu=keep_tpu, after_preemption=after_preemption,
                      say=say, out=out, **({"on_step": on_step} if on_step else {}))
    return made, record


def has_gke(job_file: str, overrides) -> bool:
    """Whether the job names a GKE cluster (read from the file alone: validate says what else is wrong)."""
    from tpulaunch.errors import JobFileError
    from tpulaunch.job.load import load_job

    try:
        return load_job(job_file, overrides, env={}).data.get("gke") is not None
    except (JobFileError, AttributeError):
        return False


def jobset_submission(job_file: str, overrides, *, recreate: int, dry_run: bool, warn=None):
    """The job checked, staged (or only named, `dry_run`) and made a JobSet submission (`remote/gke.py`), with its
    stage; a cluster out of reach is refused before anything is staged."""
    from tpulaunch.remote import gke, secret_manager
    from tpulaunch.remote.stage import stage_job
    from tpulaunch.remote.startup import startup_script

    secret_refs = secret_references(job_file, overrides)
    checked = checked_for_tpu(job_file, overrides, rehearsal=False, env=secret_manager.validation_env(secret_refs),
                              warn=warn)
    job = checked.job
    if job.gke is None:
        raise TpuLaunchError(f"--dry-run prints the JobSet of a job with a gke: section; {job_file} runs on a TPU VM",
                             hint=f"tpulaunch rehearse {job_file} runs run's whole TPU VM path on this machine",
                             exit_code=ExitCode.USAGE)
    if not dry_run:
        gke.connect(job.gke.context)  # a cluster out of reach is said before anything is staged
    project = job.gke.project or job.tpu.project
    secrets = [{"name": ref.name, "optional": ref.default is not None} for ref in secret_refs] if dry_run else \
        secret_manager.require(checked.loaded, job, secret_refs, project, job_file=job_file)
    stage = stage_job(checked, job_file, overrides, engine=checked.plan.engine, target="tpu",
                      secrets={"project": project, "names": secrets}, write=not dry_run)
    from tpulaunch.remote.follow import newest_attempt

    base = 0 if dry_run else newest_attempt(stage.model_dir)  # this run's VMs are numbered after the earlier runs'
    return gke.submission(checked, stage, startup_script(stage), recreate=recreate, attempt_base=base), stage


def local_jobset(job_file: str, overrides, *, preempt_at, recreate: int, poll_s: float, python: str,
                 say: Callable[[str], None], out: Callable[[str], None], warn=None):
    """The JobSet `run` would submit, staged for this machine, as local processes under JobSet's failure handling
    (`remote/jobset_rehearsal.py`); local paths stand for the bucket."""
    from tpulaunch.remote import gke
    from tpulaunch.remote.jobset_rehearsal import LocalJobSet
    from tpulaunch.remote.rehearsal import hosts_environment
    from tpulaunch.remote.stage import stage_job
    from tpulaunch.remote.startup import startup_script

    checked = checked_for_tpu(job_file, overrides, rehearsal=True, warn=warn)
    stage = stage_job(checked, job_file, overrides, engine=checked.plan.engine, target="local")
    say(f"stage | {stage.uploaded} new of {stage.total} files | {stage.url}")
    from tpulaunch.remote.follow import newest_attempt

    sub = gke.submission(checked, stage, startup_script(stage, rehearsal_python=python), recreate=recreate,
                         attempt_base=newest_attempt(stage.model_dir))
    return LocalJobSet(sub.manifest, stage.model_dir, say=say, out=out, preempt_at=preempt_at, poll_s=poll_s,
                       hosts_environment=lambda root: hosts_environment(root, preempt_at))


def model_dir_of(job_file: str, overrides) -> str:
    """run.model_dir of the job file, read without checking the rest."""
    from tpulaunch.job.load import load_job

    loaded = load_job(job_file, overrides, env={})
    run = loaded.section("run")
    if run is None:
        raise TpuLaunchError(f"{job_file} has no valid run.model_dir", hint=f"tpulaunch validate {job_file}",
                             exit_code=ExitCode.PROBLEMS)
    return run.model_dir
