"""`tpulaunch run JOB` (the job on its TPU VM, supervised from here) and `tpulaunch rehearse JOB` (run's whole
path on this machine). No TensorFlow here: the controller reads files and asks the TPU API. What is checked,
staged and wired before a run is followed is `app/remote.py`'s.
"""

from __future__ import annotations

import time
from typing import Optional

import click

from tpulaunch.app.remote import has_gke, jobset_submission, local_jobset, model_dir_of, staged_controller
from tpulaunch.cli.base import Context, command, job_argument, pass_obj, set_option, warnings_to
from tpulaunch.errors import AlreadyReported, ExitCode, TpuLaunchError

recreate_option = click.option(
    "--recreate", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
    help="Recover from at most N infrastructure failures (preempted, terminated or vanished node, a lost TPU): "
         "delete the node, create it again with the same startup script, resume from the newest checkpoint. "
         "The job's own failures are never retried.")
zone_wait_option = click.option(
    "--zone-wait", "try_wait_s", type=click.FloatRange(min=1), default=600, show_default=True, metavar="SECONDS",
    help="With tpu.zones or tpu.tiers: how long one zone and tier may take to give a READY TPU before the next is "
         "tried (a queued resource still waiting for capacity is deleted); a stockout moves on at once. The last "
         "one waits as long as creating may take (run's --timeout).")
host_timeout_option = click.option(
    "--host-timeout", "host_timeout_s", type=click.FloatRange(min=1), default=900, show_default=True,
    metavar="SECONDS", help="Each host of a READY TPU VM must have started its part (booted, installed, fetched the "
                            "job) within this; one that has not is reported by name and the VM counts as lost.")
after_preemption_option = click.option(
    "--after-preemption", "after_preemption", type=click.Choice(["same-zone", "next-zone"]), default="same-zone",
    show_default=True, help="With tpu.zones: where a recovery from a PREEMPTED node looks first: same-zone, the zone "
                            "it was in; next-zone, the zone after it in tpu.zones (the preempted one last).")
keep_option = click.option("--keep-tpu", is_flag=True, help="Leave the TPU when the run ends (default: delete it).")


def _say(obj: Context):
    return lambda text: obj.err.print(text, highlight=False, markup=False, soft_wrap=True)


def _out(obj: Context):
    return lambda text: obj.out.print(text, highlight=False, markup=False, soft_wrap=True)


def _tellers(obj: Context, job_file: str) -> dict:
    """Where the application layer's lines go: notes and warnings on stderr, progress on stdout."""
    return {"say": _say(obj), "out": _out(obj), "warn": warnings_to(obj.text_out(stderr=True), job_file)}


def _run_on_gke(obj: Context, job_file: str, overrides, *, recreate: int, dry_run: bool, poll_s: float) -> None:
    """The job checked, staged (or only named, --dry-run) and submitted as a JobSet, then followed."""
    from tpulaunch.remote import gke

    say = _say(obj)
    sub, stage = jobset_submission(job_file, overrides, recreate=recreate, dry_run=dry_run,
                                   warn=warnings_to(obj.text_out(stderr=True), job_file))
    if dry_run:
        obj.out.file.write(gke.as_yaml(sub.manifest))
        return
    say(f"stage | {stage.uploaded} new of {stage.total} files | {stage.url}")
    follower = gke.GkeRun(sub, say=say, out=_out(obj), poll_s=poll_s)
    follower.submit()
    try:
        code = follower.follow()
    except KeyboardInterrupt:
        say(f"detached: JobSet '{sub.name}' goes on in the cluster, restarted there by cause")
        say(f"  reattach: tpulaunch run {job_file}    end it: tpulaunch cancel {job_file}")
        raise AlreadyReported(ExitCode.INTERRUPTED) from None
    if code:
        raise AlreadyReported(code)


def _rehearse_on_gke(obj: Context, job_file: str, overrides, *, preempt_at, recreate: int, poll_s: float,
                     python: str) -> None:
    """The JobSet `run` would submit, its pods local processes under JobSet's failure handling
    (`remote/jobset_rehearsal.py`); local paths stand for the bucket."""
    say = _say(obj)
    local = local_jobset(job_file, overrides, preempt_at=preempt_at, recreate=recreate, poll_s=poll_s, python=python,
                         **_tellers(obj, job_file))
    try:
        code = local.run()
    except KeyboardInterrupt:
        say("rehearsal stopped: its pods ended with it; the checkpoints stay in run.model_dir")
        raise AlreadyReported(ExitCode.INTERRUPTED) from None
    if code:
        raise AlreadyReported(code)


def _detached(obj: Context, job_file: str, controller, verb: str = "run") -> None:
    """Ctrl-C: the run goes on; the command that reattaches (the same verb: a rehearsal's run is rehearse's)."""
    say = _say(obj)
    say(f"detached: the run goes on on TPU node '{controller.ref.name}' ({controller.ref.zone})")
    say(f"  reattach: tpulaunch {verb} {job_file}    end it: {controller.down_command()}")
    raise AlreadyReported(ExitCode.INTERRUPTED)


@command("run")
@job_argument
@set_option
@recreate_option
@after_preemption_option
@keep_option
@host_timeout_option
@zone_wait_option
@click.option("--poll", "poll_s", type=click.FloatRange(min=0.05), default=10, show_default=True, metavar="SECONDS",
              help="Read the run's progress and the node's state this often.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=1800, show_default=True,
              metavar="SECONDS", help="Give up waiting for the TPU to be created (a queued resource may wait long).")
@click.option("--dry-run", is_flag=True,
              help="A job with gke: print the JobSet it would submit, as YAML `kubectl apply -f -` takes; nothing is "
                   "staged, submitted or created.")
@pass_obj
def run(obj: Context, job_file: str, overrides, recreate: int, after_preemption: str, keep_tpu: bool,
        host_timeout_s: float, try_wait_s: float, poll_s: float, timeout_s: float, dry_run: bool):
    """Run the job on its TPU VM and supervise it from this machine (a laptop, CI, Cloud Shell), or, for a job
    with a gke: section, submit it to the GKE cluster as a JobSet and follow it (docs/gke.md).

    Validates the job (nothing is created for a job validate refuses), stages it under run.model_dir
    (gs://; content-addressed: a rerun stages nothing new), creates the TPU as `tpulaunch up` does with a
    startup script in its metadata that runs `tpulaunch train` on the VM, then shows the run's progress
    from what it writes to model_dir. Ctrl-C detaches (the run goes on); running the same command again
    reattaches; once a run has ended, a rerun starts a VM of its own (it trains on from the newest checkpoint);
    `tpulaunch down JOB` ends it. The TPU is deleted when the run ends (--keep-tpu keeps it).

    Exit codes: 0 done; the host's own code when the job failed on the VM (1 the job, 70 a crash; never
    retried); 3 the TPU lost with no recovery left (--recreate N), a host that failed its install or did not
    start within --host-timeout; 4 no capacity; 130 detached.

    On GKE the cluster's JobSet controller restarts the job by cause (--recreate N: at most N restarts), so this
    machine need not stay awake: Ctrl-C detaches, the same command reattaches, `tpulaunch cancel JOB` ends it.

    \b
    Examples:
      tpulaunch run job.yaml --recreate 3
      tpulaunch run job.yaml --recreate 3 --after-preemption next-zone   # with tpu.zones
      tpulaunch rehearse job.yaml --preempt-at 12     # the same path on this machine first
      tpulaunch run gke-job.yaml --dry-run | kubectl apply -f -
    """
    from tpulaunch.tpu import api

    if dry_run or has_gke(job_file, overrides):
        _run_on_gke(obj, job_file, overrides, recreate=recreate, dry_run=dry_run, poll_s=poll_s)
        return
    controller, record = staged_controller(job_file, overrides, target="tpu", api_endpoint=api.endpoint(),
                                           recreate=recreate, poll_s=poll_s, timeout_s=timeout_s,
                                           host_timeout_s=host_timeout_s, try_wait_s=try_wait_s, keep_tpu=keep_tpu,
                                           after_preemption=after_preemption, **_tellers(obj, job_file))
    try:
        controller.run(record)
    except KeyboardInterrupt:
        _detached(obj, job_file, controller)


@command("rehearse")
@job_argument
@set_option
@click.option("--preempt-at", "preempt_at", type=click.IntRange(min=1), multiple=True, metavar="STEP",
              help="Preempt the TPU VM when the run reaches this global step (its processes killed, the node "
                   "PREEMPTED). Repeatable.")
@recreate_option
@after_preemption_option
@click.option("--secrets", "secrets_dir", type=click.Path(exists=True, file_okay=False), default=None, metavar="DIR",
              help="A folder that stands for Secret Manager: the file DIR/NAME holds secret NAME, which the VM reads "
                   "for the job's ${NAME}.")
@click.option("--hosts", type=click.IntRange(min=1), default=None, metavar="N",
              help="Hosts per slice (default: as many as tpu.type has).")
@click.option("--poll", "poll_s", type=click.FloatRange(min=0.05), default=0.2, show_default=True, metavar="SECONDS",
              help="Read the run's progress and the node's state this often.")
@keep_option
@host_timeout_option
@zone_wait_option
@pass_obj
def rehearse(obj: Context, job_file: str, overrides, preempt_at, recreate: int, after_preemption: str,
             secrets_dir: Optional[str],
             hosts: Optional[int], poll_s: float, keep_tpu: bool, host_timeout_s: float, try_wait_s: float):
    """`tpulaunch run`'s whole path on this machine, before paying for a TPU.

    A local Cloud TPU API v2 server runs in this process; its TPU VMs are local processes that run the
    node's startup script (each host a process with a scratch folder as its disk, reading the metadata a
    TPU VM host reads). The job is staged, the TPU created, the run followed and recovered exactly as `run`
    does. What stands in: local run.model_dir and data folders for the bucket; this machine's Python
    environment for the VM's install (nothing is installed; tpulaunch's own requirements are checked); this
    machine's CPU for the TPU (the VM runs `train --local`); --secrets DIR for Secret Manager (the job's
    ${NAME}s). With $TPULAUNCH_TPU_API_ENDPOINT set, that server is used instead (it must run TPU VMs:
    `python -m tpulaunch.tpu.local_api --vms DIR`), and Ctrl-C detaches as with `run`. Faults to rehearse
    beside --preempt-at, from the environment: TPULAUNCH_LOCAL_API_STOCKOUT (zones without capacity),
    TPULAUNCH_LOCAL_VM_FAIL_INSTALL and TPULAUNCH_LOCAL_VM_HANG (worker numbers).

    \b
    Examples:
      tpulaunch rehearse job.yaml --set train.steps=20 --preempt-at 12 --recreate 1
      tpulaunch rehearse job.yaml --preempt-at 12 --preempt-at 31 --recreate 2
      tpulaunch rehearse job.yaml --set tpu.type=v4-16 --hosts 2 --preempt-at 7 --recreate 1
    """
    import sys

    from tpulaunch.tpu import api

    if has_gke(job_file, overrides):
        _rehearse_on_gke(obj, job_file, overrides, preempt_at=preempt_at, recreate=recreate, poll_s=poll_s,
                         python=sys.executable)
        return
    external = api.endpoint()
    if external and preempt_at:
        raise TpuLaunchError("--preempt-at needs the rehearsal's own TPU API server",
                             hint=f"unset ${api.ENDPOINT_ENV}, or preempt through the server you started",
                             exit_code=ExitCode.USAGE)
    rehearsal = None
    if not external:
        from tpulaunch.remote.rehearsal import Rehearsal

        rehearsal = Rehearsal(hosts=hosts, secrets_dir=secrets_dir, preempt_at=preempt_at)
        _say(obj)(f"rehearsal | local Cloud TPU API at {rehearsal.endpoint}; TPU VMs are local processes (disks "
                  f"under {rehearsal.root}); local paths stand for the bucket; nothing is installed on the VMs")
    try:
        holder = {}
        on_step = None
        if rehearsal is not None and preempt_at:
            on_step = lambda step: holder["preempt"](step)  # noqa: E731 (the node is known once the job is checked)
        controller, record = staged_controller(
            job_file, overrides, target="local", api_endpoint=external or rehearsal.endpoint, recreate=recreate,
            poll_s=poll_s, timeout_s=600, host_timeout_s=host_timeout_s, try_wait_s=try_wait_s,
            keep_tpu=keep_tpu, after_preemption=after_preemption, rehearsal_python=sys.executable, on_step=on_step,
            secrets_url=rehearsal.server.secret_manager_url if rehearsal is not None else None,
            **_tellers(obj, job_file))
        if on_step is not None:
            holder["preempt"] = rehearsal.preempting(lambda: controller.preempted_node, preempt_at, _say(obj))
        try:
            controller.run(record)
        except KeyboardInterrupt:
            if rehearsal is None:
                _detached(obj, job_file, controller, verb="rehearse")
            _say(obj)("rehearsal stopped: its TPU VMs ended with it; the checkpoints stay in run.model_dir")
            raise AlreadyReported(ExitCode.INTERRUPTED) from None
    finally:
        if rehearsal is not None:
            rehearsal.stop()


@command("logs")
@job_argument
@set_option
@click.option("--host", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="Which host's lines (worker N of the run; 0 is the chief).")
@click.option("--attempt", type=click.IntRange(min=1), default=None, metavar="N",
              help="Which VM of the run (or restart of a JobSet); default: the newest.")
@click.option("--follow", "-f", "keep_following", is_flag=True, help="Keep printing new lines until the host ends.")
@click.option("--poll", "poll_s", type=click.FloatRange(min=0.05), default=5, show_default=True, metavar="SECONDS",
              help="With --follow, read the log this often.")
@pass_obj
def logs(obj: Context, job_file: str, overrides, host: int, attempt: Optional[int], keep_following: bool,
         poll_s: float):
    """Print what a host of the job's remote run (`run` on a TPU VM or on GKE, or `rehearse`) printed, from
    run.model_dir, where each host's lines are kept: no connection to the VM or the cluster is needed.

    \b
    Examples:
      tpulaunch logs job.yaml                 # the chief's lines, newest VM
      tpulaunch logs job.yaml --host 3 -f     # host 3, following
    """
    from tpulaunch.remote.follow import HostLog, host_status, newest_attempt

    model_dir = model_dir_of(job_file, overrides)
    attempt = attempt or newest_attempt(model_dir)
    if not attempt:
        raise TpuLaunchError(f"no remote run has written to {model_dir} yet",
                             hint=f"start one: tpulaunch run {job_file}", exit_code=ExitCode.PROBLEMS)
    log, out = HostLog(model_dir, attempt, host), _out(obj)
    _say(obj)(f"logs | host {host} of VM {attempt} | {log.url}")
    while True:
        for line in log.new_lines():
            out(line)
        status = host_status(model_dir, attempt, host) or {}
        if not keep_following or status.get("exit_code") is not None:
            return
        time.sleep(poll_s)


@command("cancel")
@job_argument
@set_option
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=600, show_default=True,
              metavar="SECONDS", help="How long to wait for the TPU node to be deleted.")
@click.pass_context
def cancel(ctx: click.Context, job_file: str, overrides, timeout_s: float):
    """End the job's remote run and delete what `run` created (its JobSet on GKE, its TPU node otherwise);
    run.model_dir and its checkpoints stay: `tpulaunch run` starts again from the newest one.

    \b
    Examples:
      tpulaunch cancel job.yaml
    """
    from tpulaunch.errors import JobFileError
    from tpulaunch.job.load import load_job

    obj = ctx.ensure_object(Context)
    try:
        loaded = load_job(job_file, overrides, env={})
    except JobFileError:
        loaded = None
    on_gke = loaded.section("gke") if loaded is not None else None
    if on_gke is not None:
        from tpulaunch.remote import gke

        name = str(loaded.data.get("name"))
        deleted = gke.cancel(name, on_gke)
        _say(obj)(f"cancel | JobSet '{_jobset_name(name)}' " + (
            "deleted with its pods; the checkpoints stay in run.model_dir" if deleted
            else f"not found in namespace '{on_gke.namespace}': nothing to cancel"))
        return
    from tpulaunch.cli.lifecycle import down

    ctx.invoke(down, job_file=job_file, overrides=overrides, timeout_s=timeout_s)


def _jobset_name(job_name: str) -> str:
    from tpulaunch.remote.jobset import jobset_name

    return jobset_name(job_name)
