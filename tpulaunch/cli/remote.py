"""`tpulaunch run JOB` (the job on its TPU VM, supervised from here) and `tpulaunch rehearse JOB` (run's whole
path on this machine). No TensorFlow here: the controller reads files and asks the TPU API.
"""

from __future__ import annotations

import time
from typing import Optional

import click

from tpulaunch.cli.base import Context, command, job_argument, pass_obj, set_option
from tpulaunch.errors import AlreadyReported, ExitCode, TpuLaunchError

recreate_option = click.option(
    "--recreate", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
    help="Recover from at most N infrastructure failures (preempted, terminated or vanished node, a lost TPU): "
         "delete the node, create it again with the same startup script, resume from the newest checkpoint. "
         "The job's own failures are never retried.")
keep_option = click.option("--keep-tpu", is_flag=True, help="Leave the TPU when the run ends (default: delete it).")


def _say(obj: Context):
    return lambda text: obj.err.print(text, highlight=False, markup=False, soft_wrap=True)


def _out(obj: Context):
    return lambda text: obj.out.print(text, highlight=False, markup=False, soft_wrap=True)


LOCAL_PATH_ON_TPU = "local-path-on-tpu"  # validate's rule that a rehearsal waives: its local folders stand for the bucket


def _checked(obj: Context, job_file: str, overrides, *, rehearsal: bool):
    """The job through validate's static checks for its TPU; in a rehearsal, local paths are allowed (they stand
    for the bucket) and the job is then checked as the VM's `train --local` checks it."""
    from tpulaunch.cli.gate import JobRefused, load_checked

    try:
        return load_checked(job_file, overrides, local=False, verb="running", err=obj.text_out(stderr=True))
    except JobRefused as refused:
        errors = [problem for problem in refused.problems if problem.is_error]
        if not rehearsal or not errors or any(problem.code != LOCAL_PATH_ON_TPU for problem in errors):
            raise
    return load_checked(job_file, overrides, local=True, verb="running", err=obj.text_out(stderr=True))


def _controller(obj: Context, job_file: str, overrides, *, target: str, api_endpoint: Optional[str], recreate: int,
                poll_s: float, timeout_s: float, keep_tpu: bool, rehearsal_python: Optional[str] = None,
                on_step=None):
    """The job checked (validate's static checks for its TPU), staged, and a Controller for it."""
    from tpulaunch.checks.engine_rules import job_engine
    from tpulaunch.remote.controller import Controller, RunRecord
    from tpulaunch.remote.stage import stage_job
    from tpulaunch.remote.startup import startup_script
    from tpulaunch.tpu.lifecycle import Lifecycle, spec_for
    from tpulaunch.tpu.node import resolve_node

    say = _say(obj)
    checked = _checked(obj, job_file, overrides, rehearsal=target == "local")
    job = checked.job
    if job.tpu is None:
        raise TpuLaunchError(f"{job_file} has no tpu: section: there is no TPU to run it on",
                             hint="add tpu: {name: ..., zone: ..., project: ..., type: ...}; "
                                  "`tpulaunch train --local` runs it on this machine")
    engine = job_engine(checked.loaded)
    ref = resolve_node(job.tpu)
    spec = spec_for(job.tpu, engine)
    stage = stage_job(checked, job_file, overrides, engine=engine, target=target)
    say(f"stage | {stage.uploaded} new of {stage.total} files | {stage.url}")
    life = Lifecycle(ref, spec, job_file=job_file, api_endpoint=api_endpoint, poll_s=min(poll_s, 2.0),
                     on_progress=lambda text: say(f"tpu | {text}"))
    record = RunRecord(job=job.name, job_file=job_file, stage=stage.digest, node=ref.name, zone=ref.zone,
                       project=ref.project, started=time.time())
    controller = Controller(life, stage, startup_script(stage, rehearsal_python=rehearsal_python), job_file=job_file,
                            recreate=recreate, poll_s=poll_s, create_timeout_s=timeout_s, start_timeout_s=timeout_s,
                            keep_tpu=keep_tpu,
                            say=say, out=_out(obj), **({"on_step": on_step} if on_step else {}))
    return controller, record, ref


def _detached(obj: Context, job_file: str, ref) -> None:
    say = _say(obj)
    say(f"detached: the run goes on on TPU node '{ref.name}' ({ref.zone})")
    say(f"  reattach: tpulaunch run {job_file}    end it: tpulaunch down {job_file}")
    raise AlreadyReported(ExitCode.INTERRUPTED)


@command("run")
@job_argument
@set_option
@recreate_option
@keep_option
@click.option("--poll", "poll_s", type=click.FloatRange(min=0.05), default=10, show_default=True, metavar="SECONDS",
              help="Read the run's progress and the node's state this often.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=1800, show_default=True,
              metavar="SECONDS", help="Give up waiting for the TPU to be created (a queued resource may wait long); a "
                                      "READY VM whose worker 0 has not started the job by then counts as lost.")
@pass_obj
def run(obj: Context, job_file: str, overrides, recreate: int, keep_tpu: bool, poll_s: float, timeout_s: float):
    """Run the job on its TPU VM and supervise it from this machine (a laptop, CI, Cloud Shell).

    Validates the job (nothing is created for a job validate refuses), stages it under run.model_dir
    (gs://; content-addressed: a rerun stages nothing new), creates the TPU as `tpulaunch up` does with a
    startup script in its metadata that runs `tpulaunch train` on the VM, then shows the run's progress
    from what it writes to model_dir. Ctrl-C detaches (the run goes on); running the same command again
    reattaches; `tpulaunch down JOB` ends it. The TPU is deleted when the run ends (--keep-tpu keeps it).

    Exit codes: 0 done; the host's own code when the job failed on the VM (1 the job, 70 a crash; never
    retried); 3 the TPU lost with no recovery left (--recreate N); 4 no capacity; 130 detached.

    \b
    Examples:
      tpulaunch run job.yaml --recreate 3
      tpulaunch rehearse job.yaml --preempt-at 12     # the same path on this machine first
    """
    from tpulaunch.tpu import api

    controller, record, ref = _controller(obj, job_file, overrides, target="tpu", api_endpoint=api.endpoint(),
                                          recreate=recreate, poll_s=poll_s, timeout_s=timeout_s, keep_tpu=keep_tpu)
    try:
        controller.run(record)
    except KeyboardInterrupt:
        _detached(obj, job_file, ref)


@command("rehearse")
@job_argument
@set_option
@click.option("--preempt-at", "preempt_at", type=click.IntRange(min=1), multiple=True, metavar="STEP",
              help="Preempt the TPU VM when the run reaches this global step (its processes killed, the node "
                   "PREEMPTED). Repeatable.")
@recreate_option
@click.option("--hosts", type=click.IntRange(min=1), default=None, metavar="N",
              help="Hosts per slice (default: as many as tpu.type has).")
@click.option("--poll", "poll_s", type=click.FloatRange(min=0.05), default=0.2, show_default=True, metavar="SECONDS",
              help="Read the run's progress and the node's state this often.")
@keep_option
@pass_obj
def rehearse(obj: Context, job_file: str, overrides, preempt_at, recreate: int, hosts: Optional[int], poll_s: float,
             keep_tpu: bool):
    """`tpulaunch run`'s whole path on this machine, before paying for a TPU.

    A local Cloud TPU API v2 server runs in this process; its TPU VMs are local processes that run the
    node's startup script (each host a process with a scratch folder as its disk, reading the metadata a
    TPU VM host reads). The job is staged, the TPU created, the run followed and recovered exactly as `run`
    does. What stands in: local run.model_dir and data folders for the bucket; this machine's Python
    environment for the VM's install (nothing is installed); this machine's CPU for the TPU (the VM runs
    `train --local`). With $TPULAUNCH_TPU_API_ENDPOINT set, that server is used instead (it must run TPU VMs:
    `python -m tpulaunch.tpu.local_api --vms DIR`), and Ctrl-C detaches as with `run`.

    \b
    Examples:
      tpulaunch rehearse job.yaml --set train.steps=20 --preempt-at 12 --recreate 1
      tpulaunch rehearse job.yaml --preempt-at 12 --preempt-at 31 --recreate 2
    """
    import sys

    from tpulaunch.tpu import api

    external = api.endpoint()
    if external and preempt_at:
        raise TpuLaunchError("--preempt-at needs the rehearsal's own TPU API server",
                             hint=f"unset ${api.ENDPOINT_ENV}, or preempt through the server you started",
                             exit_code=ExitCode.USAGE)
    rehearsal = None
    if not external:
        from tpulaunch.remote.rehearsal import Rehearsal

        rehearsal = Rehearsal(hosts=hosts)
        _say(obj)(f"rehearsal | local Cloud TPU API at {rehearsal.endpoint}; TPU VMs are local processes (disks "
                  f"under {rehearsal.root}); local paths stand for the bucket; nothing is installed on the VMs")
    try:
        holder = {}
        on_step = None
        if rehearsal is not None and preempt_at:
            on_step = lambda step: holder["preempt"](step)  # noqa: E731 (the node is known once the job is checked)
        controller, record, ref = _controller(
            obj, job_file, overrides, target="local", api_endpoint=external or rehearsal.endpoint, recreate=recreate,
            poll_s=poll_s, timeout_s=600, keep_tpu=keep_tpu, rehearsal_python=sys.executable, on_step=on_step)
        if on_step is not None:
            holder["preempt"] = rehearsal.preempting(ref, preempt_at, _say(obj))
        try:
            controller.run(record)
        except KeyboardInterrupt:
            if rehearsal is None:
                _detached(obj, job_file, ref)
            _say(obj)("rehearsal stopped: its TPU VMs ended with it; the checkpoints stay in run.model_dir")
            raise AlreadyReported(ExitCode.INTERRUPTED) from None
    finally:
        if rehearsal is not None:
            rehearsal.stop()
