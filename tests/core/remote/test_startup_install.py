"""The TPU VM startup script's install path, which a rehearsal skips (it reuses this machine's Python): on a base image
whose Python cannot make a venv (Ubuntu without python3-venv), the script installs that package and goes on, rather
than failing the VM's install. The real script (`remote/startup.sh`) runs under bash against a local metadata
server; what stands in for the image is on PATH: a `python3` whose `-m venv` fails until python3-venv is installed
(every other use is this machine's Python) and an `apt-get` that records what it was asked."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from paths import REPO

PYTHON3 = """#!/bin/bash
# A base image's python3: `-m venv` needs Ubuntu's python3.X-venv (installed: the marker); the rest is real Python.
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  [ -e "{marker}" ] || {{ echo "The virtual environment was not created successfully because ensurepip is not available."; exit 1; }}
  target="${{@: -1}}"
  mkdir -p "$target/bin"
  printf '#!/bin/bash\\necho "$@" >> "{calls}"\\n' > "$target/bin/python"
  chmod +x "$target/bin/python"
  exit 0
fi
exec {python} "$@"
"""
APT_GET = """#!/bin/bash
echo "apt-get $*" >> "{calls}"
[ "$1" = "install" ] && touch "{marker}"
exit 0
"""


@pytest.fixture
def metadata():
    """A metadata server with what a one-host TPU VM's startup script reads."""
    attributes = {"agent-worker-number": "0", "tpulaunch-attempt": "1", "worker-network-endpoints": "10.0.0.2",
                  "accelerator-type": "v4-8"}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            name = self.path.rsplit("/", 1)[-1]
            value = attributes.get(name) if "/attributes/" in self.path else (
                "projects/1/zones/us-central2-b" if self.path.endswith("/zone") else None)
            self.send_response(200 if value is not None else 404)
            self.end_headers()
            self.wfile.write((value or "").encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/computeMetadata/v1/"
    server.shutdown()


def test_a_base_image_without_python3_venv_gets_it_installed_and_the_install_goes_on(tmp_path, metadata):
    bin_dir, calls, marker = tmp_path / "bin", tmp_path / "calls.txt", tmp_path / "python3-venv-installed"
    bin_dir.mkdir()
    for name, text in (("python3", PYTHON3), ("apt-get", APT_GET)):
        (bin_dir / name).write_text(text.format(marker=marker, calls=calls, python=sys.executable))
        (bin_dir / name).chmod(0o755)
    attempts = tmp_path / "model_dir" / "tpulaunch-remote" / "attempts"
    script = (REPO / "tpulaunch" / "remote" / "startup.sh").read_text()
    for key, value in {"@STAGE@": str(tmp_path / "stage.json"), "@PACKAGE@": str(tmp_path / "pkg.tar.gz"),
                       "@ATTEMPTS@": str(attempts), "@PYTHON@": "''",
                       "@REQUIREMENTS@": shlex.join(["jax[tpu]>=0.4", "keras>=3"])}.items():
        script = script.replace(key, value)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path / "home"),
           "TPULAUNCH_METADATA_URL": metadata}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    lines = calls.read_text().splitlines()
    assert lines[:2] == ["apt-get update -q", f"apt-get install -y -q python3.{sys.version_info[1]}-venv"], lines
    assert "-m pip install -q jax[tpu]>=0.4 keras>=3" in lines  # the requirements went into the new venv
    assert "python3 -m venv failed: installing Ubuntu's python3-venv" in said
    status = json.loads((attempts / "1" / "worker-0.json").read_text())
    assert status["phase"] == "fetching" and "failed" not in status, status
