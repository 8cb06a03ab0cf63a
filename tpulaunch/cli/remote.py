"""`tpulaunch run JOB` (the job on its TPU VM, supervised from here) and `tpulaunch rehearse JOB` (run's whole
path on this machine), `logs` and `cancel`: their options parsed, one call into `app/remote.py` (what each does:
checked, staged, wired, followed, detached) and its lines shown. No TensorFlow here.
"""

from __future__ import annotations

from typing import Optional

import click

from tpulaunch.app import remote as app_remote
from tpulaunch.cli.base import Context, command, job_argument, pass_obj, set_option, warnings_to

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


def _tellers(obj: Context, job_file: str) -> dict:
    """Where the application layer's lines go: notes and warnings on stderr, progress on stdout."""
    return {"say": obj.say, "out": obj.show, "warn": warnings_to(obj.text_out(stderr=True), job_file)}


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
    manifest = app_remote.run(job_file, overrides, recreate=recreate, after_preemption=after_preemption,
                              keep_tpu=keep_tpu, host_timeout_s=host_timeout_s, try_wait_s=try_wait_s, poll_s=poll_s,
                              timeout_s=timeout_s, dry_run=dry_run, **_tellers(obj, job_file))
    if manifest is not None:
        obj.out.file.write(manifest)


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
@click.option("--install", is_flag=True,
              help="Each host installs the job's requirements as a TPU VM does (python3 -m venv, pip from the "
                   "package index, the run's wheelhouse kept under run.model_dir and reused by later hosts and "
                   "recreated VMs), with this machine's base Python as the image's python3; the run record's "
                   "install_s and installed_from say what it took. Minutes and ~2 GB per host without a wheelhouse.")
@keep_option
@host_timeout_option
@zone_wait_option
@pass_obj
def rehearse(obj: Context, job_file: str, overrides, preempt_at, recreate: int, after_preemption: str,
             secrets_dir: Optional[str], hosts: Optional[int], poll_s: float, install: bool, keep_tpu: bool,
             host_timeout_s: float, try_wait_s: float):
    """`tpulaunch run`'s whole path on this machine, before paying for a TPU.

    A local Cloud TPU API v2 server runs in this process; its TPU VMs are local processes that run the
    node's startup script (each host a process with a scratch folder as its disk, reading the metadata a
    TPU VM host reads). The job is staged, the TPU created, the run followed and recovered exactly as `run`
    does. What stands in: local run.model_dir and data folders for the bucket; this machine's Python
    environment for the VM's install (nothing is installed; tpulaunch's own requirements are checked), or with
    --install the VM's real install, into a venv of this machine's base Python, from the package index; this
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
      tpulaunch rehearse job.yaml --install --preempt-at 12 --recreate 1   # the VM's install too
    """
    app_remote.rehearse(job_file, overrides, preempt_at=preempt_at, recreate=recreate,
                        after_preemption=after_preemption, secrets_dir=secrets_dir, hosts=hosts, poll_s=poll_s,
                        keep_tpu=keep_tpu, host_timeout_s=host_timeout_s, try_wait_s=try_wait_s, install=install,
                        **_tellers(obj, job_file))


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
    app_remote.logs(job_file, overrides, host=host, attempt=attempt, keep_following=keep_following, poll_s=poll_s,
                    say=obj.say, out=obj.show)


@command("cancel")
@job_argument
@set_option
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), default=600, show_default=True,
              metavar="SECONDS", help="How long to wait for the TPU node to be deleted.")
@pass_obj
def cancel(obj: Context, job_file: str, overrides, timeout_s: float):
    """End the job's remote run and delete what `run` created (its JobSet on GKE, its TPU node otherwise);
    run.model_dir and its checkpoints stay: `tpulaunch run` starts again from the newest one.

    \b
    Examples:
      tpulaunch cancel job.yaml
    """
    app_remote.cancel(job_file, overrides, wait_s=timeout_s, say=obj.say, out=obj.show)
