"""Find the job's Cloud TPU node and check it is usable, through the Cloud TPU API v2 (google-cloud-tpu).

- `resolve_node` turns the job's `tpu:` section (and the environment) into a `NodeRef`.
- `check_node` reads the node once per poll: state, health, accelerator type, hosts, runtime version;
  it waits while the node is on its way to READY, fails fast when it will not get there by itself, and
  retries transient API failures (5xx, timeouts, malformed replies) with backoff. `check_slices` checks each
  slice's node of a job on several slices (one multislice queued resource) the same way.
- `cluster_resolver` gives TensorFlow's `TPUClusterResolver` for the same node and endpoint.
- `watch_node` polls in a background thread and reports state/health changes (the training watchdog).

Where the node comes from (first found wins):

  name     tpu.name, $TPU_NAME             ('local' = this TPU VM's own chips; 'grpc://IP:PORT' = no API)
  zone     tpu.zone, $TPU_ZONE, $CLOUDSDK_COMPUTE_ZONE, the GCE metadata server (on a Google Cloud VM)
  project  tpu.project, $TPU_PROJECT, $GOOGLE_CLOUD_PROJECT, $CLOUDSDK_CORE_PROJECT, the metadata server

Reads go through the v2 API (`tpu/api.py`): the `api_endpoint` argument, else $TPULAUNCH_TPU_API_ENDPOINT,
else Google's. Only `cluster_resolver` still speaks v1: TensorFlow's own TPUClusterResolver builds on a
v1 discovery service (googleapiclient); its endpoint is the `discovery_url` argument,
$TPULAUNCH_TPU_DISCOVERY_URL, $TPU_API_DISCOVERY_URL, else Google's (a URL template with `{api}` and
`{apiVersion}`, e.g. `http://127.0.0.1:8080/discovery/{api}/{apiVersion}`). Google credentials
(application default) are sent only to a `googleapis.com` endpoint; any other endpoint (an emulator, a
test server) is asked without credentials, so a token never leaves for a host the user did not mean.

Set $NO_GCE_CHECK=True off Google Cloud to skip probing the metadata server.

TensorFlow, googleapiclient and google-cloud-tpu are imported only inside the functions that need them.
"""

from __future__ import annotations

import os
import re
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Callable, List, Mapping, Optional

from tpulaunch.errors import ExitCode, TpuLaunchError
from tpulaunch.tpu import api

DISCOVERY_URL_ENV = "TPULAUNCH_TPU_DISCOVERY_URL"  # v1, for TensorFlow's TPUClusterResolver only
CLIENT_DISCOVERY_URL_ENV = "TPU_API_DISCOVERY_URL"  # cloud-tpu-client's (and TensorFlow's bundled client's) own
NOT_FOUND = "NOT_FOUND"  # what the watch reports for a node the API no longer has (deleted)

READY_STATES = {"READY"}
# On its way to READY: worth waiting for.
TRANSIENT_STATES = {"CREATING", "STARTING", "REPAIRING", "RESTARTING", "REIMAGING", "STATE_UNSPECIFIED"}
# Will not become READY by itself.
DEAD_STATES = {"PREEMPTED", "TERMINATED", "STOPPED", "STOPPING", "DELETING", "HIDING", "HIDDEN", "UNHIDING"}
# Gone for good: only creating the node again brings it back (what `train --recreate` does).
RECREATE_STATES = {"PREEMPTED", "TERMINATED", "DELETING", "NOT_FOUND"}

REQUEST_TIMEOUT_S = 20.0  # one HTTP request to the TPU API
REACH_S = 30.0  # one read of the TPU API, its retries included: an API that cannot be reached is said within this
REACH_ENV = "TPULAUNCH_TPU_API_REACH_S"
ATTEMPTS = 4  # tries per API read before giving up on transient failures
BACKOFF_S = 0.5  # first pause between tries; doubles, capped at MAX_BACKOFF_S
MAX_BACKOFF_S = 8.0
POLL_S = 2.0  # first pause while waiting for a node to become READY; doubles, capped at MAX_POLL_S
MAX_POLL_S = 30.0
_METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/"


@dataclass(frozen=True)
class NodeRef:
    """Which TPU node, and where each part of that answer came from (for messages)."""

    name: str
    zone: Optional[str] = None
    project: Optional[str] = None
    sources: Mapping[str, str] = field(default_factory=dict)  # "name" -> "tpu.name" | "$TPU_NAME" | ...

    @property
    def local(self) -> bool:
        """True on a TPU VM: the chips are attached to this machine, no API involved."""
        return self.name == "local"

    @property
    def direct(self) -> bool:
        """True for a grpc:// address: TensorFlow connects directly, no API involved."""
        return self.name.startswith("grpc://")

    @property
    def full_name(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/nodes/{self.name}"


@dataclass(frozen=True)
class Finding:
    """One thing `check_node` noticed; errors make the node unusable for the job."""

    severity: str  # "error" | "warning"
    code: str  # kebab-case, stable
    message: str
    hint: Optional[str] = None


@dataclass
class NodeStatus:
    """The node as the TPU API reported it, checked against the job."""

    name: str
    zone: Optional[str]
    project: Optional[str]
    state: Optional[str]
    health: Optional[str]
    accelerator_type: Optional[str]
    expected_type: Optional[str]  # the job's tpu.type
    devices: Optional[int]  # TPU devices TensorFlow sees (what cores_per_replica counts), from the type
    hosts: int  # one network endpoint per host
    runtime_version: Optional[str]  # the node's runtimeVersion (v2), e.g. tpu-vm-tf-2.15.0-se
    installed_tf: Optional[str]
    endpoints: list = field(default_factory=list)  # ["IP:PORT", ...]
    api_version: Optional[str] = None
    findings: list = field(default_factory=list)  # [Finding]
    waited_s: float = 0.0

    @property
    def usable(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["usable"] = self.usable
        return data

    def raise_if_unusable(self) -> "NodeStatus":
        """Raise TpuLaunchError (exit code CLUSTER) with the first error; return self when usable."""
        errors = [f for f in self.findings if f.severity == "error"]
        if errors:
            message = "; ".join(f.message for f in errors)
            raise TpuLaunchError(message, hint=errors[0].hint, exit_code=ExitCode.CLUSTER)
        return self


# ----------------------------------------------------------------------------------------- resolving


def resolve_node(job_tpu, *, env: Mapping[str, str] = os.environ, discovery_url: Optional[str] = None) -> NodeRef:
    """The node the job's `tpu:` section names, completed from the environment.

    Args:
        job_tpu: the job's `tpu` section (`tpulaunch.job.schema.Tpu`), or None (then only the environment).
        env: environment variables to read.
        discovery_url: unused for resolution; accepted so callers can pass one set of options.

    Raises:
        TpuLaunchError: no name anywhere, or no zone/project for a node reached through the API.
    """
    del discovery_url
    sources = {}
    name = _first(sources, "name", (getattr(job_tpu, "name", None), "tpu.name"), (env.get("TPU_NAME"), "$TPU_NAME"))
    if not name:
        raise TpuLaunchError(
            "no TPU named: set tpu.name in the job file, or $TPU_NAME",
            hint="tpu.name is the node name from `gcloud compute tpus list`; use 'local' on a TPU VM",
        )
    if name == "local" or name.startswith("grpc://"):
        return NodeRef(name=name, sources=sources)
    zone = _first(sources, "zone", (getattr(job_tpu, "zone", None), "tpu.zone"), (env.get("TPU_ZONE"), "$TPU_ZONE"),
                  (env.get("CLOUDSDK_COMPUTE_ZONE"), "$CLOUDSDK_COMPUTE_ZONE"))
    project = _first(sources, "project", (getattr(job_tpu, "project", None), "tpu.project"),
                     (env.get("TPU_PROJECT"), "$TPU_PROJECT"), (env.get("GOOGLE_CLOUD_PROJECT"), "$GOOGLE_CLOUD_PROJECT"),
                     (env.get("CLOUDSDK_CORE_PROJECT"), "$CLOUDSDK_CORE_PROJECT"))
    if zone is None or project is None:
        on_gce = str(env.get("NO_GCE_CHECK", "")).lower() not in ("true", "1", "yes")
        if zone is None and on_gce:
            zone = _metadata("instance/zone")
            zone = zone.rsplit("/", 1)[-1] if zone else None
            if zone:
                sources["zone"] = "the GCE metadata server"
        if project is None and on_gce:
            project = _metadata("project/project-id")
            if project:
                sources["project"] = "the GCE metadata server"
    missing = [part for part, value in (("zone", zone), ("project", project)) if not value]
    if missing:
        keys = " and ".join(f"tpu.{part}" for part in missing)
        envs = " / ".join({"zone": "$TPU_ZONE", "project": "$TPU_PROJECT"}[part] for part in missing)
        raise TpuLaunchError(f"TPU '{name}': no {' or '.join(missing)} given: set {keys} in the job file (or {envs})",
                             hint="`gcloud compute tpus list --zone ZONE --project PROJECT` shows where the node is")
    return NodeRef(name=name, zone=zone, project=project, sources=sources)


def _first(sources: dict, part: str, *candidates) -> Optional[str]:
    for value, source in candidates:
        if value:
            sources[part] = source
            return str(value)
    return None


def _metadata(path: str, timeout: float = 1.0) -> Optional[str]:
    """One value from the GCE metadata server, or None off Google Cloud."""
    request = urllib.request.Request(_METADATA_URL + path, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read().decode("utf-8").strip() or None
    except (OSError, ValueError):
        return None


def discovery_url_for(discovery_url: Optional[str] = None, env: Mapping[str, str] = os.environ) -> Optional[str]:
    """The discovery URL template to use; None means Google's own."""
    return discovery_url or env.get(DISCOVERY_URL_ENV) or env.get(CLIENT_DISCOVERY_URL_ENV) or None


# ----------------------------------------------------------------------------------------- the API


def _tpu_service(discovery_url: Optional[str], timeout: float):
    """A googleapiclient service for TPU v1: what TensorFlow's TPUClusterResolver reads the node through."""
    try:
        import httplib2
        from googleapiclient import discovery
    except ImportError as exc:
        raise TpuLaunchError(f"TensorFlow's TPUClusterResolver needs google-api-python-client, which is not installed "
                             f"(no module named '{exc.name}')",
                             hint="pip install 'google-api-python-client>=1.8' 'oauth2client>=4.1' (TensorFlow's TPU "
                                  "resolver's client; it installs no TensorFlow)") from None

    url = discovery_url_for(discovery_url)
    http = httplib2.Http(timeout=timeout)
    if url is None or _is_google_host(url):
        http = _authorized(http)
    kwargs = {"discoveryServiceUrl": url} if url else {}
    return discovery.build("tpu", "v1", http=http, cache_discovery=False, **kwargs)


def _is_google_host(url: str) -> bool:
    return api.is_google_host(url.replace("{", "").replace("}", ""))


def _authorized(http):
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError
    from google_auth_httplib2 import AuthorizedHttp

    try:
        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    except DefaultCredentialsError as exc:
        raise api.no_credentials(exc) from None
    return AuthorizedHttp(credentials, http=http)


def sleep_unless(seconds: float, should_stop: Callable[[], bool], slice_s: float = 0.2) -> bool:
    """Sleep `seconds` in short slices; True as soon as `should_stop()` is (a signal while waiting for a node)."""
    end = time.monotonic() + seconds
    while True:
        if should_stop():
            return True
        left = end - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(slice_s, left))


def where(ref: NodeRef) -> str:
    return f"project '{ref.project}', zone '{ref.zone}'"


def tried(ref: NodeRef) -> str:
    return ", ".join(f"{part} from {source}" for part, source in ref.sources.items())


def _short(exc: BaseException, limit: int = 200) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "..."


def reach_s(env: Mapping[str, str] = os.environ) -> float:
    """How long one read of the TPU API may take in all, its retries included: $TPULAUNCH_TPU_API_REACH_S, else
    REACH_S."""
    value = env.get(REACH_ENV)
    if not value:
        return REACH_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise TpuLaunchError(f"${REACH_ENV}={value!r} is not a number of seconds above 0",
                             hint=f"unset it (default {REACH_S:g} s)")
    return seconds


def with_retries(ref: NodeRef, request: Callable[..., object], *, what: str, attempts: int, backoff_s: float,
                 subject: Optional[str] = None, timeout: Optional[float] = None, within_s: Optional[float] = None,
                 endpoint: Optional[str] = None):
    """Run one API request through `api.call`, retrying transient failures `attempts` times in all, no try
    starting after `within_s` seconds (default: `reach_s()`). Given `timeout`, `request(seconds)` is told how long
    its HTTP request may take: `timeout` at most, never past that bound, so all of it ends within `within_s`;
    else `request()` keeps its own timeout. `endpoint`: the API endpoint asked, for the message."""
    subject = subject or f"TPU node '{ref.name}'"
    within_s = reach_s() if within_s is None else within_s
    deadline = time.monotonic() + within_s
    delay = backoff_s
    last = None
    tries = 0
    while tries < attempts:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        tries += 1
        try:
            send = request if timeout is None else (lambda: request(min(timeout, left)))
            return api.call(send, what=what, subject=subject, where=where(ref), tried=tried(ref))
        except api._Transient as problem:
            last = problem
        if tries < attempts:
            time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, MAX_BACKOFF_S)
    out_of_time = tries < attempts
    raise TpuLaunchError(
        f"could not {_infinitive(what)} {subject} ({ref.full_name}) "
        + (f"within {within_s:g} s ({tries} {'try' if tries == 1 else 'tries'})" if out_of_time else
           f"after {attempts} tries") + f": {last or 'no answer'}",
        hint=f"the TPU API ({endpoint or api.endpoint() or api.GOOGLE_ENDPOINT}) may be unreachable or having "
             f"trouble; retry later, or check the endpoint (${api.ENDPOINT_ENV}) and your network"
             + (f"; ${REACH_ENV} sets how long to try (now {within_s:g} s)" if out_of_time else ""),
        exit_code=ExitCode.CLUSTER)


def _infinitive(what: str) -> str:
    return {"reading": "read", "creating": "create", "deleting": "delete"}.get(what, what)


class _NodeReader:
    """Reads the node through the v2 API (`tpu_v2.TpuClient.get_node`), building the client lazily."""

    def __init__(self, ref: NodeRef, api_endpoint: Optional[str], *, timeout: float, attempts: int, backoff_s: float):
        self.ref = ref
        self.api_endpoint = api_endpoint
        self.timeout = timeout
        self.attempts = attempts
        self.backoff_s = backoff_s
        self._client = None

    def read(self) -> dict:
        """The node as a dict of the API's JSON names; NodeNotFound when it is not there."""
        def once(seconds: float):
            if self._client is None:
                self._client = api.client(self.api_endpoint)
            return api.to_dict(self._client.get_node(name=self.ref.full_name, timeout=seconds, retry=None))

        try:
            return with_retries(self.ref, once, what="reading", attempts=self.attempts, backoff_s=self.backoff_s,
                                timeout=self.timeout, endpoint=self.api_endpoint)
        except api.NodeNotFound as missing:
            missing.hint = (f"check the name, zone and project (`gcloud compute tpus tpu-vm list --zone {self.ref.zone} "
                            f"--project {self.ref.project}`), or create it: `tpulaunch up JOB.yaml`")
            raise


# ----------------------------------------------------------------------------------------- checking


def check_node(ref: NodeRef, job_tpu=None, *, wait: float = 0, on_wait: Optional[Callable[[NodeStatus, float], None]] = None,
               api_endpoint: Optional[str] = None, timeout: float = REQUEST_TIMEOUT_S, attempts: int = ATTEMPTS,
               backoff_s: float = BACKOFF_S, poll_s: float = POLL_S) -> NodeStatus:
    """Read the node and check it can run the job.

    Args:
        ref: from `resolve_node`.
        job_tpu: the job's `tpu` section (for tpu.type), or None to skip the type check.
        wait: seconds to wait for a node that is CREATING/STARTING/REPAIRING/RESTARTING (or READY but
            not yet HEALTHY) to become READY and HEALTHY; 0 = do not wait.
        on_wait: called as on_wait(status, seconds_left) before each pause while waiting.
        api_endpoint: the TPU API v2 endpoint (None: $TPULAUNCH_TPU_API_ENDPOINT, else Google's).
        timeout: seconds for one HTTP request.
        attempts: tries per read on transient API failures (5xx, timeouts, malformed JSON).
        backoff_s: first pause between those tries (doubles).
        poll_s: first pause between polls while waiting (doubles, at most MAX_POLL_S).

    Returns:
        NodeStatus; `usable` is False (with error findings saying what to do) when the node cannot
        run the job now.

    Raises:
        TpuLaunchError (exit code CLUSTER): the node does not exist, access is denied, or the API
        could not be read after `attempts` tries.
    """
    expected = getattr(job_tpu, "type", None)
    if ref.local or ref.direct:
        return _status_without_api(ref, expected)
    reader = _NodeReader(ref, api_endpoint, timeout=timeout, attempts=attempts, backoff_s=backoff_s)
    started = time.monotonic()
    pause = poll_s
    while True:
        status = _status_from(ref, reader.read(), expected)
        status.waited_s = round(time.monotonic() - started, 3)
        if not _worth_waiting(status):
            break
        left = wait - (time.monotonic() - started)
        if left <= 0:
            break
        if on_wait is not None:
            on_wait(status, left)
        time.sleep(min(pause, left))
        pause = min(pause * 2, MAX_POLL_S)
    status.findings = _findings(ref, status, wait)
    return status


def check_slices(ref: NodeRef, job_tpu, slices: int, *, wait: float = 0,
                 on_wait: Optional[Callable[[NodeStatus, float], None]] = None, **reading) -> List[NodeStatus]:
    """Each slice's node of the job's multislice queued resource (`<tpu.name>-<slice>`), checked as `check_node`
    checks one, all within one `wait`. A slice whose node is missing is shown as NOT_FOUND with an error (the
    others are still read); NodeNotFound when none of them exists."""
    from dataclasses import replace

    from tpulaunch.tpu import multislice

    started = time.monotonic()
    statuses, missing = [], []
    for index, name in enumerate(multislice.slice_node_names(ref.name, slices)):
        left = max(0.0, wait - (time.monotonic() - started))
        try:
            statuses.append(check_node(replace(ref, name=name), job_tpu, wait=left, on_wait=on_wait, **reading))
        except api.NodeNotFound:
            missing.append(name)
            statuses.append(NodeStatus(
                name=name, zone=ref.zone, project=ref.project, state="NOT_FOUND", health=None, accelerator_type=None,
                expected_type=getattr(job_tpu, "type", None), devices=None, hosts=0, runtime_version=None,
                installed_tf=installed_tensorflow_version(),
                findings=[Finding("error", "slice-node-missing", f"TPU node '{name}' (slice {index}) does not exist",
                                  "a multislice queued resource is recreated whole: `tpulaunch down JOB.yaml` then "
                                  "`tpulaunch up JOB.yaml` (a `tpulaunch run` with --recreate does both)")]))
    if len(missing) == len(statuses):
        raise api.NodeNotFound(
            f"{multislice.tpu_words(ref.name, slices)}: none of its nodes exists in {where(ref)}",
            hint=f"create it: `tpulaunch up JOB.yaml`; or check the name, zone and project (`gcloud compute tpus "
                 f"queued-resources list --zone {ref.zone} --project {ref.project}`)")
    return statuses


def _worth_waiting(status: NodeStatus) -> bool:
    if status.state in TRANSIENT_STATES:
        return True
    return status.state in READY_STATES and status.health != "HEALTHY"


def _status_from(ref: NodeRef, node: dict, expected: Optional[str]) -> NodeStatus:
    endpoints = [f"{e.get('ipAddress')}:{e.get('port')}" for e in node.get("networkEndpoints") or []]
    if not endpoints and node.get("ipAddress"):  # old single-host nodes
        endpoints = [f"{node['ipAddress']}:{node.get('port', '8470')}"]
    accelerator = node.get("acceleratorType")
    return NodeStatus(
        name=ref.name, zone=ref.zone, project=ref.project,
        # v2 replies carry enum defaults: HEALTH_UNSPECIFIED is "not reported", as a missing field was in v1
        state=node.get("state"), health=None if node.get("health") == "HEALTH_UNSPECIFIED" else node.get("health"),
        accelerator_type=accelerator, expected_type=expected,
        devices=devices_in(accelerator), hosts=len(endpoints),
        runtime_version=node.get("runtimeVersion") or node.get("tensorflowVersion"),
        installed_tf=installed_tensorflow_version(),
        endpoints=endpoints, api_version=node.get("apiVersion"),
    )


def _status_without_api(ref: NodeRef, expected: Optional[str]) -> NodeStatus:
    """'local' and grpc:// nodes have no API to ask: report what is known, nothing to check."""
    endpoints = [ref.name[len("grpc://"):]] if ref.direct else []
    note = ("this TPU VM's own chips: no TPU API check" if ref.local
            else "a direct gRPC address: state, health and type are not checked")
    return NodeStatus(name=ref.name, zone=None, project=None, state=None, health=None, accelerator_type=None,
                      expected_type=expected, devices=devices_in(expected), hosts=len(endpoints) or 1, runtime_version=None,
                      installed_tf=installed_tensorflow_version(), endpoints=endpoints,
                      findings=[Finding("warning", "no-api-check", note)])


def _findings(ref: NodeRef, status: NodeStatus, wait: float) -> list:
    findings = []
    start = f"gcloud compute tpus tpu-vm start {ref.name} --zone {ref.zone} --project {ref.project}"
    state = status.state
    if state in DEAD_STATES:
        hints = {
            "PREEMPTED": "a preempted node must be recreated: `tpulaunch down JOB.yaml` then `tpulaunch up JOB.yaml` "
                         "(or train with --auto-resume N --recreate, which does both)",
            "STOPPED": f"start it: `{start}`",
            "STOPPING": f"wait for it to stop, then start it: `{start}`",
            "TERMINATED": f"start it (`{start}`) or recreate it",
            "DELETING": "the node is being deleted: create a new one and point tpu.name at it",
        }
        findings.append(Finding("error", "node-not-running", f"TPU node '{ref.name}' is {state}",
                                hints.get(state, f"recreate the node, or start it: `{start}`")))
    elif state in TRANSIENT_STATES:
        findings.append(Finding("error", "node-not-ready",
                                f"TPU node '{ref.name}' is still {state}" + (f" after waiting {wait:g}s" if wait else ""),
                                "wait longer with --wait SECONDS, or check `gcloud compute tpus describe`"))
    elif state not in READY_STATES:
        findings.append(Finding("error", "node-state-unknown", f"TPU node '{ref.name}' is in state {state!r}",
                                f"`gcloud compute tpus describe {ref.name} --zone {ref.zone}` shows why"))
    elif status.health != "HEALTHY":
        findings.append(Finding("error", "node-unhealthy",
                                f"TPU node '{ref.name}' is READY but its health is {status.health or 'not reported'}",
                                "wait with --wait SECONDS; if it stays unhealthy, restart it: "
                                f"`gcloud compute tpus stop {ref.name} --zone {ref.zone}` then `{start}`"))
    if status.expected_type and status.accelerator_type and status.accelerator_type != status.expected_type:
        findings.append(Finding(
            "error", "accelerator-type-mismatch",
            f"TPU node '{ref.name}' is a {status.accelerator_type}, but the job's tpu.type is {status.expected_type}",
            f"set tpu.type: {status.accelerator_type} (and re-run `tpulaunch plan`), or point tpu.name at a "
            f"{status.expected_type} node"))
    runtime, installed = _major_minor(status.runtime_version), _major_minor(status.installed_tf)
    if runtime and installed and runtime != installed:
        findings.append(Finding(
            "warning", "runtime-version-mismatch",
            f"the node runs TensorFlow {'.'.join(map(str, runtime))} ({status.runtime_version}), this machine has "
            f"{status.installed_tf}",
            "use the same major.minor on both sides: a different TPU runtime can fail to run the compiled graph"))
    return findings


def devices_in(accelerator_type: Optional[str]) -> Optional[int]:
    """TPU devices TensorFlow sees in a slice (cores on v2/v3, chips on v4/v5p/v5e/v6e); None if unknown."""
    from tpulaunch.tpu.types import lookup

    found = lookup(accelerator_type)
    return found.devices if found else None


def _major_minor(version: Optional[str]) -> Optional[tuple]:
    match = re.search(r"(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def installed_tensorflow_version() -> Optional[str]:
    """The installed TensorFlow's version, read from package metadata (no TensorFlow import)."""
    from importlib import metadata

    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-nightly"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


# ----------------------------------------------------------------------------------------- TensorFlow


def cluster_resolver(ref: NodeRef, discovery_url: Optional[str] = None, *, timeout: float = REQUEST_TIMEOUT_S):
    """TensorFlow's TPUClusterResolver for the node, asking the same API endpoint as `check_node`.

    Building it reads nothing; `master()` and `cluster_spec()` read the node (and raise RuntimeError
    unless it is READY).
    """
    from tensorflow.python.distribute.cluster_resolver.tpu import tpu_cluster_resolver as tcr

    if ref.local or ref.direct:
        return tcr.TPUClusterResolver(tpu=ref.name)
    try:
        service = _tpu_service(discovery_url, timeout)
    except TpuLaunchError:
        raise
    except Exception as exc:  # discovery document unreachable or unreadable
        problem = _short(exc)
        raise TpuLaunchError(f"cannot reach the TPU API for '{ref.name}': {problem}",
                             hint=f"check the endpoint (${DISCOVERY_URL_ENV}) and your network",
                             exit_code=ExitCode.CLUSTER) from None
    return tcr.TPUClusterResolver(tpu=ref.name, zone=ref.zone, project=ref.project, service=service)


# ----------------------------------------------------------------------------------------- watching


class NodeWatch:
    """A background poller of one node; see `watch_node`."""

    def __init__(self, ref: NodeRef, interval: float, on_change: Callable[[NodeStatus], None], *,
                 api_endpoint: Optional[str] = None, timeout: float = REQUEST_TIMEOUT_S):
        self.ref = ref
        self.interval = interval
        self.on_change = on_change
        self.last: Optional[NodeStatus] = None
        self.last_error: Optional[Exception] = None  # the latest failed read (None after a good one)
        self._reader = _NodeReader(ref, api_endpoint, timeout=timeout, attempts=1, backoff_s=0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tpulaunch-watch-{ref.name}", daemon=True)

    def start(self) -> "NodeWatch":
        self._thread.start()
        return self

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stop polling; waits for the thread (at most `timeout` seconds)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> "NodeWatch":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                try:
                    node = self._reader.read()
                except api.NodeNotFound:  # deleted under us: a state the watchdog acts on, not a failed read
                    node = {"state": NOT_FOUND}
                status = _status_from(self.ref, node, None)
                self.last_error = None
            except Exception as exc:  # keep watching: a failed read is not a state change
                self.last_error = exc
            else:
                previous = self.last
                self.last = status
                if previous is None or (previous.state, previous.health) != (status.state, status.health):
                    self.on_change(status)
            self._stop.wait(self.interval)


def watch_node(ref: NodeRef, interval: float, on_change: Callable[[NodeStatus], None], *,
               api_endpoint: Optional[str] = None, timeout: float = REQUEST_TIMEOUT_S) -> NodeWatch:
    """Poll the node every `interval` seconds in a daemon thread; call `on_change(status)` on the first
    reading and whenever state or health changes; a node the API no longer has reads as state
    NOT_FOUND. Failed reads are kept in `.last_error` and polling goes on. Returns the started NodeWatch;
    call `.stop()` (or use it as a context manager).
    """
    if ref.local or ref.direct:
        raise TpuLaunchError(f"cannot watch TPU '{ref.name}': it is not reached through the TPU API")
    return NodeWatch(ref, interval, on_change, api_endpoint=api_endpoint, timeout=timeout).start()
