"""Create and delete the job's TPU through the Cloud TPU API v2: `up`, `down`, and recovery's recreate.

What is created comes from the job's `tpu:` section (`spec_for`): the accelerator type, the runtime
version (default: the installed TensorFlow's `tpu-vm-tf-X.Y.Z[-pod]-{se|pjrt}`), spot / preemptible /
reserved, the network. Types of the generations whose Cloud TPU guides create them through queued
resources (v5e, v5p, v6e: https://cloud.google.com/tpu/docs/queued-resources,
https://cloud.google.com/tpu/docs/v5e, .../v5p, .../v6e) are asked for as a queued resource of the
same name as the node; older ones (v2, v3, v4) as a plain node. `tpu.queued: true|false` overrides.
A job on `tpu.slices: N` (N > 1) is one queued resource of N nodes (its `multislice_params`), which Cloud TPU names
`<node name>-0 … -(N-1)` (`tpu/multislice.py`); they are waited for, and deleted, together.

`tpulaunch run` creates through `Fallback`: `tpu.zones` and `tpu.tiers` tried in order (each tier in every
zone) when one refuses for capacity (a stockout, no quota), with a bounded wait for each try.

Both directions are idempotent: `create` on a READY node of the right type does nothing, `delete` on
a missing node says so. A create that fails or times out after the API accepted it checks for what
it left behind and names it, with the `tpulaunch down` that removes it: nothing is leaked silently.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Tuple

from tpulaunch.errors import ExitCode, TpuLaunchError
from tpulaunch.tpu import api, multislice
from tpulaunch.tpu import node as cluster

QUEUED_GENERATIONS = ("v5litepod", "v5e", "v5p", "v6e")
CREATE_TIMEOUT_S = 1800.0  # a queued resource can wait long for capacity; `up --timeout` changes it
# Queued-resource states that will not turn ACTIVE by themselves.
QR_FAILED = {"FAILED", "SUSPENDED", "SUSPENDING"}

Progress = Callable[[str], None]
# Compute Engine's node metadata key that lets a VM's hosts set their guest attributes (`guest_attributes` reads)
GUEST_ATTRIBUTES_KEY = "enable-guest-attributes"


@dataclass(frozen=True)
class NodeSpec:
    """The node `up` creates, as the job's tpu: section asks."""

    accelerator_type: str
    runtime_version: str
    spot: bool = False
    preemptible: bool = False
    reserved: bool = False
    network: Optional[str] = None
    subnetwork: Optional[str] = None
    queued: bool = False
    # The node's metadata (`tpulaunch run`: its startup-script, which every host runs when it boots), as pairs.
    metadata: tuple = ()
    slices: int = 1  # nodes of this type, one multislice queued resource (tpu.slices)

    @property
    def tier(self) -> str:
        return "spot" if self.spot else "preemptible" if self.preemptible else "reserved" if self.reserved else "on-demand"


def uses_queued_resource(accelerator_type: str, setting: Optional[bool] = None) -> bool:
    """Whether the type is created through a queued resource (`tpu.queued` wins when set)."""
    if setting is not None:
        return bool(setting)
    return accelerator_type.split("-")[0] in QUEUED_GENERATIONS


def default_runtime(accelerator_type: str, engine: str, tf_version: Optional[str]) -> Optional[str]:
    """The TPU software version for the installed TensorFlow (https://cloud.google.com/tpu/docs/runtimes:
    `tpu-vm-tf-x.y.z[-pod][-{se|pjrt}]`): the runtime the job's engine declares (`EngineAbout.on_tpu.runtime`:
    TPUEstimator's sessions need the stream executor, se), -pod on a multi-host slice; a TensorFlow newer than
    the newest image (a tensorflow-tpu wheel that brings libtpu itself) gets the generation's base image
    (`tpu/stack.py` holds those facts)."""
    from tpulaunch.seam.registry import about
    from tpulaunch.tpu.types import lookup

    found, stack = lookup(accelerator_type), about(engine).stack()
    # No TensorFlow here: TensorFlow's stack has no image to name; an engine on a base image (jax) needs none.
    version = stack.version_tuple(tf_version) if tf_version and re.match(r"^\d+\.\d+\.\d+$", tf_version) else None
    return stack.default_runtime(about(engine).on_tpu.runtime, version,
                                 hosts=found.hosts if found else None,
                                 generation=found.generation.name if found else None)


def spec_for(job_tpu, engine: str) -> NodeSpec:
    """The NodeSpec for a job's `tpu:` section; TpuLaunchError when no runtime version can be chosen."""
    runtime = getattr(job_tpu, "runtime_version", None) or default_runtime(
        job_tpu.type, engine, cluster.installed_tensorflow_version())
    if not runtime:
        raise TpuLaunchError(
            "tpu.runtime_version is not set and no TensorFlow is installed to choose one",
            hint="set tpu.runtime_version, e.g. tpu-vm-tf-2.15.1-se (https://cloud.google.com/tpu/docs/runtimes)")
    spec = NodeSpec(accelerator_type=job_tpu.type, runtime_version=runtime,
                    spot=bool(getattr(job_tpu, "spot", False)), preemptible=bool(getattr(job_tpu, "preemptible", False)),
                    reserved=bool(getattr(job_tpu, "reserved", False)), network=getattr(job_tpu, "network", None),
                    subnetwork=getattr(job_tpu, "subnetwork", None),
                    slices=multislice.slices_of(job_tpu),
                    # Cloud TPU makes several slices of one job only as a queued resource's multislice_params
                    queued=multislice.slices_of(job_tpu) > 1
                    or uses_queued_resource(job_tpu.type, getattr(job_tpu, "queued", None)))
    tiers = getattr(job_tpu, "tiers", None)
    return with_tier(spec, tiers[0]) if tiers else spec  # `up` creates the first tier tpu.tiers lists


TIERS = ("spot", "preemptible", "reserved", "on-demand")


def with_tier(spec: NodeSpec, tier: str) -> NodeSpec:
    """The spec asking for `tier` (one of TIERS) instead of its own."""
    assert tier in TIERS, tier
    return replace(spec, spot=tier == "spot", preemptible=tier == "preemptible", reserved=tier == "reserved")


class NotReadyInTime(TpuLaunchError):
    """The node was not READY within the wait asked for (it may still come: a queued resource waiting)."""


@dataclass
class Outcome:
    """What `create`/`delete` did: `changed` False when there was nothing to do."""

    changed: bool
    status: Optional[cluster.NodeStatus] = None
    seconds: float = 0.0
    message: str = ""


class Lifecycle:
    """Create, wait for and delete one node (and its queued resource) through the v2 API.

    Args:
        ref: the node (from `cluster.resolve_node`).
        spec: what to create (from `spec_for`); None for `delete` only.
        job_file: named in messages (`tpulaunch down JOB`).
        api_endpoint: the v2 endpoint (None: $TPULAUNCH_TPU_API_ENDPOINT, else Google's).
        poll_s: first pause between reads while waiting (doubles up to cluster.MAX_POLL_S).
        on_progress: told each new state while waiting ("CREATING", "WAITING_FOR_RESOURCES"...).
        slices: the job's tpu.slices, for a `delete` without a spec (`down`: its nodes are found by their names).
    """

    def __init__(self, ref: cluster.NodeRef, spec: Optional[NodeSpec] = None, *, job_file: str = "JOB.yaml",
                 api_endpoint: Optional[str] = None, timeout: float = cluster.REQUEST_TIMEOUT_S,
                 attempts: int = cluster.ATTEMPTS, backoff_s: float = cluster.BACKOFF_S, poll_s: float = cluster.POLL_S,
                 on_progress: Progress = lambda text: None, should_stop: Callable[[], bool] = lambda: False,
                 slices: int = 1):
        if ref.local or ref.direct:
            raise TpuLaunchError(f"TPU '{ref.name}' is not a node the TPU API manages: nothing to create or delete",
                                 hint="set tpu.name to the node's name (and tpu.zone, tpu.project)")
        self.ref, self.spec, self.job_file = ref, spec, job_file
        self.api_endpoint = api_endpoint
        self.timeout, self.attempts, self.backoff_s, self.poll_s = timeout, attempts, backoff_s, poll_s
        self.on_progress = on_progress
        self.should_stop = should_stop
        self._slices = slices
        self._client = None

    # ------------------------------------------------------------------ reading

    @property
    def client(self):
        if self._client is None:
            self._client = api.client(self.api_endpoint)
        return self._client

    @property
    def parent(self) -> str:
        return f"projects/{self.ref.project}/locations/{self.ref.zone}"

    @property
    def qr_name(self) -> str:
        return f"{self.parent}/queuedResources/{self.ref.name}"

    def _request(self, fn, what: str, subject: Optional[str] = None):
        return cluster.with_retries(self.ref, fn, what=what, attempts=self.attempts, backoff_s=self.backoff_s,
                                    subject=subject)

    @property
    def slices(self) -> int:
        return self.spec.slices if self.spec is not None else self._slices

    @property
    def described(self) -> str:
        """The job's TPU in words: its node, or the queued resource of its slices and their nodes."""
        return multislice.tpu_words(self.ref.name, self.slices)

    @property
    def node_names(self) -> List[str]:
        """The nodes of the job's TPU: its node, or on several slices the multislice queued resource's N nodes."""
        return multislice.slice_node_names(self.ref.name, self.slices)

    def read_node(self, name: Optional[str] = None) -> Optional[dict]:
        """The node `name` (default: the first of `node_names`, slice 0's on several) as the API's JSON names it, or
        None when it does not exist."""
        full = f"{self.parent}/nodes/{name or self.node_names[0]}"
        try:
            return self._request(lambda: api.to_dict(self.client.get_node(
                name=full, timeout=self.timeout, retry=None)), "reading")
        except api.NodeNotFound:
            return None

    def read_nodes(self) -> List[Optional[dict]]:
        """Each of `node_names`, None for one that does not exist."""
        return [self.read_node(name) for name in self.node_names]

    def guest_attributes(self, namespace: str) -> List[Dict[str, str]]:
        """What each host of the node (of each slice's, slice after slice) set of itself under `namespace` of its
        guest attributes (key -> value, in worker order: the API's order when no workers are named); a node that is
        gone adds none."""
        found: List[Dict[str, str]] = []
        for name in self.node_names:
            request = {"name": f"{self.parent}/nodes/{name}", "query_path": f"{namespace}/"}
            try:
                answer = self._request(lambda: api.to_dict(self.client.get_guest_attributes(
                    request=request, timeout=self.timeout, retry=None)), "reading")
            except api.NodeNotFound:
                continue
            found += [{item.get("key"): item.get("value")
                       for item in (entry.get("queryValue") or {}).get("items") or []}
                      for entry in answer.get("guestAttributes") or []]
        return found

    def read_queued(self) -> Optional[dict]:
        """The queued resource of the node's name, or None."""
        try:
            return self._request(lambda: api.to_dict(self.client.get_queued_resource(
                name=self.qr_name, timeout=self.timeout, retry=None)), "reading", self._qr_subject)
        except api.NodeNotFound:
            return None

    @property
    def _qr_subject(self) -> str:
        return f"queued resource '{self.ref.name}'"

    def status(self, node: dict) -> cluster.NodeStatus:
        return cluster._status_from(self.ref, node, self.spec.accelerator_type if self.spec else None)

    # ------------------------------------------------------------------ create

    def create(self, *, wait_s: float = CREATE_TIMEOUT_S) -> Outcome:
        """Create the node (or its queued resource) and wait until it is READY and HEALTHY.

        Idempotent: a READY node of the spec's type is left alone (`changed` False); one on its way
        (CREATING...) is waited for. Raises TpuLaunchError (NoCapacity for a stockout or no quota)
        naming whatever a failed create left behind.
        """
        assert self.spec is not None, "create needs a NodeSpec"
        started = time.monotonic()
        existing = self.read_node()
        if existing is not None:
            status = self.status(existing)
            if status.accelerator_type and status.accelerator_type != self.spec.accelerator_type:
                raise TpuLaunchError(
                    f"TPU node '{self.ref.name}' already exists as a {status.accelerator_type}, but the job's tpu.type "
                    f"is {self.spec.accelerator_type}",
                    hint=f"remove it with `tpulaunch down {self.job_file}` first, or set tpu.name to another node",
                    exit_code=ExitCode.CLUSTER)
            if status.state in cluster.RECREATE_STATES or status.state in cluster.DEAD_STATES:
                raise TpuLaunchError(
                    f"TPU node '{self.ref.name}' exists but is {status.state}",
                    hint=f"`tpulaunch down {self.job_file}` then `tpulaunch up {self.job_file}` creates it anew"
                         + (f"; or start it: `gcloud compute tpus tpu-vm start {self.ref.name} --zone {self.ref.zone}`"
                            if status.state in ("STOPPED", "STOPPING") else ""),
                    exit_code=ExitCode.CLUSTER)
            if status.state == "READY" and status.health == "HEALTHY" and all(
                    node is not None and node.get("state") == "READY" for node in self.read_nodes()[1:]):
                return Outcome(False, status, 0.0, f"TPU node '{self.ref.name}' is already READY")
            self.on_progress(f"TPU node '{self.ref.name}' exists and is {_state(status)}: waiting for READY")
            return Outcome(True, self._wait_ready(None, started, wait_s), time.monotonic() - started)
        operation = self._start_create(started)
        status = self._wait_ready(operation, started, wait_s)
        return Outcome(True, status, time.monotonic() - started)

    def _node_message(self):
        from google.cloud import tpu_v2

        spec = self.spec
        node = tpu_v2.Node(accelerator_type=spec.accelerator_type, runtime_version=spec.runtime_version,
                           labels={"created-by": "tpulaunch"})
        if not spec.queued:  # a queued resource says spot/reserved by its own tier instead
            node.scheduling_config = tpu_v2.SchedulingConfig(spot=spec.spot, preemptible=spec.preemptible,
                                                             reserved=spec.reserved)
        if spec.metadata:
            node.metadata = dict(spec.metadata)
        if spec.network or spec.subnetwork:
            node.network_config = tpu_v2.NetworkConfig(network=spec.network or "", subnetwork=spec.subnetwork or "")
        return node

    def _start_create(self, started: float):
        """Send the create request; the long-running operation, or None when the node exists anyway."""
        from google.cloud import tpu_v2

        spec = self.spec
        how = (f"a queued resource of {spec.slices} slices" if spec.slices > 1 else
               "a queued resource" if spec.queued else "a node")
        self.on_progress(f"creating TPU node '{self.ref.name}' ({spec.accelerator_type}, {spec.tier}, "
                         f"{spec.runtime_version}) as {how} in {cluster.where(self.ref)}")
        if spec.queued:
            node_spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=self.parent, node=self._node_message())
            if spec.slices > 1:  # instead of node_id: N nodes named <prefix>-0 … -(N-1)
                node_spec.multislice_params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
                    node_count=spec.slices, node_id_prefix=self.ref.name)
            else:
                node_spec.node_id = self.ref.name
            resource = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[node_spec]))
            if spec.spot or spec.preemptible:
                resource.spot = tpu_v2.QueuedResource.Spot()
            elif spec.reserved:
                resource.guaranteed = tpu_v2.QueuedResource.Guaranteed(reserved=True)

            def send():
                return self.client.create_queued_resource(parent=self.parent, queued_resource_id=self.ref.name,
                                                          queued_resource=resource, timeout=self.timeout, retry=None)
            subject = self._qr_subject
        else:
            def send():
                return self.client.create_node(parent=self.parent, node_id=self.ref.name, node=self._node_message(),
                                               timeout=self.timeout, retry=None)
            subject = f"TPU node '{self.ref.name}'"
        try:
            # One try: a create that timed out may have been accepted, and a second would then fail as a duplicate.
            return api.call(send, what="creating", subject=subject, where=cluster.where(self.ref))
        except api._Transient as problem:
            left = self._leftovers()
            if left:  # accepted after all: wait for it like any create
                self.on_progress(f"the create request got no answer ({problem}), but {left} exists: waiting for it")
                return None
            raise TpuLaunchError(
                f"creating TPU node '{self.ref.name}' failed: {problem}; nothing was created (checked)",
                hint="retry `tpulaunch up`; check the endpoint ($TPULAUNCH_TPU_API_ENDPOINT) and your network",
                exit_code=ExitCode.CLUSTER) from None
        except TpuLaunchError as refused:
            if "already exists" in refused.message.lower() or "alreadyexists" in refused.message.lower():
                return None  # a create from another run won the race: wait for that node
            raise

    def _wait_ready(self, operation, started: float, wait_s: float) -> cluster.NodeStatus:
        """Poll until READY and HEALTHY; on failure or timeout, name what is left and how to remove it."""
        pause = self.poll_s
        seen = None
        try:
            while True:
                if operation is not None and self._request(operation.done, "creating"):
                    error = operation.exception()
                    if error is not None:
                        raise api.classify(error, what="creating", subject=f"TPU node '{self.ref.name}'",
                                           where=cluster.where(self.ref))
                    operation = None
                if self.spec.queued:
                    queued = self.read_queued()
                    qr_state = ((queued or {}).get("state") or {}).get("state")
                    if qr_state in QR_FAILED:
                        raise self._queued_failure(queued, qr_state)
                else:
                    qr_state = None
                statuses = [self.status(node) if node is not None else None for node in self.read_nodes()]
                ready = [status is not None and status.state == "READY" and status.health == "HEALTHY"
                         for status in statuses]
                if all(ready):
                    return statuses[0]
                # the first node not READY yet says where the create is (all of them on one slice)
                status = statuses[ready.index(False)]
                now = _state(status) if status else (f"queued resource {qr_state}" if qr_state else "not created yet")
                if len(statuses) > 1:
                    now = f"{sum(ready)} of {len(statuses)} slices READY, {self.node_names[ready.index(False)]} {now}"
                if status is not None and status.state in cluster.RECREATE_STATES - {"NOT_FOUND"}:
                    raise TpuLaunchError(f"TPU node '{self.ref.name}' became {status.state} while it was being created",
                                         exit_code=ExitCode.CLUSTER)
                if now != seen:
                    self.on_progress(f"TPU node '{self.ref.name}': {now} ({time.monotonic() - started:.0f} s)")
                    seen = now
                left = wait_s - (time.monotonic() - started)
                if left <= 0:
                    raise NotReadyInTime(f"TPU node '{self.ref.name}' was not READY after {wait_s:g} s (it is {now})",
                                         hint="wait longer with `tpulaunch up --timeout SECONDS`",
                                         exit_code=ExitCode.CLUSTER)
                if cluster.sleep_unless(min(pause, left), self.should_stop):
                    raise TpuLaunchError(f"stopped while TPU node '{self.ref.name}' was being created (it is {now})",
                                         exit_code=ExitCode.INTERRUPTED)
                pause = min(pause * 2, cluster.MAX_POLL_S)
        except TpuLaunchError as failed:
            raise self._with_leftovers(failed) from None

    def _queued_failure(self, queued: dict, qr_state: str) -> TpuLaunchError:
        error = ((queued.get("state") or {}).get("failedData") or {}).get("error") or {}
        said = error.get("message") or f"the queued resource is {qr_state}"
        if error.get("code") == 8 or "RESOURCE_EXHAUSTED" in said or "capacity" in said.lower():
            return api.NoCapacity(f"no capacity creating TPU node '{self.ref.name}' in {cluster.where(self.ref)}: {said}",
                                  hint="a stockout or no quota left: retry later, try another zone, or use a reservation")
        return TpuLaunchError(f"the queued resource for TPU node '{self.ref.name}' is {qr_state}: {said}",
                              exit_code=ExitCode.CLUSTER)

    def _leftovers(self) -> str:
        """What exists of the node now, in words ('' when nothing); never raises."""
        found = []
        try:
            for name, node in zip(self.node_names, self.read_nodes()):
                if node is not None:
                    found.append(f"TPU node '{name}' ({node.get('state') or 'state unknown'})")
            if self.spec is None or self.spec.queued:
                queued = self.read_queued()
                if queued is not None:
                    found.append(f"queued resource '{self.ref.name}' "
                                 f"({((queued.get('state') or {}).get('state')) or 'state unknown'})")
        except Exception as exc:  # the API is failing: say that we could not check
            return f"possibly TPU node '{self.ref.name}' (could not check: {cluster._short(exc, 80)})"
        return " and ".join(found)

    def _with_leftovers(self, failed: TpuLaunchError) -> TpuLaunchError:
        left = self._leftovers()
        if left:
            failed.message = f"{failed.message}; left behind: {left}"
            failed.hint = (f"`tpulaunch down {self.job_file}` removes it"
                           + (f" (then {failed.hint})" if failed.hint else ""))
        return failed

    # ------------------------------------------------------------------ delete

    def delete(self, *, wait_s: float = CREATE_TIMEOUT_S) -> Outcome:
        """Delete the node and the queued resource of its name, waiting until both are gone.

        Idempotent: nothing there -> `changed` False.
        """
        started = time.monotonic()
        nodes, queued = self.read_nodes(), self.read_queued()
        if all(node is None for node in nodes) and queued is None:
            return Outcome(False, None, 0.0, f"{self.described} does not exist in {cluster.where(self.ref)}: "
                                             "nothing to delete")
        # what is deleted, in words: on several slices the nodes left without their queued resource are named
        gone = self.described if queued is not None or self.slices <= 1 else "TPU nodes " + ", ".join(
            f"'{name}'" for name, node in zip(self.node_names, nodes) if node is not None)
        if queued is not None:
            self.on_progress(f"deleting queued resource '{self.ref.name}' and its TPU "
                             + (f"nodes ({', '.join(self.node_names)})" if self.slices > 1 else "node"))
            self._delete(lambda: self.client.delete_queued_resource(
                request={"name": self.qr_name, "force": True}, timeout=self.timeout, retry=None), self._qr_subject)
        else:
            for name, node in zip(self.node_names, nodes):
                if node is not None and node.get("state") != "DELETING":
                    self.on_progress(f"deleting TPU node '{name}' ({node.get('state')})")
                    self._delete(lambda full=f"{self.parent}/nodes/{name}": self.client.delete_node(
                        name=full, timeout=self.timeout, retry=None), f"TPU node '{name}'")
        pause = self.poll_s
        while True:
            nodes, queued = self.read_nodes(), self.read_queued() if queued is not None else None
            if all(node is None for node in nodes) and queued is None:
                return Outcome(True, None, time.monotonic() - started, f"{gone} deleted")
            left = wait_s - (time.monotonic() - started)
            if left <= 0:
                raise TpuLaunchError(f"{gone}: still there {wait_s:g} s after deleting it",
                                     hint=f"rerun `tpulaunch down {self.job_file}`", exit_code=ExitCode.CLUSTER)
            time.sleep(min(pause, left))
            pause = min(pause * 2, cluster.MAX_POLL_S)

    def _delete(self, send, subject: str) -> None:
        try:
            self._request(send, "deleting", subject)
        except api.NodeNotFound:
            pass  # gone already (deleted by someone else meanwhile): what was asked


def _state(status: cluster.NodeStatus) -> str:
    return f"{status.state}/{status.health}" if status.health else str(status.state)


# ---------------------------------------------------------------------------------------------- fallback

@dataclass(frozen=True)
class Placement:
    """One place to try: a zone and a tier."""

    zone: str
    tier: str

    def __str__(self) -> str:
        return f"{self.zone} ({self.tier})"


def placements(job_tpu, spec: NodeSpec) -> List[Placement]:
    """What `tpulaunch run` tries, in order: each tier of tpu.tiers (else the spec's) in every zone of tpu.zones
    (else tpu.zone's): the cheaper tier everywhere before the dearer one."""
    zones = list(getattr(job_tpu, "zones", None) or [job_tpu.zone])
    tiers = list(getattr(job_tpu, "tiers", None) or [spec.tier])
    return [Placement(zone, tier) for tier in tiers for zone in zones]


class Fallback:
    """Create the node in the first placement that has capacity.

    A try that the API refuses for capacity (a stockout or no quota: NoCapacity), or that is not READY within
    `try_wait_s` (a queued resource waiting for capacity), is cleaned up (the node or queued resource it left is
    deleted) and the next placement is tried; the last one waits the whole `wait_s`. Any other failure ends the
    create as `Lifecycle.create` ends it. When every placement refused, NoCapacity (exit 4) lists what was tried.

    Args:
        ref, spec: the node as the job names it (its zone and tier are replaced per placement).
        tries: the placements, in order (`placements`).
        make: builds the Lifecycle for a (ref, spec).
    """

    def __init__(self, ref: cluster.NodeRef, spec: NodeSpec, tries: List[Placement], *,
                 make: Callable[[cluster.NodeRef, NodeSpec], Lifecycle], try_wait_s: float,
                 on_progress: Progress = lambda text: None):
        self.ref, self.spec, self.tries = ref, spec, tries
        self.make, self.try_wait_s, self.on_progress = make, try_wait_s, on_progress

    def life_at(self, placement: Placement) -> Lifecycle:
        return self.make(replace(self.ref, zone=placement.zone), with_tier(self.spec, placement.tier))

    def starting_at(self, zone: str, *, after: bool = False) -> List[Placement]:
        """The tries with the zones in the order that starts at `zone` (with `after`, at the zone after it, `zone`
        then last), wrapping round, each tier still tried in every zone before the next tier: where a recovery
        looks after losing a node in `zone` (`run --after-preemption same-zone|next-zone`)."""
        zones = list(dict.fromkeys(placement.zone for placement in self.tries))
        if zone not in zones:
            return list(self.tries)
        at = zones.index(zone) + (1 if after else 0)
        order = {name: index for index, name in enumerate(zones[at:] + zones[:at])}
        tiers = list(dict.fromkeys(placement.tier for placement in self.tries))
        return sorted(self.tries, key=lambda placement: (tiers.index(placement.tier), order[placement.zone]))

    def create(self, *, wait_s: float = CREATE_TIMEOUT_S, metadata: tuple = (),
               tries: Optional[List[Placement]] = None) -> Tuple[Lifecycle, Outcome]:
        """(the Lifecycle of the placement that gave a READY node, its Outcome); `tries`: these placements in this
        order instead of the job's (`starting_at`)."""
        refused: List[str] = []
        tries = list(tries or self.tries)
        for index, placement in enumerate(tries):
            last = index == len(tries) - 1
            life = self.life_at(placement)
            life.spec = replace(life.spec, metadata=metadata)
            try:
                return life, life.create(wait_s=wait_s if last else min(wait_s, self.try_wait_s))
            except api.NoCapacity as problem:
                if len(tries) == 1:
                    raise  # nowhere else to try: `up`'s own message
                why = problem.message
            except NotReadyInTime as problem:
                if last:
                    raise
                why = f"not READY within {self.try_wait_s:g} s ({problem.message.rsplit('(', 1)[-1].rstrip(')')})"
            refused.append(f"{placement}: {why}")
            self._clean(life, placement)
            if not last:
                self.on_progress(f"no TPU in {placement}: {why}; trying {tries[index + 1]} next")
        tried = "; ".join(refused)
        raise api.NoCapacity(
            f"no capacity for TPU node '{self.ref.name}' ({self.spec.accelerator_type}) in any of the "
            f"{len(tries)} zone/tier tried: {tried}",
            hint="retry later, add zones to tpu.zones or a tier to tpu.tiers (e.g. [spot, on-demand]), use a "
                 "reservation, or ask for quota (IAM & Admin > Quotas, 'TPU')")

    def _clean(self, life: Lifecycle, placement: Placement) -> None:
        """Delete what a refused try left (a failed node, a queued resource still waiting), so nothing leaks."""
        try:
            if life.read_node() is not None or (life.spec.queued and life.read_queued() is not None):
                self.on_progress(f"removing what the try in {placement} left")
                life.delete(wait_s=self.try_wait_s)
        except TpuLaunchError as problem:
            self.on_progress(f"could not remove what the try in {placement} left: {problem.message} "
                             f"(`tpulaunch down JOB`, which looks in each of tpu.zones, removes it)")
