"""`tpulaunch up JOB` / `tpulaunch down JOB`: create and delete the job's TPU through the Cloud TPU API v2.

No TensorFlow import: the default runtime version reads the installed TensorFlow's version from
package metadata. google-cloud-tpu is imported only once a command runs (`tpu/api.py`).
"""

from __future__ import annotations

import click

from tpulaunch.cli.base import command, job_argument, pass_obj, set_option
from tpulaunch.errors import ExitCode, TpuLaunchError

timeout_option = click.option(
    "--timeout", "timeout_s", type=click.FloatRange(min=0), default=1800, show_default=True, metavar="SECONDS",
    help="Give up waiting after this long (a queued resource may wait for capacity).")


def _node_of(job_file: str, overrides, verb: str, action: str):
    """(loaded job, tpu section, NodeRef) for the job, or a located refusal."""
    from tpulaunch.app.gate import JobRefused, load_checked
    from tpulaunch.tpu.node import resolve_node

    # Only the tpu: section decides what is created; other mistakes are validate's.
    try:
        loaded = load_checked(job_file, overrides, verb=verb, sections=("tpu",)).loaded
    except JobRefused as refused:
        # A node whose TensorFlow stack is wrong can still be deleted.
        if action != "delete" or any(not p.code.startswith("tpu-stack-") for p in refused.problems if p.is_error):
            raise
        loaded = refused.loaded
    job_tpu = loaded.section("tpu")
    if job_tpu is None:
        raise TpuLaunchError(f"{job_file} has no tpu: section: there is no TPU to {action}",
                             hint="add tpu: {name: ..., zone: ..., project: ..., type: ...}")
    return loaded, job_tpu, resolve_node(job_tpu)


def located(loaded, error: TpuLaunchError) -> TpuLaunchError:
    """The API's refusal of a job value (an unknown zone, a type the zone lacks, a bad runtime version),
    located at the key in the job file that holds it."""
    if error.exit_code != ExitCode.PROBLEMS or error.problems:
        return error
    text = error.message.lower()
    key = ("runtime_version" if "runtime" in text or "version" in text else
           "type" if "accelerator" in text or "type" in text else
           "zone" if "zone" in text or "location" in text else None)
    if key is None:
        return error
    problem = loaded.problem(("tpu", key), "tpu-api-refused", error.message, error.hint)
    return TpuLaunchError(error.message, hint=error.hint, problems=[problem], exit_code=ExitCode.PROBLEMS)


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
    from tpulaunch.tpu.lifecycle import Lifecycle, spec_for
    from tpulaunch.tpu.prices import price_text

    from tpulaunch.checks.stack import refuse_unless_runnable

    loaded, job_tpu, ref = _node_of(job_file, overrides, "creating the TPU of", "create")
    refuse_unless_runnable(loaded, job_file, "creating the TPU of")  # a node this machine cannot drive costs money
    spec = spec_for(job_tpu, loaded.engine)

    def progress(text: str) -> None:
        obj.err.print(text, highlight=False, markup=False, soft_wrap=True)

    life = Lifecycle(ref, spec, job_file=job_file, on_progress=progress)
    try:
        outcome = life.create(wait_s=timeout_s)
    except TpuLaunchError as error:
        raise located(loaded, error) from None
    status = outcome.status
    if outcome.changed:
        head = f"TPU node '{ref.name}' is READY after {outcome.seconds:.0f} s"
    else:
        head = f"TPU node '{ref.name}' is already READY: nothing to create"
    obj.out.print(f"{head} ({status.accelerator_type}, {spec.tier}, {status.runtime_version or spec.runtime_version}; "
                  f"project '{ref.project}', zone '{ref.zone}'; {status.hosts} host{'s' if status.hosts != 1 else ''})",
                  highlight=False, markup=False, soft_wrap=True)
    obj.out.print(f"cost: {price_text(spec.accelerator_type, ref.zone, spec.tier)}", highlight=False, markup=False,
                  soft_wrap=True)
    obj.out.print(f"remove it with: tpulaunch down {job_file}", highlight=False, markup=False, soft_wrap=True)


def _zones_to_search(loaded, job_tpu, ref, say) -> list:
    """Where the job's node may be: the zone `tpulaunch run`'s record (run.json under run.model_dir) says it made
    it in, tpu.zone, then each of tpu.zones (a run's capacity fallback may have made it in any of them)."""
    from tpulaunch.remote.controller import RunRecord

    zones = []
    model_dir = (loaded.data.get("run") or {}).get("model_dir") if isinstance(loaded.data, dict) else None
    if isinstance(model_dir, str) and model_dir:
        try:
            record = RunRecord.load(model_dir)
        except (TpuLaunchError, OSError) as unread:  # e.g. no credentials for its gs:// bucket: zones still tried
            say(f"tpu | run.json not read ({getattr(unread, 'message', unread)}): looking in the job's zones")
            record = None
        if record is not None and (record.node, record.project) == (ref.name, ref.project) and record.zone:
            zones.append(record.zone)
    zones += [ref.zone, *(getattr(job_tpu, "zones", None) or [])]
    return list(dict.fromkeys(zones))


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
    from dataclasses import replace

    from tpulaunch.tpu import node as cluster
    from tpulaunch.tpu.lifecycle import Lifecycle

    loaded, job_tpu, ref = _node_of(job_file, overrides, "deleting the TPU of", "delete")

    def progress(text: str) -> None:
        obj.err.print(text, highlight=False, markup=False, soft_wrap=True)

    zones = _zones_to_search(loaded, job_tpu, ref, progress)
    lives = [Lifecycle(replace(ref, zone=zone), job_file=job_file, on_progress=progress) for zone in zones]
    found = [life for life in lives if life.read_node() is not None or life.read_queued() is not None]
    if not found:
        where = cluster.where(ref) if len(zones) == 1 else f"project '{ref.project}', zones {', '.join(zones)}"
        obj.out.print(f"TPU node '{ref.name}' does not exist in {where}: nothing to delete", highlight=False,
                      markup=False, soft_wrap=True)
        return
    for life in found:
        outcome = life.delete(wait_s=timeout_s)
        suffix = f" after {outcome.seconds:.0f} s" if outcome.changed else ""
        zone = f" in {life.ref.zone}" if life.ref.zone != ref.zone or len(found) > 1 else ""
        obj.out.print(f"{outcome.message}{zone}{suffix}", highlight=False, markup=False, soft_wrap=True)
