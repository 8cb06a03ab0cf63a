"""The TPU VM startup script's own path, which a rehearsal mostly skips (it reuses this machine's Python and a
local model_dir): on a base image whose Python cannot make a venv (Ubuntu without python3-venv), the script installs
that package and goes on; on an image without gcloud or gsutil, its statuses still reach a gs:// model_dir; and a
host that cannot write run.model_dir at all stops at once, leaving why in its VM's guest attributes, which the
controller reads: the run ends with that reason, not recreated as a lost VM after --host-timeout. The real script
(`remote/startup.sh`) runs under bash against a local metadata server; what stands in for the image is on PATH: a
`python3` whose `-m venv` fails until python3-venv is installed (every other use is this machine's Python) and an
`apt-get` that records what it was asked."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
import threading
import time
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
    """A metadata server with what a one-host TPU VM's startup script reads (its service account's token too)."""
    attributes = {"agent-worker-number": "0", "tpulaunch-attempt": "1", "worker-network-endpoints": "10.0.0.2",
                  "accelerator-type": "v4-8"}
    token = json.dumps({"access_token": "vm-token", "expires_in": 3599, "token_type": "Bearer"})

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            name = self.path.rsplit("/", 1)[-1]
            value = attributes.get(name) if "/attributes/" in self.path else (
                "projects/1/zones/us-central2-b" if self.path.endswith("/zone") else
                token if self.path.endswith("/service-accounts/default/token") else None)
            self.send_response(200 if value is not None else 404)
            self.end_headers()
            self.wfile.write((value or "").encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/computeMetadata/v1/"
    server.shutdown()


def _script(attempts, tmp_path, requirements=("jax[tpu]>=0.4", "keras>=3"), python="''") -> str:
    """startup.sh as `remote/startup.py` fills it, with `attempts` as the run's attempts folder."""
    script = (REPO / "tpulaunch" / "remote" / "startup.sh").read_text()
    for key, value in {"@STAGE@": str(tmp_path / "stage.json"), "@PACKAGE@": str(tmp_path / "pkg.tar.gz"),
                       "@ATTEMPTS@": str(attempts), "@PYTHON@": python,
                       "@REQUIREMENTS@": shlex.join(requirements)}.items():
        script = script.replace(key, value)
    return script


def test_a_base_image_without_python3_venv_gets_it_installed_and_the_install_goes_on(tmp_path, metadata):
    bin_dir, calls, marker = tmp_path / "bin", tmp_path / "calls.txt", tmp_path / "python3-venv-installed"
    bin_dir.mkdir()
    for name, text in (("python3", PYTHON3), ("apt-get", APT_GET)):
        (bin_dir / name).write_text(text.format(marker=marker, calls=calls, python=sys.executable))
        (bin_dir / name).chmod(0o755)
    attempts = tmp_path / "model_dir" / "tpulaunch-remote" / "attempts"
    script = _script(attempts, tmp_path)
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


@pytest.fixture(scope="module")
def bucket():
    """fake-gcs-server with the bucket `runs`, and a google-cloud-storage client of it."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from gcs_fake import free_port
    from lease_runs import fake_gcs_server

    with fake_gcs_server(free_port()) as url:
        client = storage.Client(project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": url})
        client.create_bucket("runs")
        yield url, client


def _path_without(folder, *tools) -> str:
    """A PATH with every program of this one but `tools`."""
    folder.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            if entry.name not in tools and not (folder / entry.name).exists() and os.access(entry.path, os.X_OK):
                (folder / entry.name).symlink_to(entry.path)
    path = str(folder)
    assert all(shutil.which(tool, path=path) is None for tool in tools)
    return path


def test_without_gcloud_or_gsutil_a_failed_install_still_reaches_the_bucket(tmp_path, metadata, bucket):
    """A gs:// model_dir is written with the VM's token from the metadata server, in Python's standard library."""
    url, client = bucket
    attempts = "gs://runs/no-gcloud/tpulaunch-remote/attempts"
    env = {"PATH": _path_without(tmp_path / "bin", "gcloud", "gsutil"), "HOME": str(tmp_path / "home"),
           "TPULAUNCH_METADATA_URL": metadata, "STORAGE_EMULATOR_HOST": url,
           "TPULAUNCH_REHEARSAL_REQUIRE": "a-package-that-is-not-installed"}
    done = subprocess.run(["bash", "-c", _script(attempts, tmp_path, (), shlex.quote(sys.executable))], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    runs = client.bucket("runs")
    status = json.loads(runs.blob("no-gcloud/tpulaunch-remote/attempts/1/worker-0.json").download_as_bytes())
    assert (status["phase"], status["failed"], status["exit_code"]) == (
        "installing", "installing the job's requirements failed", 1)
    assert any("ERROR: a-package-that-is-not-installed is not installed" in line for line in status["log_tail"])
    log = runs.blob("no-gcloud/tpulaunch-remote/attempts/1/worker-0.startup.log").download_as_bytes().decode()
    assert "a-package-that-is-not-installed" in log


JOB = textwrap.dedent("""\
    name: unwritable
    model: {builder: tpulaunch.models.cnn:build, params: {num_classes: 10}, loss: sparse_categorical_crossentropy,
            optimizer: {name: sgd, learning_rate: 0.1}}
    data:
      train: gs://runs/data/train-*.tfrecord
      features: {image: {shape: [32, 32, 3]}}
      labels: {label: {shape: [], dtype: int64}}
    tpu: {name: unwritable-tpu, zone: us-central1-a, project: test-project, type: v3-8}
    train: {batch_size: 8, steps: 10}
    run: {model_dir: gs://runs/unwritable}
    """)


def test_a_host_that_cannot_write_model_dir_ends_the_run_at_once_and_is_not_recreated(tpu_api, tmp_path, bucket,
                                                                                      monkeypatch):
    """Its VM's service account may not write the bucket (here: its hosts reach no Cloud Storage at all): the
    startup script stops at its first status and leaves why in the VM's guest attributes; the controller reads
    them through the Cloud TPU API and ends the run with that reason well before --host-timeout, with one VM."""
    from tpulaunch.cli.gate import load_checked
    from tpulaunch.errors import TpuLaunchError
    from tpulaunch.job.schema import Tpu
    from tpulaunch.remote import store
    from tpulaunch.remote.controller import Controller, RunRecord
    from tpulaunch.remote.stage import stage_job
    from tpulaunch.remote.startup import startup_script
    from tpulaunch.tpu.lifecycle import Fallback, Lifecycle, placements, spec_for
    from tpulaunch.tpu.node import resolve_node

    url, client = bucket
    monkeypatch.setitem(store._clients, "client", client)  # the controller's writes (and its lease reads) reach it
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
    tpu_api.run_vms(str(tmp_path / "vms"), env={**os.environ, "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"})
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    checked = load_checked(str(job), [], local=True)
    stage = stage_job(checked, str(job), [], engine="estimator", target="local")
    tpu = Tpu(name="unwritable-tpu", zone="us-central1-a", project="test-project", type="v3-8")
    ref, spec = resolve_node(tpu), spec_for(tpu, "estimator")
    fallback = Fallback(ref, spec, placements(tpu, spec), make=lambda node_ref, node_spec: Lifecycle(
        node_ref, node_spec, api_endpoint=tpu_api.endpoint, poll_s=0.05), try_wait_s=60)
    said = []
    controller = Controller(fallback, stage, startup_script(stage, rehearsal_python=sys.executable),
                            job_file=str(job), recreate=2, poll_s=0.2, host_timeout_s=120, say=said.append,
                            out=said.append)
    started = time.monotonic()
    with pytest.raises(TpuLaunchError) as failed:
        controller.run(RunRecord(job="unwritable", job_file=str(job), stage=stage.digest, node=ref.name,
                                 zone=ref.zone, project=ref.project, started=time.time()))
    assert time.monotonic() - started < 60  # the host timeout (120 s) never came into it
    message = failed.value.message
    assert message.startswith("worker 0 of TPU node 'unwritable-tpu' (VM 1 of the run) failed while starting: "
                              "this host cannot write its status to run.model_dir: cannot write "
                              "gs://runs/unwritable/tpulaunch-remote/attempts/1/worker-0.json: "), message
    assert "not retried" in message and "roles/storage.objectAdmin" in failed.value.hint
    assert len(tpu_api.created) == 1 and tpu_api.created[0]["node"]["metadata"]["enable-guest-attributes"] == "TRUE"
    record = RunRecord.load("gs://runs/unwritable")
    assert record.outcome.startswith("failed: worker 0: this host cannot write") and record.recoveries == []
