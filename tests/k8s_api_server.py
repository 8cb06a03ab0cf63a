"""A local stand-in for the part of a Kubernetes API server `tpulaunch run` uses on GKE, plus the kubeconfig that
reaches it: JobSets created, read and deleted in a namespace (`/apis/jobset.x-k8s.io/v1alpha2/...`), each created one
checked against the JobSet CRD's schema as the API server checks it under strict field validation (422 and the
fields, as the API server answers), a name taken answered 409. The test plays the JobSet controller: it sets a
JobSet's status (`set_status`), as the controller does when its pods end.

The official Kubernetes client speaks to it over HTTP, configured by a kubeconfig file as kubectl is.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, Optional, Tuple

import yaml

from k8s_schema import jobset_errors

_PATH = re.compile(r"^/apis/jobset\.x-k8s\.io/v1alpha2/namespaces/(?P<ns>[^/]+)/jobsets(?:/(?P<name>[^/?]+))?")


class KubeApi:
    """The stand-in; `.kubeconfig(path)` writes a kubeconfig whose current context reaches it."""

    def __init__(self):
        self.jobsets: Dict[Tuple[str, str], dict] = {}
        self.requests: list = []  # (method, path) of every request, in order
        self.created = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "KubeApi":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def kubeconfig(self, path: Path, context: str = "gke_p_us-central1_c") -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": "c", "cluster": {"server": self.url}}],
            "users": [{"name": "u", "user": {"token": "local-token"}}],
            "contexts": [{"name": context, "context": {"cluster": "c", "user": "u"}}],
        }))
        return path

    def jobset(self, name: str, namespace: str = "default") -> Optional[dict]:
        with self._lock:
            return self.jobsets.get((namespace, name))

    def set_status(self, name: str, status: dict, namespace: str = "default") -> None:
        with self._lock:
            self.jobsets[(namespace, name)]["status"] = status

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._answer(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                                    "reason": reason, "message": message})

            def _route(self, method: str):
                api.requests.append((method, self.path))
                match = _PATH.match(self.path)
                if not match:
                    return self._status(404, "NotFound", f"the server could not find {self.path}")
                namespace, name = match["ns"], match["name"]
                with api._lock:
                    if method == "POST" and name is None:
                        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                        errors = jobset_errors(body)
                        if errors:
                            return self._status(422, "Invalid", "JobSet is invalid: " + "; ".join(errors))
                        key = (namespace, body["metadata"]["name"])
                        if key in api.jobsets:
                            return self._status(409, "AlreadyExists", f"jobsets \"{key[1]}\" already exists")
                        body["metadata"].setdefault("namespace", namespace)
                        api.jobsets[key] = body
                        api.created.set()
                        return self._answer(201, body)
                    key = (namespace, name)
                    if key not in api.jobsets:
                        return self._status(404, "NotFound", f"jobsets \"{name}\" not found")
                    if method == "GET":
                        return self._answer(200, api.jobsets[key])
                    if method == "DELETE":
                        return self._answer(200, api.jobsets.pop(key))
                return self._status(405, "MethodNotAllowed", method)

            def do_GET(self):
                self._route("GET")

            def do_POST(self):
                self._route("POST")

            def do_DELETE(self):
                self._route("DELETE")

        return Handler
