"""`tpulaunch up JOB` / `tpulaunch down JOB`: create and delete the job's TPU through the Cloud TPU API v2.

No TensorFlow import: the default runtime version reads the installed TensorFlow's version from
package metadata. google-cloud-tpu is imported only once a command runs (`tpu/api.py`). What they do is
`app/lifecycle.py`'s (`create`, `delete`); here their options are parsed and what they return or tell is shown.
"""

from __future__ import annotations

import click

from tpulaunch.cli.base import command, job_argument, pass_obj, set_option

timeout_option = click.option(
    "--timeout", "timeout_s", type=click.FloatRange(min=0), default=1800, show_default=True, metavar="SECONDS",
    help="Give up waiting after this long (a queued resource may wait for capacity).")


@command()
@job_argument
@set_option
@timeout_option
@pass_obj
def up(obj, job_file: str, overrides, timeout_s: float):
    """Create the job's TPU (tpu: type, zone, project, runtime_version, spot/preemptible/reserved, network) and
    wait until it is READY and HEALTHY.

    Safe to rerun: a READY node of the job's type is left as it is. v5e, v5p and v6e types are created
    through a queued resource (tpu.queued overrides). Prints the hourly list price where tpulaunch knows
    it. Set $TPULAUNCH_TPU_API_ENDPOINT to ask another Cloud TPU API endpoint (an emulator).

    Exit code 0 when the node is READY, 4 when the zone has no capacity or the quota is used up
    (RESOURCE_EXHAUSTED: retry later or elsewhere), 3 for other TPU API failures, 1 for a job file
    mistake or a value the API refused (located in the job file).

    \b
    Examples:
      tpulaunch up job.yaml
      tpulaunch up job.yaml --set tpu.spot=true --set tpu.name=try-spot
      tpulaunch up job.yaml && tpulaunch train job.yaml && tpulaunch down job.yaml
    """
    from tpulaunch.app.lifecycle import create
    from tpulaunch.tpu.prices import price_text

    ref, spec, outcome = create(job_file, overrides, wait_s=timeout_s, say=obj.say)
    status = outcome.status
    if outcome.changed:
        head = f"TPU node '{ref.name}' is READY after {outcome.seconds:.0f} s"
    else:
        head = f"TPU node '{ref.name}' is already READY: nothing to create"
    obj.show(f"{head} ({status.accelerator_type}, {spec.tier}, {status.runtime_version or spec.runtime_version}; "
             f"project '{ref.project}', zone '{ref.zone}'; {status.hosts} host{'s' if status.hosts != 1 else ''})")
    obj.show(f"cost: {price_text(spec.accelerator_type, ref.zone, spec.tier)}")
    obj.show(f"remove it with: tpulaunch down {job_file}")


@command()
@job_argument
@set_option
@timeout_option
@pass_obj
def down(obj, job_file: str, overrides, timeout_s: float):
    """Delete the job's TPU node (and the queued resource of its name), waiting until it is gone.

    The node is looked for where `tpulaunch run` made it (the zone in run.model_dir's run.json), in tpu.zone,
    then in each of tpu.zones; it is deleted in every one of them it is found in.
    Safe to rerun: a node that does not exist is reported, with exit code 0.

    \b
    Examples:
      tpulaunch down job.yaml
    """
    from tpulaunch.app.lifecycle import delete

    delete(job_file, overrides, wait_s=timeout_s, say=obj.say, out=obj.show)
