"""`tpulaunch status JOB.yaml`: is the job's TPU node there, READY, HEALTHY and of the declared type? Who
holds the lease on its model_dir (`run/lease.py`), and how did its last run end (its run record)?

What it reads is `app/status.py`'s (no TensorFlow import), how it shows `cli/render/status.py`'s.
"""

from __future__ import annotations

import json

import click

from tpulaunch.cli.base import command, job_argument, pass_obj, set_option, text_or_json_option
from tpulaunch.errors import AlreadyReported, ExitCode, TpuLaunchError


@command()
@job_argument
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=0, show_default=True, metavar="SECONDS",
              help="Wait up to SECONDS for a CREATING/STARTING/REPAIRING/RESTARTING node to become READY and HEALTHY.")
@text_or_json_option
@set_option
@pass_obj
def status(obj, job_file, wait_s, fmt, overrides):
    """Show the job's TPU node (on tpu.slices N, each slice's node of its queued resource): state, health, type,
    hosts, endpoints, runtime version; who holds the
    lease on run.model_dir (a live train/evaluate, a stale one, or none); and its last run (the newest
    whole line of its run record).

    The node comes from the job's tpu: section (name, zone, project), else $TPU_NAME,
    $TPU_ZONE, $TPU_PROJECT / $GOOGLE_CLOUD_PROJECT. Set $TPULAUNCH_TPU_API_ENDPOINT to
    ask another TPU API endpoint (an emulator).

    Exit code 0 when the node can run the job, 3 when it cannot (not READY, not HEALTHY,
    another accelerator type, not found, API unreachable: said within $TPULAUNCH_TPU_API_REACH_S, 30 s by
    default), 1 for a job file mistake or a node whose runtime
    version does not run this machine's TensorFlow the job's engine's way (located at tpu.runtime_version,
    else tpu.name).

    \b
    Examples:
      tpulaunch status configs/unet3d_ct.yaml
      tpulaunch status job.yaml --wait 600          # wait while the node is CREATING
      tpulaunch status job.yaml --format json | jq .state
      tpulaunch status job.yaml --set tpu.name=my-other-tpu
    """
    from tpulaunch.app import status as read
    from tpulaunch.cli.render.status import (render_last_run, render_lease, render_remote_run, render_slices,
                                             render_status)
    from tpulaunch.tpu.multislice import tpu_words

    spinner = None

    def on_wait(waiting, seconds_left):
        nonlocal spinner
        message = (f"{waiting.subject} is {waiting.state}{'/' + waiting.health if waiting.health else ''}: "
                   f"waiting (up to {seconds_left:.0f}s more)")
        if fmt == "text" and obj.err.is_terminal:
            if spinner is None:
                spinner = obj.err.status(message)
                spinner.start()
            spinner.update(message)
        elif fmt == "text":
            obj.err.print(message, highlight=False, soft_wrap=True)

    try:
        shown = read.job_status(job_file, overrides, wait_s=wait_s, on_wait=on_wait, say=obj.say)
    except TpuLaunchError as exc:
        if fmt == "json" and exc.exit_code == ExitCode.CLUSTER:
            # No node to show (not found, a queued resource with none yet, the API out of reach, no credentials):
            # a script reading stdout still gets an answer, and the error is said on stderr as ever.
            from tpulaunch.job.secrets import redact  # masked as the same error on stderr is

            click.echo(json.dumps({"file": job_file, "usable": False, "error": {
                "message": redact(exc.message), "hint": redact(exc.hint)}}, indent=2))
        raise
    finally:
        if spinner is not None:
            spinner.stop()
    if fmt == "json":
        click.echo(json.dumps(_as_json(shown), indent=2, default=str))
    else:
        if shown.target == "gke":
            obj.out.print(f"GKE: {shown.jobset['text']}", highlight=False, markup=False, soft_wrap=True)
        elif shown.target == "local":
            obj.out.print(f"{job_file}: no tpu: section, so the job runs locally (CPU/GPU); nothing to check",
                          highlight=False)
        elif shown.slices > 1:
            render_slices(obj.out, shown.name, shown.nodes)
        else:
            render_status(obj.out, shown.nodes[0])
        render_lease(obj.out, shown.lease)
        render_last_run(obj.out, shown.last_run)
        if shown.target != "local":
            render_remote_run(obj.out, shown.remote_run)
    if shown.stack_errors:
        if fmt == "json":  # the problems are in the JSON already
            raise AlreadyReported(ExitCode.PROBLEMS)
        raise TpuLaunchError(f"{tpu_words(shown.name, shown.slices)} cannot run this job's TensorFlow: fix the "
                             "problems above", problems=shown.stack, exit_code=ExitCode.PROBLEMS)
    if not shown.usable:
        raise AlreadyReported(ExitCode.CLUSTER)


def _as_json(shown) -> dict:
    """`status --format json`: the same keys per target as ever (scripts read them)."""
    if shown.target == "gke":
        return {"file": shown.file, "gke": shown.jobset, "lease": shown.lease, "last_run": shown.last_run,
                "remote_run": shown.remote_run}
    if shown.target == "local":
        return {"file": shown.file, "tpu": None, "runs": "locally", "usable": True, "lease": shown.lease,
                "last_run": shown.last_run}
    extra = {"problems": [p.to_dict() for p in shown.stack]} if shown.stack else {}
    nodes = ({"queued_resource": shown.name, "slices": [node.to_dict() for node in shown.nodes],
              "usable": shown.usable} if shown.slices > 1 else shown.nodes[0].to_dict())
    return {"file": shown.file, **nodes, "lease": shown.lease, "last_run": shown.last_run,
            "remote_run": shown.remote_run, **extra}
