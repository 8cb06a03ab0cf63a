"""What `run`, `rehearse`, `logs` and `cancel` do: the job read and checked for its TPU, its secrets, its stage, the
Controller wired to the Cloud TPU API (`remote/controller.py`) or the JobSet submitted to GKE, the run followed,
and what Ctrl-C leaves; a rehearsal's own TPU API server started, preempting at its steps, and stopped.

No printing here: the commands hand in `say` (notes, stderr) and `out` (progress, stdout) and render the rest. A run
that ends badly or is detached raises `AlreadyReported` with its exit code, once what it says has been said.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional, Sequence

from tpulaunch.errors import AlreadyReported, ExitCode, TpuLaunchError

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


def run(job_file: str, overrides, *, recreate: int, after_preemption: str, keep_tpu: bool, host_timeout_s: float,
        try_wait_s: float, poll_s: float, timeout_s: float, dry_run: bool, say: Callable[[str], None],
        out: Callable[[str], None], warn=None) -> Optional[str]:
    """`tpulaunch run`: the job on its TPU VM, created, followed and recovered by the Controller, or, for a job with
    a gke: section, submitted as a JobSet and followed. Returns the JobSet as YAML with `dry_run` (nothing staged,
    submitted or created), else None once the run has ended well."""
    from tpulaunch.tpu import api

    if dry_run or has_gke(job_file, overrides):
        return _run_on_gke(job_file, overrides, recreate=recreate, dry_run=dry_run, poll_s=poll_s, say=say, out=out,
                           warn=warn)
    controller, record = staged_controller(job_file, overrides, target="tpu", api_endpoint=api.endpoint(),
                                           recreate=recreate, poll_s=poll_s, timeout_s=timeout_s,
                                           host_timeout_s=host_timeout_s, try_wait_s=try_wait_s, keep_tpu=keep_tpu,
                                           after_preemption=after_preemption, say=say, out=out, warn=warn)
    try:
        controller.run(record)
    except KeyboardInterrupt:
        _detached(job_file, controller, say)
    return None


def rehearse(job_file: str, overrides, *, preempt_at: Sequence[int], recreate: int, after_preemption: str,
             secrets_dir: Optional[str], hosts: Optional[int], poll_s: float, keep_tpu: bool, host_timeout_s: float,
             try_wait_s: float, say: Callable[[str], None], out: Callable[[str], None], warn=None,
             install: bool = False) -> None:
    """`tpulaunch rehearse`: run's whole path on this machine. A local Cloud TPU API server (`remote/rehearsal.py`)
    runs for the rehearsal's length, its TPU VMs local processes, preempted at `preempt_at`; with
    $TPULAUNCH_TPU_API_ENDPOINT set, that server is used instead (and Ctrl-C detaches, as with `run`). A job with a
    gke: section rehearses its JobSet as local processes. `install`: the hosts run the startup script's real install
    (a venv, the job's requirements from the package index, the run's wheelhouse) instead of this machine's Python."""
    from tpulaunch.tpu import api

    if has_gke(job_file, overrides):
        _rehearse_on_gke(job_file, overrides, preempt_at=preempt_at, recreate=recreate, poll_s=poll_s,
                         python=None if install else sys.executable, say=say, out=out, warn=warn)
        return
    external = api.endpoint()
    if external and preempt_at:
        raise TpuLaunchError("--preempt-at needs the rehearsal's own TPU API server",
                             hint=f"unset ${api.ENDPOINT_ENV}, or preempt through the server you started",
                             exit_code=ExitCode.USAGE)
    rehearsal = None
    if not external:
        from tpulaunch.remote.rehearsal import Rehearsal

        rehearsal = Rehearsal(hosts=hosts, secrets_dir=secrets_dir, preempt_at=preempt_at, install=install)
        say(f"rehearsal | local Cloud TPU API at {rehearsal.endpoint}; TPU VMs are local processes (disks "
            f"under {rehearsal.root}); local paths stand for the bucket; " + (
                "each host installs the job's requirements as a TPU VM does (a venv, the package index, the run's "
                "wheelhouse)" if install else "nothing is installed on the VMs"))
    try:
        holder = {}
        on_step = None
        if rehearsal is not None and preempt_at:
            on_step = lambda step: holder["preempt"](step)  # noqa: E731 (the node is known once the job is checked)
        controller, record = staged_controller(
            job_file, overrides, target="local", api_endpoint=external or rehearsal.endpoint, recreate=recreate,
            poll_s=poll_s, timeout_s=600, host_timeout_s=host_timeout_s, try_wait_s=try_wait_s,
            keep_tpu=keep_tpu, after_preemption=after_preemption,
            rehearsal_python=None if install else sys.executable, on_step=on_step,
            secrets_url=rehearsal.server.secret_manager_url if rehearsal is not None else None,
            say=say, out=out, warn=warn)
        if on_step is not None:
            holder["preempt"] = rehearsal.preempting(lambda: controller.preempted_node, preempt_at, say)
        try:
            controller.run(record)
        except KeyboardInterrupt:
            if rehearsal is None:
                _detached(job_file, controller, say, verb="rehearse")
            say("rehearsal stopped: its TPU VMs ended with it; the checkpoints stay in run.model_dir")
            raise AlreadyReported(ExitCode.INTERRUPTED) from None
    finally:
        if rehearsal is not None:
            rehearsal.stop()


def logs(job_file: str, overrides, *, host: int, attempt: Optional[int], keep_following: bool, poll_s: float,
         say: Callable[[str], None], out: Callable[[str], None]) -> None:
    """`tpulaunch logs`: what a host of the job's remote run printed, read from run.model_dir, each line to `out`;
    `keep_following`: new lines every `poll_s` until the host ends."""
    from tpulaunch.remote.follow import HostLog, host_status, newest_attempt

    model_dir = model_dir_of(job_file, overrides)
    attempt = attempt or newest_attempt(model_dir)
    if not attempt:
        raise TpuLaunchError(f"no remote run has written to {model_dir} yet",
                             hint=f"start one: tpulaunch run {job_file}", exit_code=ExitCode.PROBLEMS)
    log = HostLog(model_dir, attempt, host)
    say(f"logs | host {host} of VM {attempt} | {log.url}")
    while True:
        for line in log.new_lines():
            out(line)
        status = host_status(model_dir, attempt, host) or {}
        if not keep_following or status.get("exit_code") is not None:
            return
        time.sleep(poll_s)


def cancel(job_file: str, overrides, *, wait_s: float, say: Callable[[str], None],
           out: Callable[[str], None]) -> None:
    """`tpulaunch cancel`: a job with a gke: section has its JobSet deleted; any other its TPU node, as `down` does
    (`app/lifecycle.py`'s `delete`). run.model_dir stays."""
    from tpulaunch.errors import JobFileError
    from tpulaunch.job.load import load_job

    try:
        loaded = load_job(job_file, overrides, env={})
    except JobFileError:
        loaded = None
    on_gke = loaded.section("gke") if loaded is not None else None
    if on_gke is not None:
        from tpulaunch.remote import gke
        from tpulaunch.remote.jobset import jobset_name

        name = str(loaded.data.get("name"))
        deleted = gke.cancel(name, on_gke)
        say(f"cancel | JobSet '{jobset_name(name)}' " + (
            "deleted with its pods; the checkpoints stay in run.model_dir" if deleted
            else f"not found in namespace '{on_gke.namespace}': nothing to cancel"))
        return
    from tpulaunch.app.lifecycle import delete

    delete(job_file, overrides, wait_s=wait_s, say=say, out=out)


def _run_on_gke(job_file: str, overrides, *, recreate: int, dry_run: bool, poll_s: float,
                say: Callable[[str], None], out: Callable[[str], None], warn=None) -> Optional[str]:
    """The job checked, staged (or only named, `dry_run`: its JobSet's YAML returned) and submitted as a JobSet,
    then followed."""
    from tpulaunch.remote import gke

    sub, stage = jobset_submission(job_file, overrides, recreate=recreate, dry_run=dry_run, warn=warn)
    if dry_run:
        return gke.as_yaml(sub.manifest)
    say(f"stage | {stage.uploaded} new of {stage.total} files | {stage.url}")
    follower = gke.GkeRun(sub, say=say, out=out, poll_s=poll_s)
    follower.submit()
    try:
        code = follower.follow()
    except KeyboardInterrupt:
        say(f"detached: JobSet '{sub.name}' goes on in the cluster, restarted there by cause")
        say(f"  reattach: tpulaunch run {job_file}    end it: tpulaunch cancel {job_file}")
        raise AlreadyReported(ExitCode.INTERRUPTED) from None
    if code:
        raise AlreadyReported(code)
    return None


def _rehearse_on_gke(job_file: str, overrides, *, preempt_at, recreate: int, poll_s: float, python: Optional[str],
                     say: Callable[[str], None], out: Callable[[str], None], warn=None) -> None:
    """The JobSet `run` would submit, its pods local processes under JobSet's failure handling
    (`remote/jobset_rehearsal.py`); local paths stand for the bucket."""
    local = local_jobset(job_file, overrides, preempt_at=preempt_at, recreate=recreate, poll_s=poll_s, python=python,
                         say=say, out=out, warn=warn)
    try:
        code = local.run()
    except KeyboardInterrupt:
        say("rehearsal stopped: its pods ended with it; the checkpoints stay in run.model_dir")
        raise AlreadyReported(ExitCode.INTERRUPTED) from None
    if code:
        raise AlreadyReported(code)


def _detached(job_file: str, controller, say: Callable[[str], None], verb: str = "run") -> None:
    """Ctrl-C: the run goes on; the command that reattaches (the same verb: a rehearsal's run is rehearse's)."""
    say(f"detached: the run goes on on {controller.life.described} ({controller.ref.zone})")
    say(f"  reattach: tpulaunch {verb} {job_file}    end it: {controller.down_command()}")
    raise AlreadyReported(ExitCode.INTERRUPTED)


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


def local_jobset(job_file: str, overrides, *, preempt_at, recreate: int, poll_s: float, python: Optional[str],
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
                       hosts_environment=lambda root: hosts_environment(root, preempt_at, install=python is None))


def model_dir_of(job_file: str, overrides) -> str:
    """run.model_dir of the job file, read without checking the rest."""
    from tpulaunch.job.load import load_job

    loaded = load_job(job_file, overrides, env={})
    run = loaded.section("run")
    if run is None:
        raise TpuLaunchError(f"{job_file} has no valid run.model_dir", hint=f"tpulaunch validate {job_file}",
                             exit_code=ExitCode.PROBLEMS)
    return run.model_dir
