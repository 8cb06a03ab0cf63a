"""What `tpulaunch up` and `down` do: the job's TPU node found (a job whose TensorFlow stack is wrong can still have
its node deleted), created, or looked for in every zone a run may have made it in. The API's refusal of a job value
is located at its key. What is said on the way goes to `say`; what `up` created comes back for the command to show,
what `down` deleted goes to `out` node by node.
"""

from __future__ import annotations

from typing import Callable

from tpulaunch.errors import ExitCode, TpuLaunchError


def node_of(job_file: str, overrides, verb: str, action: str):
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


def zones_to_search(loaded, job_tpu, ref, say) -> list:
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


def create(job_file: str, overrides, *, wait_s: float, say: Callable[[str], None]):
    """The job's TPU created as its tpu: section says and waited for until READY and HEALTHY (`tpu/lifecycle.py`):
    (NodeRef, NodeSpec, the create's outcome). Refused first when this machine cannot drive it."""
    from tpulaunch.checks.stack import refuse_unless_runnable
    from tpulaunch.tpu.lifecycle import Lifecycle, spec_for

    loaded, job_tpu, ref = node_of(job_file, overrides, "creating the TPU of", "create")
    refuse_unless_runnable(loaded, job_file, "creating the TPU of")  # a node this machine cannot drive costs money
    spec = spec_for(job_tpu, loaded.engine)
    life = Lifecycle(ref, spec, job_file=job_file, on_progress=say)
    try:
        outcome = life.create(wait_s=wait_s)
    except TpuLaunchError as error:
        raise located(loaded, error) from None
    return ref, spec, outcome


def found_to_delete(job_file: str, overrides, *, say: Callable[[str], None]):
    """(NodeRef, the job's tpu.slices, the zones looked in, a `Lifecycle` for each zone where the job's node, its
    queued resource or, on several slices, any of the queued resource's nodes is: they can outlive it)."""
    from dataclasses import replace

    from tpulaunch.tpu import multislice
    from tpulaunch.tpu.lifecycle import Lifecycle

    loaded, job_tpu, ref = node_of(job_file, overrides, "deleting the TPU of", "delete")
    slices = multislice.slices_of(job_tpu)
    zones = zones_to_search(loaded, job_tpu, ref, say)
    lives = [Lifecycle(replace(ref, zone=zone), job_file=job_file, on_progress=say, slices=slices) for zone in zones]
    return ref, slices, zones, [life for life in lives if life.read_queued() is not None
                                or any(node is not None for node in life.read_nodes())]


def delete(job_file: str, overrides, *, wait_s: float, say: Callable[[str], None], out: Callable[[str], None]) -> None:
    """`tpulaunch down`: the job's node (and its queued resource; on several slices each of its nodes, also when the
    queued resource is gone) deleted in every zone it is found in, each waited for until gone; one line to `out` for
    each, or one saying there is nothing to delete."""
    from tpulaunch.tpu import multislice
    from tpulaunch.tpu import node as cluster

    ref, slices, zones, found = found_to_delete(job_file, overrides, say=say)
    if not found:
        where = cluster.where(ref) if len(zones) == 1 else f"project '{ref.project}', zones {', '.join(zones)}"
        out(f"{multislice.tpu_words(ref.name, slices)} does not exist in {where}: nothing to delete")
        return
    for life in found:
        outcome = life.delete(wait_s=wait_s)
        suffix = f" after {outcome.seconds:.0f} s" if outcome.changed else ""
        zone = f" in {life.ref.zone}" if life.ref.zone != ref.zone or len(found) > 1 else ""
        out(f"{outcome.message}{zone}{suffix}")
