"""What `tpulaunch status JOB.yaml` reads, as data: the job's TPU node (READY, HEALTHY, of the declared type, its
runtime against this machine's TensorFlow; on several slices each slice's node), who holds the lease on its model_dir
(`run/lease.py`), how its last run ended (its run record), the newest remote run under it, and a GKE job's JobSet.

No TensorFlow import: the installed version is read from package metadata; the lease and the record are read
through the store (`tpulaunch/store/`: local or gs://, each read within its timeout). What cannot be read is
"unknown", with why: status answers whatever is out of reach. The rendering is `cli/render/status.py`'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from tpulaunch.errors import TpuLaunchError, first_line


@dataclass(frozen=True)
class Waiting:
    """What `status --wait` is waiting for, as its progress line says it: "<subject> is <state>[/<health>]"."""
    subject: str  # "TPU node 'my-tpu'", "queued resource 'my-tpu' of 2 slices (TPU nodes my-tpu-0, my-tpu-1)"
    state: str
    health: Optional[str] = None


# A queued resource on its way to its nodes (Cloud TPU API v2's QueuedResourceState): worth waiting for.
QUEUED_ON_ITS_WAY = {"CREATING", "ACCEPTED", "PROVISIONING", "WAITING_FOR_RESOURCES", "ACTIVE", "STATE_UNSPECIFIED"}


def _node_waiting(on_wait: Optional[Callable]) -> Optional[Callable]:
    """check_node's on_wait(NodeStatus, seconds_left), told as a `Waiting`."""
    if on_wait is None:
        return None
    return lambda node, left: on_wait(Waiting(f"TPU node '{node.name}'", node.state, node.health), left)


@dataclass
class JobStatus:
    """Everything `status` shows of one job. `target` says which parts are there: "gke" (the JobSet, no node of
    its own), "local" (no tpu: section: nothing to check) or "tpu" (its node, or on several slices each slice's)."""
    file: str
    target: str
    lease: dict
    last_run: dict
    remote_run: Optional[dict]
    jobset: Optional[dict] = None
    name: Optional[str] = None  # tpu: the node's (or the queued resource's) name
    slices: int = 1
    nodes: list = field(default_factory=list)  # NodeStatus per slice
    stack: list = field(default_factory=list)  # the nodes' runtime against this machine's TensorFlow: Problems

    @property
    def usable(self) -> bool:
        return all(node.usable for node in self.nodes)

    @property
    def stack_errors(self) -> bool:
        return any(problem.is_error for problem in self.stack)


def job_status(job_file: str, overrides, *, wait_s: float, on_wait: Optional[Callable] = None,
               say: Callable[[str], None]) -> JobStatus:
    """What `status` shows of the job: its model_dir's lease, last run and remote run, and per its target the
    JobSet or the TPU node(s), waited for up to `wait_s` (`on_wait(Waiting, seconds_left)` at each pause)."""
    checked = checked_for_status(job_file, overrides)
    lease, last_run, remote_run = model_dir_status(checked, say=say)
    shown = JobStatus(file=job_file, target="tpu", lease=lease, last_run=last_run, remote_run=remote_run)
    on_gke = checked.loaded.section("gke")
    if on_gke is not None:  # no TPU node of its own: the JobSet, and what its pods write to model_dir
        shown.target, shown.jobset = "gke", jobset_of(checked, on_gke)
        return shown
    if checked.loaded.section("tpu") is None:
        shown.target = "local"
        return shown
    ref = node_ref(checked)
    shown.name, shown.slices = ref.name, slices_of(checked)
    if shown.slices > 1:  # one multislice queued resource: each slice's node
        shown.nodes, shown.stack = slice_nodes_of(checked, ref, wait_s=wait_s, on_wait=on_wait)
    else:
        node, shown.stack = node_of(checked, ref, wait_s=wait_s, on_wait=on_wait)
        shown.nodes = [node]
    return shown


def checked_for_status(job_file: str, overrides):
    """The job through the gate, where only the tpu: section decides whether the node can be asked about (other
    mistakes are validate's)."""
    from tpulaunch.app.gate import load_checked

    return load_checked(job_file, overrides, verb="checking the TPU of", sections=("tpu",))


def model_dir_status(checked, *, say: Callable[[str], None]) -> tuple:
    """(lease, last run, remote run) of the job's model_dir, each a dict with its "text" (`lease_of`, `last_run_of`,
    `remote_run_of`); `say`: where a torn line of the run record is said."""
    lease = lease_of(checked)
    return lease, last_run_of(checked, say), remote_run_of(checked, lease)


def node_ref(checked):
    """The job's TPU node (`tpu/node.py`'s reference), once this machine's TensorFlow is known to run the job's
    engine on a TPU (refused, located, when not)."""
    from tpulaunch.checks.stack import refuse_unless_runnable
    from tpulaunch.tpu.node import resolve_node

    refuse_unless_runnable(checked.loaded, checked.file, "checking the TPU of")
    return resolve_node(checked.loaded.section("tpu"))


def node_of(checked, ref, *, wait_s: float, on_wait: Optional[Callable] = None):
    """The node as the TPU API has it (waiting up to `wait_s` for one on its way to READY, `on_wait` told each
    time), and the located problems of its runtime against this machine's TensorFlow and the job's engine."""
    from tpulaunch.tpu.node import check_node

    node = check_node(ref, checked.loaded.section("tpu"), wait=wait_s, on_wait=_node_waiting(on_wait))
    return node, _stack_of(checked, ref, [node])


def slices_of(checked) -> int:
    """The job's tpu.slices (1 unless it asks for several)."""
    from tpulaunch.tpu import multislice

    return multislice.slices_of(checked.loaded.section("tpu"))


def slice_nodes_of(checked, ref, *, wait_s: float, on_wait: Optional[Callable] = None, poll_s: Optional[float] = None):
    """On several slices: each slice's node of the job's multislice queued resource (a missing one NOT_FOUND, with
    an error), waited for as `node_of` waits, and the located problems of their runtime. When none of the nodes
    exists, the queued resource's own state says why (one waiting for capacity has no node yet); one on its way to
    its nodes is waited for too, within the same `wait_s`, `on_wait` told its state."""
    from tpulaunch.tpu import api, multislice
    from tpulaunch.tpu import node as cluster
    from tpulaunch.tpu.lifecycle import Lifecycle

    slices = slices_of(checked)
    subject = multislice.tpu_words(ref.name, slices)
    started, pause = time.monotonic(), poll_s or cluster.POLL_S
    while True:
        left = wait_s - (time.monotonic() - started)
        try:
            nodes = cluster.check_slices(ref, checked.loaded.section("tpu"), slices, wait=max(0.0, left),
                                         on_wait=_node_waiting(on_wait))
            return nodes, _stack_of(checked, ref, nodes)
        except api.NodeNotFound:
            queued = Lifecycle(ref, job_file=checked.file, slices=slices).read_queued()
            if queued is None:
                raise
        state = (queued.get("state") or {}).get("state") or "STATE_UNSPECIFIED"
        left = wait_s - (time.monotonic() - started)
        if state not in QUEUED_ON_ITS_WAY:  # FAILED, SUSPENDED...: no wait brings its nodes
            raise api.NodeNotFound(
                f"{subject} is {state} in {cluster.where(ref)}: it will not create its nodes",
                hint=f"`tpulaunch down {checked.file}` deletes it; `tpulaunch up {checked.file}` asks for the slices "
                     "again") from None
        if left <= 0:
            waited = f" after waiting {wait_s:g}s" if wait_s else ""
            raise api.NodeNotFound(
                f"{subject} is {state} in {cluster.where(ref)}: none of its nodes exists yet{waited}",
                hint="Cloud TPU creates its nodes when it has the capacity for all of them; wait with --wait "
                     f"SECONDS, or `tpulaunch down {checked.file}` gives it up") from None
        if on_wait is not None:
            on_wait(Waiting(subject, state), left)
        time.sleep(min(pause, left))
        pause = min(pause * 2, cluster.MAX_POLL_S)


def _stack_of(checked, ref, nodes) -> list:
    """The nodes' runtime (one queued resource's are all alike: the first that has one) against this machine's
    TensorFlow and the job's engine: a job-file (or install) problem, located, exit 1; it replaces the nodes' own
    looser major.minor warning."""
    from tpulaunch.checks.stack import node_problems

    named = next((node for node in nodes if node.runtime_version), nodes[0])
    stack = node_problems(checked.loaded, named.name, named.runtime_version)
    if stack:
        for node in nodes:
            node.findings = [f for f in node.findings if f.code != "runtime-version-mismatch"]
    return stack


def lease_of(checked) -> dict:
    """{"model_dir", "state": held | stale | released | none | unknown, "holder": the lease as written,
    "renewed_s_ago", "text"} for run.model_dir; "unknown" (with why) when the job names none or it cannot be read."""
    import time

    from tpulaunch.run import lease as leases

    run = checked.loaded.section("run")
    model_dir = getattr(run, "model_dir", None)
    if not model_dir:
        return {"model_dir": None, "state": "unknown", "holder": None, "holder_gone": False, "renewed_s_ago": None,
                "text": "unknown (the job has no valid run.model_dir)"}
    try:
        data = leases.read_lease(model_dir)
    except Exception as exc:  # a corrupt lease, an unreadable model_dir, no credentials for gs://
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {first_line(exc)}"
        return {"model_dir": model_dir, "state": "unknown", "holder": None, "holder_gone": False, "renewed_s_ago": None,
                "text": f"unknown ({message})"}
    now = time.time()
    state = leases.lease_state(data, now)
    return {"model_dir": model_dir, "state": state, "holder": data,
            "holder_gone": state == "held" and leases.holder_gone(data),
            "renewed_s_ago": round(now - data["renewed"], 3) if data else None, "text": leases.describe(data, now)}


def last_run_of(checked, say: Callable[[str], None]) -> dict:
    """{"state": "recorded" | "none" | "unknown", "record": the newest whole record (or None), "records": how many,
    "skipped": line numbers that are not whole records, "text"} from run.model_dir's run record. A torn line
    is skipped, said through `say`; an unreadable record is "unknown" with why, never a failure of status."""
    from tpulaunch.run.record import RECORD_FILE, read_records, skipped_text

    run = checked.loaded.section("run")
    model_dir = getattr(run, "model_dir", None)
    empty = {"state": "unknown", "record": None, "records": 0, "skipped": []}
    if not model_dir:
        return {**empty, "text": "unknown (the job has no valid run.model_dir)"}
    path = f"{model_dir.rstrip('/')}/{RECORD_FILE}"
    try:
        text = read_record_file(model_dir)
    except Exception as exc:  # an unreachable bucket, no credentials, an unreadable file
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {first_line(exc)}"
        return {**empty, "text": f"unknown ({message})"}
    if text is None:
        return {**empty, "state": "none", "text": "none (no run recorded yet)"}
    skipped = []
    records = read_records(text.splitlines(), on_skipped=lambda number, why: skipped.append((number, why)))
    if skipped:
        say(skipped_text(path, skipped))
    if not records:
        return {**empty, "state": "none", "skipped": [n for n, _ in skipped], "text": "none (no whole record)"}
    last = records[-1]
    steps = last.get("steps") if isinstance(last.get("steps"), dict) else {}
    text = (f"{last.get('command')} {last.get('outcome')}, step {steps.get('from')} to {steps.get('to')}, "
            f"ended {last.get('end')}")
    return {"state": "recorded", "record": last, "records": len(records), "skipped": [n for n, _ in skipped],
            "text": text}


def read_record_file(model_dir: str):
    """model_dir's run record as text (None when there is none), without TensorFlow: through the store, which
    answers a gs:// read within its timeout."""
    from tpulaunch import store
    from tpulaunch.run.record import RECORD_FILE

    found = store.read(f"{model_dir.rstrip('/')}/{RECORD_FILE}")
    return None if found is None else found.data.decode("utf-8", errors="replace")


def remote_run_of(checked, lease: dict) -> dict:
    """The newest `run`/`rehearse` under model_dir (its VM, hosts, step, checkpoint), or why it is unknown: not
    read where the lease could not be (the same store: its reason, without a second wait)."""
    from tpulaunch.remote.follow import run_summary, summary_text

    run = checked.loaded.section("run")
    if run is None:
        return {"text": "unknown (the job has no valid run.model_dir)"}
    if lease.get("state") == "unknown":
        return {"text": lease.get("text", "unknown")}
    try:
        summary = run_summary(run.model_dir)
    except Exception as exc:  # noqa: BLE001 — an unreachable bucket, no credentials: status still answers
        return {"text": f"unknown ({getattr(exc, 'message', None) or first_line(exc)})"}
    return {**(summary or {}), "text": summary_text(summary)}


def jobset_of(checked, on_gke) -> dict:
    """The job's JobSet as the cluster has it: its state and restarts, or why it is unknown."""
    from tpulaunch.remote import gke

    name = gke.jobset.jobset_name(str(checked.loaded.data.get("name")))
    try:
        found = gke.read(name, on_gke)
    except TpuLaunchError as exc:
        return {"name": name, "state": "unknown", "text": f"JobSet '{name}': unknown ({exc.message})"}
    if found is None:
        return {"name": name, "state": "none", "text": f"JobSet '{name}': none in namespace '{on_gke.namespace}'"}
    state = gke.state_of(found)
    restarts = int((found.get("status") or {}).get("restarts") or 0)
    limit = found.get("spec", {}).get("failurePolicy", {}).get("maxRestarts")
    return {"name": name, "state": state, "restarts": restarts,
            "text": f"JobSet '{name}' ({on_gke.namespace}): {state} | {restarts} of at most {limit} restarts"}
