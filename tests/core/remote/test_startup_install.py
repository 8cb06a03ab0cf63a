"""The TPU VM startup script's own path, which a rehearsal mostly skips (it reuses this machine's Python and a
local model_dir): on a base image whose Python cannot make a venv (Ubuntu without python3-venv), the script installs
that package and goes on; on an image without gcloud or gsutil, its statuses still reach a gs:// model_dir; and a
host that cannot write run.model_dir at all stops at once, leaving why in its VM's guest attributes, which the
controller reads: the run ends with that reason, not recreated as a lost VM after --host-timeout. The real script
(`remote/startup.sh`) runs under bash against a local metadata server; what stands in for the image is on PATH: a
`python3` whose `-m venv` fails until python3-venv is installed (every other use is this machine's Python) and an
`apt-get` that records what it was asked."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


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


def _script(model_dir, tmp_path, requirements=("jax[tpu]>=0.4", "keras>=3"), python=None,
            package=None) -> str:
    """startup.sh as `remote/startup.py` fills it for a run in `model_dir`."""
    from tpulaunch.remote.startup import render

    return render(stage=str(tmp_path / "stage.json"), package=str(package or tmp_path / "pkg.tar.gz"),
                  model_dir=str(model_dir), requirements=requirements, rehearsal_python=python)


def test_a_base_image_without_python3_venv_gets_it_installed_and_the_install_goes_on(tmp_path, metadata):
    bin_dir, calls, marker = tmp_path / "bin", tmp_path / "calls.txt", tmp_path / "python3-venv-installed"
    bin_dir.mkdir()
    for name, text in (("python3", PYTHON3), ("apt-get", APT_GET)):
        (bin_dir / name).write_text(text.format(marker=marker, calls=calls, python=sys.executable))
        (bin_dir / name).chmod(0o755)
    attempts = tmp_path / "model_dir" / "tpulaunch-remote" / "attempts"
    script = _script(tmp_path / "model_dir", tmp_path)
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
    env = {"PATH": _path_without(tmp_path / "bin", "gcloud", "gsutil"), "HOME": str(tmp_path / "home"),
           "TPULAUNCH_METADATA_URL": metadata, "STORAGE_EMULATOR_HOST": url,
           "TPULAUNCH_REHEARSAL_REQUIRE": "a-package-that-is-not-installed"}
    done = subprocess.run(["bash", "-c", _script("gs://runs/no-gcloud", tmp_path, (), sys.executable)], env=env,
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
    from tpulaunch.app.gate import load_checked
    from tpulaunch.errors import TpuLaunchError
    from tpulaunch.job.schema import Tpu
    from tpulaunch.remote.controller import Controller, RunRecord
    from tpulaunch.remote.stage import stage_job
    from tpulaunch.remote.startup import startup_script
    from tpulaunch.tpu.lifecycle import Fallback, Lifecycle, placements, spec_for
    from tpulaunch.tpu.node import resolve_node

    url, client = bucket
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)  # the controller's writes (and its lease reads) reach it
    tpu_api.run_vms(str(tmp_path / "vms"), env={**os.environ, "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"})
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    checked = load_checked(str(job), [], local=True)
    stage = stage_job(checked, str(job), [], engine="estimator", target="local")
    tpu = Tpu(name="unwritable-tpu", zone="us-central1-a", project="test-project", type="v3-8",
              runtime_version="tpu-vm-tf-2.15.1-se")  # named: this environment has no TensorFlow to choose it
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


def _wheel(folder, name: str, requires=()) -> str:
    """A one-module wheel of `name` 1.0 (importable as `name`), written into `folder` with its metadata beside it
    (`<wheel>.metadata`, as PyPI serves it: PEP 658); its file name."""
    import base64
    import hashlib
    import zipfile

    dist = f"{name}-1.0"
    files = {f"{name}/__init__.py": "VERSION = '1.0'\n",
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
                                           + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(text.encode())}" for path, text in files.items()]
    files[f"{dist}.dist-info/RECORD"] = "\n".join(record + [f"{dist}.dist-info/RECORD,,"]) + "\n"
    filename = f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(folder / filename, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    (folder / f"{filename}.metadata").write_text(files[f"{dist}.dist-info/METADATA"])
    return filename


@pytest.fixture
def package_index(tmp_path):
    """A package index (PEP 503's simple pages, each wheel's metadata served apart as PyPI does) with two small
    wheels, the second needed by the first; it counts what it is asked."""
    root = tmp_path / "index"
    (root / "files").mkdir(parents=True)
    for name, requires in (("tinyhouse_app", ["tinyhouse-dep>=1"]), ("tinyhouse_dep", [])):
        filename = _wheel(root / "files", name, requires)
        page = root / "simple" / name.replace("_", "-")
        page.mkdir(parents=True)
        metadata = hashlib.sha256((root / "files" / f"{filename}.metadata").read_bytes()).hexdigest()
        (page / "index.html").write_text(f'<a href="../../files/{filename}" data-core-metadata="sha256={metadata}" '
                                         f'data-dist-info-metadata="sha256={metadata}">{filename}</a>\n')
    asked = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            asked.append(self.path)
            path = root / self.path.strip("/").split("?")[0]
            if path.is_dir():
                path = path / "index.html"
            self.send_response(200 if path.is_file() else 404)
            self.send_header("Content-Type", "text/html" if path.suffix == ".html" else "application/octet-stream")
            if path.suffix == ".whl":  # as PyPI serves its files (cacheable for a year): pip keeps them in its cache
                self.send_header("Cache-Control", "max-age=365000000, immutable, public")
            self.end_headers()
            if path.is_file():
                self.wfile.write(path.read_bytes())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple/", asked
    server.shutdown()


HOST_RUNNER = """import sys
with open({said!r}, "a") as handle:
    handle.write(" ".join(sys.argv[1:]) + "\\n")
"""


def _host(tmp_path, index, requirements):
    """(the startup script, its environment, the file its stand-in host runner writes its arguments to): a stage of
    a run in tmp_path/model_dir whose tpulaunch is a host runner that says it ran, pip pointed at `index`."""
    said = tmp_path / "host-runner.txt"
    runner = tmp_path / "pkg" / "tpulaunch" / "remote"  # what stands for tpulaunch: a host runner that says it ran
    runner.mkdir(parents=True)
    for folder in (runner.parent, runner):
        (folder / "__init__.py").write_text("")
    (runner / "host.py").write_text(HOST_RUNNER.format(said=str(said)))
    from tpulaunch.remote.stage import tar_gz

    (tmp_path / "pkg.tar.gz").write_bytes(tar_gz([("tpulaunch", str(runner.parent))]))
    script = _script(tmp_path / "model_dir", tmp_path, requirements)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    # pip caches what it fetches over https, or from a trusted host: as trusted, this index is cached as PyPI is
    env.update(PIP_INDEX_URL=index, PIP_TRUSTED_HOST="127.0.0.1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return script, env, said


def _boot(script: str, env: dict, home) -> str:
    """One host's startup (a fresh disk and pip cache: its own home); what it printed."""
    done = subprocess.run(["bash", "-c", script], env={**env, "HOME": str(home)}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _wheelhouse(model_dir) -> dict:
    (described,) = [json.loads(p.read_text()) for p in (model_dir / "tpulaunch-remote" / "wheelhouse").glob("*.json")]
    return described


def test_the_first_host_keeps_a_wheelhouse_and_a_recreated_vms_host_installs_from_it_not_the_index(
        tmp_path, metadata, package_index):
    """The real venv and pip (a TPU VM's path, not a rehearsal's): VM 1's worker 0 installs from the index and keeps
    what it installed under run.model_dir; a host of the next VM (fresh disk, fresh pip cache) installs the same
    requirements from there with the index not asked at all."""
    index, asked = package_index
    script, env, said = _host(tmp_path, index, ["tinyhouse-app>=1"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))  # the image's python3, with its venv module
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", TPULAUNCH_METADATA_URL=metadata)

    first = _boot(script, env, tmp_path / "vm-1-worker-0")
    wheels = [path for path in asked if path.endswith(".whl")]  # each once: keeping them asked the index for none
    assert sorted(wheels) == ["/files/tinyhouse_app-1.0-py3-none-any.whl", "/files/tinyhouse_dep-1.0-py3-none-any.whl"]
    assert "kept what it installed as the run's wheelhouse" in first
    assert _wheelhouse(tmp_path / "model_dir")["wheels"] == ["tinyhouse_app-1.0-py3-none-any.whl",
                                                              "tinyhouse_dep-1.0-py3-none-any.whl"]
    assert "--installed-from index" in said.read_text()

    before = len(asked)
    later = _boot(script, env, tmp_path / "vm-2-worker-0")  # a recreated VM: a new disk, no pip cache
    assert asked[before:] == []  # the package index was not asked anything
    assert "installed the job's requirements from the run's wheelhouse" in later
    assert said.read_text().splitlines()[-1].endswith("--installed-from wheelhouse")
    venv_python = tmp_path / "vm-2-worker-0" / "tpulaunch" / "venv" / "bin" / "python"
    imported = subprocess.run([str(venv_python), "-c", "import tinyhouse_app, tinyhouse_dep"], env=env)
    assert imported.returncode == 0


def test_a_gke_pods_install_over_its_image_is_kept_and_a_restarted_pod_installs_from_it_not_the_index(
        tmp_path, package_index):
    """A GKE pod (remote/jobset.py: $TPU_WORKER_ID, the image's Python in $TPULAUNCH_IMAGE_PYTHON) on an image that
    already has tinyhouse-dep: the first pod installs only what the image lacks (tinyhouse-app) and keeps exactly
    that, from pip's install report, not the image's own packages; a pod of the JobSet's restart, on a fresh copy of
    the image, installs it from the wheelhouse with the index not asked."""
    index, asked = package_index
    script, env, said = _host(tmp_path, index, ["tinyhouse-app>=1"])
    env.update(TPU_WORKER_ID="0", TPU_WORKER_HOSTNAMES="localhost")

    def image(name: str) -> str:
        """A fresh copy of the image: a Python with tinyhouse-dep installed (and pip, as the stock images have)."""
        subprocess.run([sys.executable, "-m", "venv", str(tmp_path / name)], check=True)
        python = str(tmp_path / name / "bin" / "python")
        subprocess.run([python, "-m", "pip", "install", "-q", "tinyhouse-dep"], env={**env, "HOME": str(tmp_path)},
                       check=True)
        return python

    first_image, restarted_image = image("image-1"), image("image-2")
    before = len(asked)
    first = _boot(script, {**env, "TPULAUNCH_IMAGE_PYTHON": first_image, "TPULAUNCH_RESTART_ATTEMPT": "0"},
                  tmp_path / "pod-1")
    assert [path for path in asked[before:] if path.endswith(".whl")] == ["/files/tinyhouse_app-1.0-py3-none-any.whl"]
    assert "kept what it installed as the run's wheelhouse" in first, first
    kept = _wheelhouse(tmp_path / "model_dir")
    assert (kept["wheels"], kept["pins"]) == (["tinyhouse_app-1.0-py3-none-any.whl"], ["tinyhouse_app==1.0"])

    before = len(asked)
    later = _boot(script, {**env, "TPULAUNCH_IMAGE_PYTHON": restarted_image, "TPULAUNCH_RESTART_ATTEMPT": "1"},
                  tmp_path / "pod-2")
    assert asked[before:] == []  # the package index was not asked anything
    assert "installed the job's requirements from the run's wheelhouse" in later, later
    assert said.read_text().splitlines()[-1].endswith("--installed-from wheelhouse")
    imported = subprocess.run([restarted_image, "-c", "import tinyhouse_app, tinyhouse_dep"], env=env)
    assert imported.returncode == 0


def test_a_wheelhouse_that_does_not_match_its_hash_is_not_used(tmp_path):
    from tpulaunch.remote import boot_tools

    (tmp_path / "wheels").mkdir()
    _wheel(tmp_path / "wheels", "tinyhouse_app")
    (tmp_path / "pins.txt").write_text("tinyhouse_app==1.0\n")
    house = str(tmp_path / "model_dir" / "wheelhouse" / boot_tools.wheelhouse_key(["tinyhouse-app"]))
    boot_tools.wheelhouse_put(str(tmp_path / "wheels"), house, str(tmp_path / "pins.txt"), ["tinyhouse-app"])
    assert boot_tools.wheelhouse_get(house, str(tmp_path / "fetched"))["pins"] == ["tinyhouse_app==1.0"]
    with open(house + ".tar", "r+b") as tar:  # one byte of it changed after it was kept
        tar.seek(600)
        tar.write(b"X")
    with pytest.raises(ValueError, match="does not match its hash"):
        boot_tools.wheelhouse_get(house, str(tmp_path / "again"))
    assert not (tmp_path / "again" / "tinyhouse_app-1.0-py3-none-any.whl").exists()
    assert boot_tools.main(["wheelhouse-get", str(tmp_path / "none"), str(tmp_path / "x")]) == boot_tools.ABSENT
