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
    $TPU_ZONE, $TPU_PROJECT / $GOOGLE_CLOUD_PROJECT. Set $TPULAUNCH_TPU_DISCOVERY_URL to
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

    checked = read.checked_for_status(job_file, overrides)
    lease, last_run, remote_run = read.model_dir_status(checked, say=obj.say)
    on_gke = checked.loaded.section("gke")
    if on_gke is not None:  # no TPU node of its own: the JobSet, and what its pods write to model_dir
        jobset = read.jobset_of(checked, on_gke)
        if fmt == "json":
            click.echo(json.dumps({"file": job_file, "gke": jobset, "lease": lease, "last_run": last_run,
                                   "remote_run": remote_run}, indent=2, default=str))
        else:
            obj.out.print(f"GKE: {jobset['text']}", highlight=False, markup=False, soft_wrap=True)
            render_lease(obj.out, lease)
            render_last_run(obj.out, last_run)
            render_remote_run(obj.out, remote_run)
        return
    if checked.loaded.section("tpu") is None:
        if fmt == "json":
            click.echo(json.dumps({"file": job_file, "tpu": None, "runs": "locally", "usable": True, "lease": lease,
                                   "last_run": last_run}, indent=2))
        else:
            obj.out.print(f"{job_file}: no tpu: section, so the job runs locally (CPU/GPU); nothing to check",
                          highlight=False)
            render_lease(obj.out, lease)
            render_last_run(obj.out, last_run)
        return

    ref = read.node_ref(checked)
    spinner = None
    if fmt == "text" and wait_s and obj.err.is_terminal:
        spinner = obj.err.status(f"reading TPU node {ref.name}")
        spinner.start()

    def on_wait(waiting, seconds_left):
        message = (f"{waiting.subject} is {waiting.state}{'/' + waiting.health if waiting.health else ''}: "
                   f"waiting (up to {seconds_left:.0f}s more)")
        if spinner is not None:
            spinner.update(message)
        elif fmt == "text":
            obj.err.print(message, highlight=False, soft_wrap=True)

    slices = read.slices_of(checked)
    try:
        if slices > 1:  # one multislice queued resource: each slice's node
            nodes, stack = read.slice_nodes_of(checked, ref, wait_s=wait_s, on_wait=on_wait)
        else:
            node, stack = read.node_of(checked, ref, wait_s=wait_s, on_wait=on_wait)
            nodes = [node]
    finally:
        if spinner is not None:
            spinner.stop()
    usable = all(node.usable for node in nodes)
    if fmt == "json":
        extra = {"problems": [p.to_dict() for p in stack]} if stack else {}
        shown = ({"queued_resource": ref.name, "slices": [node.to_dict() for node in nodes], "usable": usable}
                 if slices > 1 else nodes[0].to_dict())
        click.echo(json.dumps({"file": job_file, **shown, "lease": lease, "last_run": last_run,
                               "remote_run": remote_run, **extra}, indent=2))
    else:
        if slices > 1:
            render_slices(obj.out, ref.name, nodes)
        else:
            render_status(obj.out, nodes[0])
        render_lease(obj.out, lease)
        render_last_run(obj.out, last_run)
        render_remote_run(obj.out, remote_run)
    if any(p.is_error for p in stack):
        if fmt == "json":  # the problems are in the JSON already
            raise AlreadyReported(ExitCode.PROBLEMS)
        raise TpuLaunchError(f"{tpu_words(ref.name, slices)} cannot run this job's TensorFlow: fix the problems above",
                             problems=stack, exit_code=ExitCode.PROBLEMS)
    if not usable:
        raise AlreadyReported(ExitCode.CLUSTER)
