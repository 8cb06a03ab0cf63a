"""A local server that speaks the Cloud TPU API (v1) as cloud-tpu-client uses it, plus a pytest fixture.

cloud-tpu-client (and TensorFlow's TPUClusterResolver on top of it) builds its service from a discovery
document, then reads a node with `GET /v1/projects/P/locations/Z/nodes/N?alt=json`. This server answers
both on 127.0.0.1 with a free port, so the real client can be pointed at it with
`discovery_url=server.discovery_url` and no Google credentials.

What a test can script:

- nodes: `set_node(name, state=..., health=..., accelerator_type=..., hosts=...)`, `patch_node(name, **fields)`;
- timed state changes: `play(name, [(after_s, state, health), ...])` (by time, since
  `Client.wait_for_healthy` makes several requests per round), or `by="requests"` to count node GETs;
- faults on the node GET (or the discovery document): `fail_next(n, status)`, `delay_next(n, seconds)`,
  `malformed_next(n)`; an unknown node answers 404 like the real API;
- `requests`: every (method, path) seen, for assertions.

The discovery document is never answered with 404: googleapiclient would then fall back to Google's
real host. It has no `auth` block, so credentials never try to reach Google's token endpoint.

Use the `tpu_api` fixture (add `pytest_plugins = ["tpu_api_server"]` to tests/conftest.py, or import the
fixture into a test module).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional, Sequence

import pytest

# oauth2client reads this when imported; without it a credential lookup probes the GCE metadata address.
os.environ.setdefault("NO_GCE_CHECK", "True")

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
    def discovery_url(self) -> str:
        """The template cloud-tpu-client's `discovery_url` argument takes."""
        return f"http://127.0.0.1:{self.port}/discovery/{{api}}/{{apiVersion}}"

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

    def node_requests(self, name: str, project: str = DEFAULT_PROJECT, zone: str = DEFAULT_ZONE) -> int:
        """How many times the node was read."""
        path = "/v1/" + _full_name(project, zone, name)
        with self._lock:
            return sum(1 for method, p in self.requests if p.split("?")[0] == path)

    # ---------------------------------------------------------------- faults

    def fail_next(self, n: int, status: int = 503, *, target: str = "node") -> None:
        """Answer the next n node GETs (or discovery fetches) with an HTTP error status."""
        self._add_fault(_Fault(target, n, status=status))

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
        if fault.target not in ("node", "discovery"):
            raise ValueError("target is 'node' or 'discovery'")
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

    def _answer(self, method: str, path: str):
        """(status, body bytes, delay seconds) for one request."""
        with self._lock:
            self.requests.append((method, path))
        bare = path.split("?")[0]
        if bare.startswith("/discovery/"):
            return self._with_fault("discovery", lambda: (200, json.dumps(discovery_document(self.root_url))))
        if method == "GET" and bare.startswith("/v1/projects/"):
            full_name = bare[len("/v1/"):]
            return self._with_fault("node", lambda: self._get_node(full_name))
        return 404, _error_body(404, f"no such method: {method} {bare}", "NOT_FOUND"), 0.0

    def _get_node(self, full_name: str):
        node = self._node_for(full_name)
        if node is None:
            return 404, _error_body(404, f"Resource '{full_name}' was not found", "NOT_FOUND")
        return 200, json.dumps(node)

    def _with_fault(self, target: str, normal):
        fault = self._take_fault(target)
        delay = fault.delay_s if fault else 0.0
        if fault and fault.status:
            status_name = {500: "INTERNAL", 503: "UNAVAILABLE", 403: "PERMISSION_DENIED", 429: "RESOURCE_EXHAUSTED"}
            return fault.status, _error_body(fault.status, "scripted failure", status_name.get(fault.status, "UNKNOWN")), delay
        if fault and fault.malformed:
            return 200, '{"name": "projects/oops", "state": "READ', delay
        status, body = normal()
        return status, body, delay


def _full_name(project: str, zone: str, name: str) -> str:
    return f"projects/{project}/locations/{zone}/nodes/{name}"


def _error_body(code: int, message: str, status: str) -> str:
    return json.dumps({"error": {"code": code, "message": message, "status": status}})


def _make_handler(server: TpuApiServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802 (http.server's naming)
            status, body, delay = server._answer("GET", self.path)
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


@pytest.fixture
def tpu_api(monkeypatch, tmp_path):
    """A running TpuApiServer; the environment cannot reach Google or a developer's credentials.

    TPU_API_DISCOVERY_URL would override any discovery URL given to the client, so it is removed;
    HOME points at an empty directory so gcloud credentials are never picked up.
    """
    for var in ("TPU_API_DISCOVERY_URL", "TPULAUNCH_TPU_DISCOVERY_URL", "TPU_NAME", "TPU_ZONE", "TPU_PROJECT",
                "GOOGLE_CLOUD_PROJECT", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    server = TpuApiServer().start()
    try:
        yield server
    finally:
        server.stop()
