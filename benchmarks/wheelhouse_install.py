"""One install from the package index per run: what a TPU VM host's install of the job's requirements costs from
the package index (the first host of a run, which also keeps the run's wheelhouse) against one from the run's
wheelhouse (every later host, a recreated VM's too).

The real startup script (`tpulaunch/remote/startup.sh`, as `startup.py` renders it for a TPU VM, not a
rehearsal), the real `python3 -m venv --system-site-packages` and pip, against the real package index (pypi.org,
this machine's pip configuration ignored, as a TPU VM has none), each host with a fresh disk and pip cache.
What stands in: a metadata server (the host's place), a local model_dir (the bucket), and a host runner that
only reports the install's times (the job itself is not run). Bytes from the index are counted by an HTTPS
proxy the hosts' pip goes through.

    .venv/bin/python benchmarks/wheelhouse_install.py [--extra jax-tpu]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tpulaunch.remote.stage import install_requirements, tar_gz  # noqa: E402
from tpulaunch.remote.startup import render  # noqa: E402


class CountingProxy(socketserver.ThreadingTCPServer):
    """An HTTPS (CONNECT) proxy that counts the bytes each tunnel brings back from the server."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Tunnel)
        self.received = 0
        self.hosts = set()
        self.lock = threading.Lock()


class _Tunnel(socketserver.StreamRequestHandler):
    def handle(self):
        line = self.rfile.readline().decode("latin-1").split()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        if len(line) < 2 or line[0] != "CONNECT":
            return
        host, _, port = line[1].rpartition(":")
        upstream = socket.create_connection((host, int(port)), timeout=60)
        self.server.hosts.add(host)
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.wfile.flush()
        ends = [self.connection, upstream]
        while True:
            ready, _, _ = select.select(ends, [], [], 120)
            if not ready:
                break
            for end in ready:
                data = end.recv(1 << 16)
                if not data:
                    upstream.close()
                    return
                if end is upstream:
                    with self.server.lock:
                        self.server.received += len(data)
                    self.connection.sendall(data)
                else:
                    upstream.sendall(data)


def metadata_server(worker: int, attempt: int):
    """A TPU VM host's metadata: worker `worker` of a two-host v4-16, VM `attempt` of the run."""
    attributes = {"agent-worker-number": str(worker), "tpulaunch-attempt": str(attempt),
                  "worker-network-endpoints": "10.0.0.2,10.0.0.3", "accelerator-type": "v4-16"}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            value = attributes.get(self.path.rsplit("/", 1)[-1]) if "/attributes/" in self.path else (
                "projects/1/zones/us-central2-b" if self.path.endswith("/zone") else None)
            self.send_response(200 if value is not None else 404)
            self.end_headers()
            self.wfile.write((value or "").encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/computeMetadata/v1/"


HOST_RUNNER = """import json, sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
with open({said!r}, "w") as handle:
    json.dump(args, handle)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra", default="jax-tpu", help="tpulaunch's extra whose requirements the hosts install")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args()
    requirements = install_requirements(args.extra, strict=True)
    root = Path(tempfile.mkdtemp(prefix="wheelhouse-bench-"))
    said = root / "host-runner.json"
    runner = root / "pkg" / "tpulaunch" / "remote"
    runner.mkdir(parents=True)
    for folder in (runner.parent, runner):
        (folder / "__init__.py").write_text("")
    (runner / "host.py").write_text(HOST_RUNNER.format(said=str(said)))
    (root / "pkg.tar.gz").write_bytes(tar_gz([("tpulaunch", str(runner.parent))]))
    script = render(stage=str(root / "stage.json"), package=str(root / "pkg.tar.gz"), model_dir=str(root / "model_dir"),
                    requirements=requirements)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))  # the base interpreter, with venv
    proxy = CountingProxy()
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    proxy_url = f"http://127.0.0.1:{proxy.server_address[1]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", PIP_CONFIG_FILE=os.devnull, HTTPS_PROXY=proxy_url,
               https_proxy=proxy_url, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    print(f"requirements ({args.extra}): {' '.join(requirements)}")
    print(f"python: {os.path.realpath(sys.executable)} ({sys.version.split()[0]})")
    rows = []
    # one after the other, each with a disk of its own: a host of the first VM that finds no wheelhouse (as every
    # host did before it), the first VM's worker 0 (installs and keeps it), a recreated VM's host (installs from it)
    for worker, vm, who in ((1, 1, "VM 1, worker 1: no wheelhouse yet (every host, before)"),
                            (0, 1, "VM 1, worker 0: installs and keeps the wheelhouse"),
                            (0, 2, "VM 2 (recreated), worker 0: from the wheelhouse")):
        server, url = metadata_server(worker, vm)
        before = proxy.received
        done = subprocess.run(["bash", "-c", script], env={**env, "HOME": str(root / f"vm-{vm}-worker-{worker}"),
                                                          "TPULAUNCH_METADATA_URL": url},
                              capture_output=True, text=True, timeout=3600)
        server.shutdown()
        if done.returncode != 0:
            print(done.stdout + done.stderr)
            return 1
        times = json.loads(said.read_text())
        rows.append({"host": who, "from": times.get("--installed-from"),
                     "install_s": float(times["--installed"]) - float(times["--booted"]),
                     "index_bytes": proxy.received - before})
        print(done.stdout.strip())
    houses = list((root / "model_dir" / "tpulaunch-remote" / "wheelhouse").glob("*.json"))
    described = json.loads(houses[0].read_text()) if houses else {}
    print()
    print("| host | installed from | install (boot to installed) | bytes from the package index |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['host']} | {row['from']} | {row['install_s']:.1f} s | {row['index_bytes'] / 1e6:,.1f} MB |")
    if described:
        print(f"\nwheelhouse: {len(described['wheels'])} wheels, {described['bytes'] / 1e6:,.1f} MB "
              f"(hosts reached: {', '.join(sorted(proxy.hosts))})")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
