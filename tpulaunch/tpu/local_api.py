"""A local server that speaks the Cloud TPU API, v2 as google-cloud-tpu uses it and v1 as TensorFlow's
TPUClusterResolver (cloud-tpu-client) uses it, and whose TPU VMs can be local processes.

The test suite's Cloud TPU API (the `tpu_api` fixture in tests/tpu_api_server.py) and `tpulaunch rehearse`'s.

v2 (`TpuClient(transport="rest")` pointed at `server.endpoint`, which tpulaunch takes from
$TPULAUNCH_TPU_API_ENDPOINT): nodes get / list / create (`?nodeId=`) / delete / getGuestAttributes (what its TPU
VMs' hosts set of themselves, below), queued resources get /
create (`?queuedResourceId=`) / delete, and operations get, at the paths of the library's own
`rest_base.py` (`/v2/{parent=projects/*/locations/*}/nodes`...). Request bodies are parsed with the
library's own message types (`tpu_v2.Node`, `tpu_v2.QueuedResource`; unknown fields refused), so a
request the real API would not understand fails here too. Creating and deleting are long-running
operations that finish after a number of later requests (`create_reads`), never after a sleep.

cloud-tpu-client (and TensorFlow's TPUClusterResolver on top of it) builds its service from a discovery
document, then reads a node with `GET /v1/projects/P/locations/Z/nodes/N?alt=json`. This server answers
both on 127.0.0.1 with a free port, so the real client can be pointed at it with
`discovery_url=server.discovery_url` and no Google credentials.

TPU VMs (`run_vms(root)`, off by default): when a create finishes, every host of the node is started as a
local process running the node's `startup-script` with the metadata a TPU VM host sees, served here under
`/vm/...` (`tpu/local_vm.py`), where a host may also set its guest attributes (`PUT .../instance/guest-attributes/
NS/KEY`, when the node's metadata has `enable-guest-attributes: TRUE`, as on Compute Engine); deleting the node,
deleting its queued resource or `preempt(name)` kills them.

What a test can script:

- nodes: `set_node(name, state=..., health=..., accelerator_type=..., hosts=...)`, `patch_node(name, **fields)`;
- timed state changes: `play(name, [(after_s, state, health), ...])` (by time, since
  `Client.wait_for_healthy` makes several requests per round), or `by="requests"` to count node GETs;
- faults on the node GET (or the discovery document): `fail_next(n, status)`, `delay_next(n, seconds)`,
  `malformed_next(n)`; an unknown node answers 404 like the real API;
- `requests`: every (method, path) seen, for assertions;
- v2 faults: `fail_next(n, status, target="create"|"delete"|"node"...)` on a request,
  `fail_create_operation(n, code, message)` for a create the API accepts and then fails (a stockout);
  `created`: every create request body, parsed;
- `preempt(name)`: the node's VM processes killed, the node PREEMPTED, as a spot TPU's preemption leaves it;
- `secrets_from(folder)`: Secret Manager's REST API (under `/secretmanager/v1/`, `secret_manager_url`) with the
  file NAME of `folder` as secret NAME's value; a TPU VM reads a value with the token its metadata server gives;
- `stockout(zone, tiers=None)`: a zone with no capacity (for those tiers, else any): a node create there is
  accepted and its operation then fails with RESOURCE_EXHAUSTED, as the real API's stockout does; a queued
  resource there waits (WAITING_FOR_RESOURCES) and never turns ACTIVE. `$TPULAUNCH_LOCAL_API_STOCKOUT`
  (`zone[:tier]` items separated by commas, e.g. `us-central1-a,us-central1-b:spot`) sets them for a rehearsal.

The discovery document is never answered with 404: googleapiclient would then fall back to Google's
real host. It has no `auth` block, so credentials never try to reach Google's token endpoint.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import urllib.parse
from typing import Mapping, Optional, Sequence

from tpulaunch.tpu import multislice
from tpulaunch.tpu.local_vm import METADATA_PREFIX, LocalVms

GUEST_VERB = ":getGuestAttributes"

# oauth2client reads this when imported; without it a credential lookup probes the GCE metadata address.
os.environ.setdefault("NO_GCE_CHECK", "True")

STOCKOUT_ENV = "TPULAUNCH_LOCAL_API_STOCKOUT"
SECRETS_PREFIX = "/secretmanager/v1/"  # Secret Manager's REST API, served from a folder (`secrets_from`)
DEFAULT_PROJECT = "test-project"
DEFAULT_ZONE = "us-central1-a"


def node_json(name: str, project: str = DEFAULT_PROJECT, zone: str = DEFAULT_ZONE, *, state: str = "READY",
              health: Optional[str] = "HEALTHY", accelerator_type: str = "v3-8", tensorflow_version: str = "2.15.0",
              hosts: int = 1, port: str = "8470", api_version: str = "V1", symptoms: Sequence[dict] = ()) -> dict:
    """A node resource as the v1 API returns it; one network endpoint per host (10.0.0.2, 10.0.0.3, ...)."""
    node = {
        "name": f"projects/{project}/locations/{zone}/nodes/{name}",
        "acceleratorType": accelerator_type,
        "state": state,
        "tensorflowVersion": tensorflow_version,
        "network": "default",
        "cidrBlock": "10.0.0.0/29",
        "networkEndpoints": [{"ipAddress": f"10.0.0.{2 + i}", "port": int(port)} for i in range(hosts)],
        "apiVersion": api_version,
        "schedulingConfig": {},
    }
    if health is not None:
        node["health"] = health
    if symptoms:
        node["symptoms"] = list(symptoms)
    return node


def discovery_document(root_url: str) -> dict:
    """A minimal, valid discovery document for tpu v1 with projects.locations.nodes.get."""
    name_param = {"type": "string", "required": True, "location": "path",
                  "pattern": "^projects/[^/]+/locations/[^/]+/nodes/[^/]+$"}
    return {
        "kind": "discovery#restDescription",
        "discoveryVersion": "v1",
        "id": "tpu:v1",
        "name": "tpu",
        "version": "v1",
        "title": "Cloud TPU API (local test server)",
        "protocol": "rest",
        "rootUrl": root_url,
        "servicePath": "",
        "baseUrl": root_url,
        "batchPath": "batch",
        "parameters": {
            "alt": {"type": "string", "default": "json", "enum": ["json"], "location": "query"},
        },
        "schemas": {
            "Node": {"id": "Node", "type": "object", "properties": {
                "name": {"type": "string"}, "state": {"type": "string"}, "health": {"type": "string"},
                "acceleratorType": {"type": "string"}, "tensorflowVersion": {"type": "string"},
                "apiVersion": {"type": "string"},
                "networkEndpoints": {"type": "array", "items": {"$ref": "NetworkEndpoint"}},
            }},
            "NetworkEndpoint": {"id": "NetworkEndpoint", "type": "object", "properties": {
                "ipAddress": {"type": "string"}, "port": {"type": "integer", "format": "int32"}}},
        },
        "resources": {"projects": {"resources": {"locations": {"resources": {"nodes": {"methods": {
            "get": {
                "id": "tpu.projects.locations.nodes.get",
                "path": "v1/{+name}",
                "flatPath": "v1/projects/{projectsId}/locations/{locationsId}/nodes/{nodesId}",
                "httpMethod": "GET",
                "parameters": {"name": name_param},
                "parameterOrder": ["name"],
                "response": {"$ref": "Node"},
            },
        }}}}}}},
    }


@dataclass
class _Fault:
    """One scripted misbehaviour for the next `remaining` matching requests."""

    target: str  # "node" | "discovery"
    remaining: int
    status: Optional[int] = None  # answer with this HTTP status
    delay_s: float = 0.0  # sleep before answering
    malformed: bool = False  # answer 200 with a body that is not JSON
    message: str = "scripted failure"  # the error's message


@dataclass
class _Script:
    start: float
    steps: list  # [(after, {field: value})], after in seconds or node requests
    by: str
    requests: int = 0


@dataclass
class TpuApiServer:
    """The server's state; every method is thread-safe. Start with `start()`, stop with `stop()`."""

    nodes: dict = field(default_factory=dict)  # full resource name -> node dict
    requests: list = field(default_factory=list)  # (method, path) in arrival order
    _faults: list = field(default_factory=list)
    _scripts: dict = field(default_factory=dict)  # full name -> _Script
    _lock: threading.Lock = field(default_factory=threading.Lock)
    operations: dict = field(default_factory=dict)  # operation name -> _Operation
    queued: dict = field(default_factory=dict)  # full queued resource name -> resource dict
    created: list = field(default_factory=list)  # parsed bodies of create requests (nodes and queued resources)
    create_reads: int = 2  # a create finishes after this many later reads of its node, resource or operation
    delete_reads: int = 1  # and a delete after this many
    _create_failures: list = field(default_factory=list)  # [(code, message)] for the next accepted creates
    stockouts: dict = field(default_factory=dict)  # zone -> the tiers it has no capacity for (None: any)
    _ops: int = 0
    vms: Optional[LocalVms] = None  # the nodes' hosts as local processes (`run_vms`); None: nodes are only records
    secrets_dir: Optional[str] = None  # Secret Manager's secrets as files (`secrets_from`); None: there are none
    _httpd: Optional[ThreadingHTTPServer] = None
    _thread: Optional[threading.Thread] = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> "TpuApiServer":
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="tpu-api-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self.vms is not None:
            self.vms.halt_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=5)
            self._httpd = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    @property
    def endpoint(self) -> str:
        """What google-cloud-tpu's `client_options={"api_endpoint": ...}` (and $TPULAUNCH_TPU_API_ENDPOINT) take."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def discovery_url(self) -> str:
        """The template cloud-tpu-client's `discovery_url` argument takes."""
        return f"http://127.0.0.1:{self.port}/discovery/{{api}}/{{apiVersion}}"

    def run_vms(self, root: str, env: Optional[Mapping[str, str]] = None, hosts: Optional[int] = None,
                fail_install: Optional[Sequence[int]] = None) -> LocalVms:
        """From now on, a node that a create makes READY boots its hosts as local processes (`tpu/local_vm.py`)
        with their disks under `root`, starting from `env` (default: this process's environment); the workers in
        `fail_install` fail their install step."""
        self.vms = LocalVms(root, env, hosts, fail_install)
        return self.vms

    # ---------------------------------------------------------------- nodes

    def set_node(self, name: str, project: str = DEFAULT_PROJECT, zone: str = DEFAULT_ZONE, **fields) -> dict:
        """Create or replace a node; keyword arguments as `node_json`."""
        node = node_json(name, project, zone, **fields)
        with self._lock:
            self.nodes[node["name"]] = node
            self._scripts.pop(node["name"], None)
        return node

    def patch_node(self, name: str, project: str = DEFAULT_PROJECT, zone: str = DEFAULT_ZONE, **api_fields) -> None:
        """Change fields of an existing node by their API names (state=, health=, acceleratorType=...)."""
        with self._lock:
            self.nodes[_full_name(project, zone, name)].update(api_fields)

    def delete_node(self, name: str, project: str = DEFAULT_PROJECT, zone: str = DEFAULT_ZONE) -> None:
        with self._lock:
            self.nodes.pop(_full_name(project, zone, name), None)

    def play(self, name: str, steps: Sequence[tuple], *, by: str = "seconds",
             project: str = DEFAULT_PROJECT, zone: str = DEFAULT_ZONE) -> None:
        """Script state changes: steps are (after, state, health), `after` counted from now.

        by="seconds": after that many seconds; by="requests": after that many GETs of this node.
        """
        if by not in ("seconds", "requests"):
            raise ValueError("by is 'seconds' or 'requests'")
        parsed = sorted(((after, {"state": state, "health": health}) for after, state, health in steps),
                        key=lambda s: s[0])
        with self._lock:
            self._scripts[_full_name(project, zone, name)] = _Script(time.monotonic(), parsed, by)

    def preempt(self, name: str, project: str = DEFAULT_PROJECT, zone: str = DEFAULT_ZONE) -> int:
        """Preempt the node as Cloud TPU does a spot TPU: its VM's processes killed at once, its state PREEMPTED
        (it stays, holding its name, until it is deleted). Returns how many host processes were running."""
        full = _full_name(project, zone, name)
        killed = self.vms.halt(full) if self.vms is not None else 0
        with self._lock:
            node = self.nodes.get(full)
            if node is not None:
                node["state"] = "PREEMPTED"
                node.pop("health", None)
                self._scripts.pop(full, None)
        return killed

    def node_requests(self, name: str, project: str = DEFAULT_PROJECT, zone: str = DEFAULT_ZONE) -> int:
        """How many times the node was read (v1 and v2)."""
        paths = {f"/{v}/{_full_name(project, zone, name)}" for v in ("v1", "v2")}
        with self._lock:
            return sum(1 for method, p in self.requests if method == "GET" and p.split("?")[0] in paths)

    def fail_create_operation(self, n: int = 1, code: int = 8,
                              message: str = 'There is no more capacity in the zone "us-central1-a"; you can try in '
                                             'another zone where Cloud TPU Nodes are offered') -> None:
        """Accept the next n creates, then finish their operations with this error (8: RESOURCE_EXHAUSTED,
        a stockout) and remove what they made."""
        with self._lock:
            self._create_failures.extend([(code, message)] * n)

    def stockout(self, zone: str, tiers: Optional[Sequence[str]] = None) -> None:
        """No capacity in `zone` from now on, for `tiers` ("spot", "preemptible", "reserved", "on-demand"; None:
        any)."""
        with self._lock:
            if tiers is None:
                self.stockouts[zone] = None
            elif zone not in self.stockouts or self.stockouts[zone] is not None:
                self.stockouts[zone] = set(self.stockouts.get(zone) or ()) | set(tiers)

    def stockouts_from(self, text: str) -> None:
        """`zone[:tier],...` (the form of $TPULAUNCH_LOCAL_API_STOCKOUT)."""
        for item in (part.strip() for part in text.split(",")):
            if item:
                zone, _, tier = item.partition(":")
                self.stockout(zone, [tier] if tier else None)

    def _stocked_out(self, parent: str, tier: str) -> Optional[tuple]:
        """The stockout error for a create of `tier` under `parent` (projects/P/locations/Z), or None."""
        zone = parent.rsplit("/", 1)[-1]
        if zone not in self.stockouts or (self.stockouts[zone] is not None and tier not in self.stockouts[zone]):
            return None
        return (8, f'There is no more capacity in the zone "{zone}"; you can try in another zone where Cloud TPU '
                   f'Nodes are offered (see https://cloud.google.com/tpu/docs/regions) [EID: local {tier}]')

    def queued_resource(self, name: str, project: str = DEFAULT_PROJECT, zone: str = DEFAULT_ZONE) -> Optional[dict]:
        with self._lock:
            found = self.queued.get(f"projects/{project}/locations/{zone}/queuedResources/{name}")
            return json.loads(json.dumps(found)) if found else None

    # ---------------------------------------------------------------- faults

    def fail_next(self, n: int, status: int = 503, *, target: str = "node", message: str = "scripted failure") -> None:
        """Answer the next n requests of `target` (node GETs, discovery fetches, creates...) with an HTTP error."""
        self._add_fault(_Fault(target, n, status=status, message=message))

    def delay_next(self, n: int, seconds: float, *, target: str = "node") -> None:
        """Sleep `seconds` before answering each of the next n requests."""
        self._add_fault(_Fault(target, n, delay_s=seconds))

    def malformed_next(self, n: int, *, target: str = "node") -> None:
        """Answer the next n requests with status 200 and a body that is not JSON."""
        self._add_fault(_Fault(target, n, malformed=True))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _add_fault(self, fault: _Fault) -> None:
        if fault.target not in _TARGETS:
            raise ValueError(f"target is one of {_TARGETS}")
        with self._lock:
            self._faults.append(fault)

    # ---------------------------------------------------------------- request handling

    def _take_fault(self, target: str) -> Optional[_Fault]:
        with self._lock:
            for fault in self._faults:
                if fault.target == target and fault.remaining > 0:
                    fault.remaining -= 1
                    return fault
        return None

    def _node_for(self, full_name: str) -> Optional[dict]:
        with self._lock:
            script = self._scripts.get(full_name)
            node = self.nodes.get(full_name)
            if script is not None and node is not None:
                script.requests += 1
                now = time.monotonic() - script.start if script.by == "seconds" else script.requests
                for after, changes in script.steps:
                    if now >= after:
                        node.update({k: v for k, v in changes.items() if v is not None})
                        if changes.get("health") is None:
                            node.pop("health", None)
            return json.loads(json.dumps(node)) if node is not None else None

    def _answer(self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] = {}):
        """(status, body bytes, delay seconds) for one request."""
        bare = path.split("?")[0]
        if bare.startswith(METADATA_PREFIX) and method == "GET":
            return self._metadata(bare, headers)  # a host's own reads: not the API's, not in `requests`
        if bare.startswith(METADATA_PREFIX) and method == "PUT":
            return self._put_guest_attribute(bare, headers, body)  # a host's own writes: not the API's either
        if bare.startswith(SECRETS_PREFIX) and method == "GET":
            return self._secret(bare[len(SECRETS_PREFIX):], headers)  # Secret Manager's: not in `requests` either
        with self._lock:
            self.requests.append((method, path))
        if bare.startswith("/v2/"):
            return self._v2(method, bare[len("/v2/"):], urllib.parse.parse_qs(urllib.parse.urlsplit(path).query), body)
        if bare.startswith("/discovery/"):
            return self._with_fault("discovery", lambda: (200, json.dumps(discovery_document(self.root_url))))
        if method == "GET" and bare.startswith("/v1/projects/"):
            full_name = bare[len("/v1/"):]
            return self._with_fault("node", lambda: self._get_node(full_name))
        return 404, _error_body(404, f"no such method: {method} {bare}", "NOT_FOUND"), 0.0

    # ---------------------------------------------------------------- v2

    def _v2(self, method: str, path: str, query: dict, body: bytes):
        parts = path.split("/")
        if len(parts) < 4 or parts[0] != "projects" or parts[2] != "locations":
            return 404, _error_body(404, f"no such resource: {path}", "NOT_FOUND"), 0.0
        parent = "/".join(parts[:4])
        kind = parts[4] if len(parts) > 4 else None
        if method == "GET" and kind == "operations" and len(parts) == 6:
            return self._with_fault("operation", lambda: self._get_operation(path))
        if kind == "nodes":
            if method == "GET" and len(parts) == 5:
                return self._with_fault("node", lambda: self._list_nodes(parent))
            if method == "GET" and len(parts) == 6:
                return self._with_fault("node", lambda: self._get_v2_node(path))
            if method == "POST" and len(parts) == 5:
                return self._with_fault("create", lambda: self._create_node(parent, query, body))
            if method == "DELETE" and len(parts) == 6:
                return self._with_fault("delete", lambda: self._delete_v2_node(path))
            if method == "POST" and len(parts) == 6 and path.endswith(GUEST_VERB):
                return self._with_fault("node", lambda: self._guest_attributes(path[:-len(GUEST_VERB)], body))
        if kind == "queuedResources":
            if method == "GET" and len(parts) == 6:
                return self._with_fault("queued", lambda: self._get_queued(path))
            if method == "POST" and len(parts) == 5:
                return self._with_fault("create", lambda: self._create_queued(parent, query, body))
            if method == "DELETE" and len(parts) == 6:
                return self._with_fault("delete", lambda: self._delete_queued(path))
        return 404, _error_body(404, f"no such method: {method} /v2/{path}", "NOT_FOUND"), 0.0

    def _operation(self, parent: str, target: str, verb: str, **extra) -> dict:
        self._ops += 1
        op = {"name": f"{parent}/operations/operation-{self._ops}", "done": False,
              "metadata": {"@type": _OP_META, "target": target, "verb": verb, "apiVersion": "v2"}}
        self.operations[op["name"]] = {"op": op, "reads": 0, **extra}
        return op

    def _advance(self) -> None:
        """One request's worth of progress on every unfinished operation (called under the lock)."""
        for entry in list(self.operations.values()):
            op = entry["op"]
            if op["done"]:
                continue
            entry["reads"] += 1
            if entry["reads"] < (self.delete_reads if op["metadata"]["verb"] == "delete" else self.create_reads):
                continue
            target = op["metadata"]["target"]
            if entry.get("error"):
                code, message = entry["error"]
                self.nodes.pop(target, None)
                op.update(done=True, error={"code": code, "message": message})
            elif op["metadata"]["verb"] == "create":
                node = self.nodes.get(target)
                if node is not None and node.get("state") == "CREATING":
                    node.update(state="READY", health="HEALTHY",
                                networkEndpoints=node.get("networkEndpoints") or [{"ipAddress": "10.0.0.2", "port": 8470}])
                    self._boot(node)
                op.update(done=True, response={"@type": _NODE_TYPE, **v2_node(node)} if node else {})
            elif op["metadata"]["verb"] == "create-queued":
                if entry.get("waits"):
                    continue  # no capacity: it waits for resources until it is deleted
                resource = self.queued.get(target)
                if resource is not None:
                    resource["state"] = {"state": "ACTIVE"}
                    spec = resource["tpu"]["nodeSpec"][0]
                    names = _queued_node_names(resource)
                    first: list = []  # slice 0's worker 0, the coordinator, once its VM has its endpoints
                    for index, full in enumerate(names):
                        self.nodes[full] = {**spec["node"], "name": full, "state": "READY", "health": "HEALTHY",
                                            "networkEndpoints": [{"ipAddress": "10.0.0.2", "port": 8470}]}

                        # Every VM of a multislice queued resource is told its slice, the slices and the coordinator
                        # in its tpu-env metadata, as Cloud TPU's are (none on one slice)
                        def tpu_env(endpoints, index=index):
                            first[:] = first or endpoints[:1]
                            return multislice.tpu_env_text(
                                multislice.megascale_environment(first[0], len(names), index))
                        self._boot(self.nodes[full], tpu_env)
                op.update(done=True, response={"@type": _QR_TYPE, **(resource or {})})
            elif op["metadata"]["verb"] == "delete":
                self._halt(target)
                self.nodes.pop(target, None)
                op.update(done=True, response={"@type": "type.googleapis.com/google.protobuf.Empty"})

    def _boot(self, node: dict, tpu_env=lambda endpoints: "") -> None:
        if self.vms is not None:
            vm = self.vms.boot(node, self.root_url, tpu_env)
            # one endpoint per host, as a real slice's node lists them
            node["networkEndpoints"] = [{"ipAddress": endpoint.split(":")[0], "port": int(endpoint.split(":")[1])}
                                        for endpoint in vm.endpoints]

    def _halt(self, full_name: str) -> None:
        if self.vms is not None:
            self.vms.halt(full_name)

    def _metadata(self, path: str, headers: Mapping[str, str]):
        """A TPU VM host's metadata, answered as the metadata server does: only with `Metadata-Flavor: Google`."""
        if (headers.get("Metadata-Flavor") or "") != "Google":
            return 403, "Missing required header: Metadata-Flavor", 0.0
        value = self.vms.metadata(path[len(METADATA_PREFIX):]) if self.vms is not None else None
        if value is None:
            return 404, "not found", 0.0
        return 200, value, 0.0

    def _put_guest_attribute(self, path: str, headers: Mapping[str, str], body: bytes):
        if (headers.get("Metadata-Flavor") or "") != "Google":
            return 403, "Missing required header: Metadata-Flavor", 0.0
        code = self.vms.put_guest_attribute(path[len(METADATA_PREFIX):], body.decode("utf-8", "replace")) \
            if self.vms is not None else 404
        return code, {200: "", 403: "Guest attributes endpoint access is disabled."}.get(code, "not found"), 0.0

    def _guest_attributes(self, full_name: str, body: bytes):
        """nodes.getGuestAttributes: each host's guest attributes under the request's queryPath (`NS/`), one entry
        per worker in worker order, as the v2 API answers without workerIds."""
        query = (json.loads(body or b"{}").get("queryPath") or "").strip("/")
        with self._lock:
            known = full_name in self.nodes
        per_worker = self.vms.guest_attributes(full_name, query) if self.vms is not None and known else None
        if per_worker is None:
            return 404, _error_body(404, f"Resource '{full_name}' was not found", "NOT_FOUND")
        return 200, json.dumps({"guestAttributes": [
            {"queryPath": f"{query}/", "queryValue": {"items": [
                {"namespace": query, "key": key, "value": value} for key, value in sorted(found.items())]}}
            for found in per_worker]})

    # ---------------------------------------------------------------- Secret Manager

    def secrets_from(self, folder: Optional[str]) -> None:
        """Serve Secret Manager's `secrets.get` and `versions.access` (latest) from `folder`: the file NAME holds
        the value of secret NAME, in any project. Each value is read from its file when asked, never kept here."""
        self.secrets_dir = os.path.abspath(folder) if folder else None

    @property
    def secret_manager_url(self) -> str:
        """Where this server answers as Secret Manager's REST API (`$TPULAUNCH_SECRET_MANAGER_URL`)."""
        return f"{self.root_url}{SECRETS_PREFIX.lstrip('/')}"

    def _secret(self, path: str, headers: Mapping[str, str]):
        """`projects/P/secrets/N` (its name: anyone may ask here, as the TPU API) or
        `projects/P/secrets/N/versions/latest:access` (its value: only with a TPU VM's token, as a service
        account's token from the metadata server)."""
        parts = path.split("/")
        if len(parts) not in (4, 6) or parts[0] != "projects" or parts[2] != "secrets":
            return 404, _error_body(404, f"no such method: GET {path}", "NOT_FOUND"), 0.0
        name = parts[3]
        file = os.path.join(self.secrets_dir, name) if self.secrets_dir and name.replace("_", "").isalnum() else None
        if file is None or not os.path.isfile(file):
            return 404, _error_body(404, f"Secret [projects/{parts[1]}/secrets/{name}] not found or has no versions.",
                                    "NOT_FOUND"), 0.0
        full = f"projects/{parts[1]}/secrets/{name}"
        if len(parts) == 4:
            return 200, json.dumps({"name": full, "replication": {"automatic": {}}}), 0.0
        if parts[4:] != ["versions", "latest:access"]:
            return 404, _error_body(404, f"no such method: GET {path}", "NOT_FOUND"), 0.0
        token = self.vms.token if self.vms is not None else None
        if token is None or (headers.get("Authorization") or "") != f"Bearer {token}":
            return 403, _error_body(403, f"Permission 'secretmanager.versions.access' denied for resource "
                                         f"'{full}/versions/latest'", "PERMISSION_DENIED"), 0.0
        with open(file, "rb") as handle:
            data = base64.b64encode(handle.read()).decode()
        return 200, json.dumps({"name": f"{full}/versions/1", "payload": {"data": data}}), 0.0

    def _get_operation(self, name: str):
        with self._lock:
            self._advance()
            entry = self.operations.get(name)
            if entry is None:
                return 404, _error_body(404, f"Operation '{name}' was not found", "NOT_FOUND")
            return 200, json.dumps(entry["op"])

    def _list_nodes(self, parent: str):
        with self._lock:
            self._advance()
            nodes = [v2_node(n) for name, n in self.nodes.items() if name.startswith(parent + "/nodes/")]
        return 200, json.dumps({"nodes": nodes})

    def _get_v2_node(self, full_name: str):
        with self._lock:
            self._advance()
        node = self._node_for(full_name)
        if node is None:
            return 404, _error_body(404, f"Resource '{full_name}' was not found", "NOT_FOUND")
        return 200, json.dumps(v2_node(node))

    @staticmethod
    def _create_request(query: dict, id_key: str, message: str, body: bytes):
        """(the new resource's id, its body as the API reads it), or the API's 400 answer as (None, answer)."""
        from google.cloud import tpu_v2

        resource_id = (query.get(id_key) or [None])[0]
        if not resource_id:
            return None, (400, _error_body(400, f"{id_key} is required", "INVALID_ARGUMENT"))
        try:
            return resource_id, _parse_as(getattr(tpu_v2, message), body)
        except Exception as exc:
            return None, (400, _error_body(400, f"Invalid JSON payload received. {exc}", "INVALID_ARGUMENT"))

    def _create_node(self, parent: str, query: dict, body: bytes):
        node_id, node = self._create_request(query, "nodeId", "Node", body)
        if node_id is None:
            return node
        full = f"{parent}/nodes/{node_id}"
        with self._lock:
            self.created.append({"nodeId": node_id, "node": node})
            if full in self.nodes:
                return 409, _error_body(409, f"Resource '{full}' already exists", "ALREADY_EXISTS")
            self.nodes[full] = {**node, "name": full, "state": "CREATING"}
            self._scripts.pop(full, None)
            failure = self._create_failures.pop(0) if self._create_failures else None
            failure = failure or self._stocked_out(parent, _tier(node.get("schedulingConfig") or {}))
            op = self._operation(parent, full, "create", error=failure)
        return 200, json.dumps(op)

    def _delete_v2_node(self, full_name: str):
        with self._lock:
            node = self.nodes.get(full_name)
            if node is None:
                return 404, _error_body(404, f"Resource '{full_name}' was not found", "NOT_FOUND")
            node["state"] = "DELETING"
            self._halt(full_name)  # a VM being deleted stops at once
            self._scripts.pop(full_name, None)
            op = self._operation(full_name.rsplit("/nodes/", 1)[0], full_name, "delete")
        return 200, json.dumps(op)

    def _get_queued(self, name: str):
        with self._lock:
            self._advance()
            found = self.queued.get(name)
        if found is None:
            return 404, _error_body(404, f"Resource '{name}' was not found", "NOT_FOUND")
        return 200, json.dumps(found)

    def _create_queued(self, parent: str, query: dict, body: bytes):
        resource_id, resource = self._create_request(query, "queuedResourceId", "QueuedResource", body)
        if resource_id is None:
            return resource
        name = f"{parent}/queuedResources/{resource_id}"
        with self._lock:
            self.created.append({"queuedResourceId": resource_id, "queuedResource": resource})
            if name in self.queued:
                return 409, _error_body(409, f"Resource '{name}' already exists", "ALREADY_EXISTS")
            self.queued[name] = {**resource, "name": name, "state": {"state": "WAITING_FOR_RESOURCES"}}
            tier = "spot" if "spot" in resource else "reserved" if "guaranteed" in resource else "on-demand"
            op = self._operation(parent, name, "create-queued", waits=self._stocked_out(parent, tier) is not None)
        return 200, json.dumps(op)

    def _delete_queued(self, name: str):
        with self._lock:
            resource = self.queued.pop(name, None)
            if resource is None:
                return 404, _error_body(404, f"Resource '{name}' was not found", "NOT_FOUND")
            for full in _queued_node_names(resource):
                self._halt(full)
                self.nodes.pop(full, None)
            op = self._operation(name.rsplit("/queuedResources/", 1)[0], name, "delete-queued")
            op.update(done=True, response={"@type": "type.googleapis.com/google.protobuf.Empty"})
        return 200, json.dumps(op)

    def _get_node(self, full_name: str):
        node = self._node_for(full_name)
        if node is None:
            return 404, _error_body(404, f"Resource '{full_name}' was not found", "NOT_FOUND")
        return 200, json.dumps(node)

    def _with_fault(self, target: str, normal):
        fault = self._take_fault(target)
        delay = fault.delay_s if fault else 0.0
        if fault and fault.status:
            status_name = {500: "INTERNAL", 503: "UNAVAILABLE", 403: "PERMISSION_DENIED", 429: "RESOURCE_EXHAUSTED",
                           400: "INVALID_ARGUMENT", 404: "NOT_FOUND"}
            return fault.status, _error_body(fault.status, fault.message, status_name.get(fault.status, "UNKNOWN")), delay
        if fault and fault.malformed:
            return 200, '{"name": "projects/oops", "state": "READ', delay
        status, body = normal()
        return status, body, delay


_TARGETS = ("node", "discovery", "create", "delete", "operation", "queued")
_NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
_QR_TYPE = "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"
_OP_META = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"


def _tier(scheduling: dict) -> str:
    for tier in ("spot", "preemptible", "reserved"):
        if scheduling.get(tier):
            return tier
    return "on-demand"


def _queued_node_names(resource: dict) -> list:
    """The full names of a queued resource's nodes: its node spec's node_id, or for multislice_params the N nodes
    `<node_id_prefix>-<i>` (the queued resource's id when no prefix is given), as Cloud TPU names them."""
    names = []
    for spec in resource.get("tpu", {}).get("nodeSpec", []):
        params = spec.get("multisliceParams")
        if params:
            prefix = params.get("nodeIdPrefix") or resource["name"].rsplit("/", 1)[-1]
            names += [f"{spec['parent']}/nodes/{name}"
                      for name in multislice.slice_node_names(prefix, int(params["nodeCount"]))]
        else:
            names.append(f"{spec['parent']}/nodes/{spec['nodeId']}")
    return names


def v2_node(node: dict) -> dict:
    """A stored node as the v2 API returns it (runtimeVersion, networkConfig; no v1-only fields)."""
    out = {k: v for k, v in node.items() if k not in ("tensorflowVersion", "network", "cidrBlock", "ipAddress", "port")}
    out.setdefault("runtimeVersion", f"tpu-vm-tf-{node.get('tensorflowVersion', '2.15.0')}-se")
    out.setdefault("networkConfig", {"network": node.get("network", "default")})
    out["apiVersion"] = "V2"
    return out


def _parse_as(message_type, body: bytes):
    """The body parsed as the library's own message type; ValueError names what the API would refuse."""
    from google.protobuf import json_format

    pb = message_type.pb(message_type())
    json_format.Parse(body.decode("utf-8") or "{}", pb, ignore_unknown_fields=False)
    return json.loads(body.decode("utf-8") or "{}")


def _full_name(project: str, zone: str, name: str) -> str:
    return f"projects/{project}/locations/{zone}/nodes/{name}"


def _error_body(code: int, message: str, status: str) -> str:
    return json.dumps({"error": {"code": code, "message": message, "status": status}})


def _make_handler(server: TpuApiServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802 (http.server's naming)
            self._respond("GET")

        def do_POST(self):  # noqa: N802
            self._respond("POST")

        def do_DELETE(self):  # noqa: N802
            self._respond("DELETE")

        def do_PUT(self):  # noqa: N802
            self._respond("PUT")

        def _respond(self, method):
            length = int(self.headers.get("Content-Length") or 0)
            status, body, delay = server._answer(method, self.path, self.rfile.read(length) if length else b"",
                                                 self.headers)
            if delay:
                time.sleep(delay)
            data = body.encode("utf-8") if isinstance(body, str) else body
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test): nothing to answer

        def log_message(self, format, *args):  # keep pytest output clean
            pass

    return Handler


def main(argv=None) -> None:
    """`python -m tpulaunch.tpu.local_api [--vms DIR] [--port P]`: serve until stopped (for `tpulaunch rehearse`
    with $TPULAUNCH_TPU_API_ENDPOINT, and to try `tpulaunch up`/`down`/`run` against it)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tpulaunch.tpu.local_api", description=main.__doc__)
    parser.add_argument("--vms", metavar="DIR", help="run the nodes' TPU VMs as local processes, disks under DIR")
    parser.add_argument("--hosts", type=int, default=None, help="hosts per slice (default: as the type has)")
    parser.add_argument("--secrets", metavar="DIR", help="Secret Manager's secrets: the file DIR/NAME is secret NAME "
                                                         "(then set TPULAUNCH_SECRET_MANAGER_URL as printed)")
    parser.add_argument("--stockout", metavar="ZONE[:TIER]", action="append", default=[],
                        help="no capacity in that zone (for that tier); repeatable")
    args = parser.parse_args(argv)
    server = TpuApiServer().start()
    server.stockouts_from(",".join(args.stockout) or os.environ.get(STOCKOUT_ENV, ""))
    server.secrets_from(args.secrets)
    if args.vms:
        server.run_vms(args.vms, hosts=args.hosts)
    print(f"TPULAUNCH_TPU_API_ENDPOINT={server.endpoint}", flush=True)
    if args.secrets:
        print(f"TPULAUNCH_SECRET_MANAGER_URL={server.secret_manager_url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
