"""The local Cloud TPU API's TPU VMs (tpulaunch/tpu/local_vm.py), and staging (tpulaunch/remote/stage.py).

The node is created through the real google-cloud-tpu and tpulaunch's own Lifecycle, as `tpulaunch run` creates
it: its startup script then runs on every host as a local process, reading the metadata server the way a TPU
VM's script reads it (curl with the Metadata-Flavor header). No TensorFlow here.
"""

from __future__ import annotations

import json
import textwrap
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from tpu_api_server import DEFAULT_PROJECT, DEFAULT_ZONE
from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.schema import Tpu
from tpulaunch.remote import layout
from tpulaunch.tpu.lifecycle import Lifecycle, spec_for
from tpulaunch.tpu.local_vm import METADATA_URL_ENV
from tpulaunch.tpu.node import resolve_node

SCRIPT = textwrap.dedent("""\
    #!/bin/bash
    META="${TPULAUNCH_METADATA_URL:-http://metadata.google.internal/computeMetadata/v1/}"
    get() { curl -sSf -H "Metadata-Flavor: Google" "${META}instance/attributes/$1"; }
    zone="$(curl -sSf -H "Metadata-Flavor: Google" "${META}instance/zone")"
    echo "$(get agent-worker-number) $(get accelerator-type) $(get greeting) ${zone##*/}" > "$HOME/seen"
    echo $$ > "$HOME/pid"
    sleep 600
    """)


def _wait_for(path: Path, seconds: float = 30.0) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_each_host_runs_the_startup_script_with_its_metadata_and_dies_with_the_node(tpu_api, tmp_path):
    vms = tpu_api.run_vms(str(tmp_path / "vms"), hosts=2)
    ref = resolve_node(Tpu(name="vm-tpu", zone=DEFAULT_ZONE, project=DEFAULT_PROJECT, type="v4-16"))
    spec = replace(spec_for(Tpu(name="vm-tpu", zone=DEFAULT_ZONE, project=DEFAULT_PROJECT, type="v4-16",
                                runtime_version="tpu-vm-tf-2.15.1-pod-se"), "estimator"),
                   metadata=(("startup-script", SCRIPT), ("greeting", "hello")))
    life = Lifecycle(ref, spec, api_endpoint=tpu_api.endpoint, poll_s=0.05)
    life.create(wait_s=30)
    (vm,) = vms.vms.values()
    seen = sorted(_wait_for(Path(host.disk) / "seen") for host in vm.hosts)
    assert seen == ["0 v4-16 hello us-central1-a\n", "1 v4-16 hello us-central1-a\n"]
    # one endpoint per host, in the node as in each host's metadata
    assert len(life.read_node()["networkEndpoints"]) == 2 == len(vm.attributes(0)["worker-network-endpoints"].split(","))
    pids = [int(_wait_for(Path(host.disk) / "pid")) for host in vm.hosts]
    assert all(_alive(pid) for pid in pids)

    # The metadata server answers only with the header, as Google's does.
    url = f"{tpu_api.root_url}vm/{vm.vm_id}/0/computeMetadata/v1/instance/attributes/agent-worker-number"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=5)
    assert refused.value.code == 403
    assert vm.hosts[0].process.args[0] == "bash" and METADATA_URL_ENV in open(
        f"/proc/{vm.hosts[0].process.pid}/environ").read()

    assert tpu_api.preempt("vm-tpu") == 2
    assert not any(_alive(pid) for pid in pids)  # the script's own children died with their process group
    assert life.read_node()["state"] == "PREEMPTED"
    life.delete(wait_s=30)
    assert life.read_node() is None


JOB = textwrap.dedent("""\
    name: staged
    model: {builder: my_model:build, optimizer: {name: sgd, learning_rate: 0.1}}
    data:
      train: data/train-*.tfrecord
      features: {x: {shape: [4]}}
      labels: {label: {shape: [], dtype: int64}}
    python_path: [lib]
    tpu: {name: my-tpu, zone: us-central1-a, project: p, type: v3-8, runtime_version: tpu-vm-tf-2.15.1-se}
    train: {batch_size: 8, steps: "${STEPS:-10}"}
    run: {model_dir: runs/a}
    """)


def _checked(job: Path, overrides=()):
    from tpulaunch.app.gate import load_checked

    return load_checked(str(job), list(overrides), local=True)


def test_staging_is_content_addressed_and_writes_no_environment_value(tmp_path, monkeypatch, tpu_api):
    from tpulaunch.remote.stage import stage_job

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "helpers.py").write_text("X = 1\n")
    (tmp_path / "my_model.py").write_text("def build(**kw):\n    raise NotImplementedError\n")
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STEPS", raising=False)

    first = stage_job(_checked(job, ["train.batch_size=8"]), str(job), ["train.batch_size=8"], engine="estimator",
                      target="local")
    again = stage_job(_checked(job, ["train.batch_size=8"]), str(job), ["train.batch_size=8"], engine="estimator",
                      target="local")
    assert first.uploaded == first.total == 5  # the job, its module, python_path's folder, tpulaunch, the manifest
    assert (again.digest, again.uploaded) == (first.digest, 0)
    manifest = json.loads(Path(first.url).read_text())
    staged_job = Path(layout.blob(str(tmp_path / "runs/a"), manifest["job"]["blob"])).read_text()
    assert '"${STEPS:-10}"' in staged_job  # the reference, not a value
    assert manifest["sets"][0] == "train.batch_size=8"
    assert f'data.train="{tmp_path}/data/train-*.tfrecord"' in manifest["sets"]
    assert 'python_path=["python_path/0"]' in manifest["sets"]
    assert {b["into"] for b in manifest["bundles"]} == {"job", "job/python_path/0"}

    # Set here, but the VM reads ${STEPS} from Secret Manager, which has no secret STEPS: the VM would use the
    # default, not this value; refused where it is used.
    from tpulaunch.remote import secret_manager

    monkeypatch.setenv("STEPS", "12")
    tpu_api.secrets_from(str(tmp_path / "no-secrets"))
    checked = _checked(job)
    refs = secret_manager.vm_references(secret_manager.references(checked.loaded))
    assert [(ref.name, ref.default) for ref in refs] == [("STEPS", "10")]
    with pytest.raises(TpuLaunchError) as refused:
        secret_manager.require(checked.loaded, checked.job, refs, "p", job_file=str(job),
                               url=tpu_api.secret_manager_url)
    (problem,) = refused.value.problems
    assert (problem.code, problem.path, problem.line) == ("remote-env-var", "train.steps", 9)
    monkeypatch.delenv("STEPS")
    with pytest.raises(TpuLaunchError) as local:  # a real TPU VM cannot read this machine's files
        stage_job(_checked(job), str(job), [], engine="estimator", target="tpu")
    assert {p.path for p in local.value.problems} == {"data.train", "run.model_dir"}


def test_staging_and_following_through_gs(tmp_path, monkeypatch):
    """The same stage on gs:// (google-cloud-storage against fake-gcs-server, as the lease's gs:// tests): written
    once, found on a rerun, and a host's log read from where the last read ended."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from gcs_fake import free_port
    from lease_runs import fake_gcs_server
    from tpulaunch import store
    from tpulaunch.remote.follow import HostLog
    from tpulaunch.remote.stage import stage_job

    (tmp_path / "lib").mkdir()
    (tmp_path / "my_model.py").write_text("def build(**kw):\n    raise NotImplementedError\n")
    job = tmp_path / "job.yaml"
    job.write_text(JOB.replace("data/train-*.tfrecord", "gs://bucket/data/train-*.tfrecord")
                   .replace("runs/a", "gs://bucket/runs/a"))
    monkeypatch.chdir(tmp_path)
    with fake_gcs_server(free_port()) as url:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
        storage.Client(project="test", credentials=AnonymousCredentials()).create_bucket("bucket")
        first = stage_job(_checked(job), str(job), [], engine="estimator", target="tpu")
        again = stage_job(_checked(job), str(job), [], engine="estimator", target="tpu")
        assert (first.uploaded, again.uploaded, again.digest) == (first.total, 0, first.digest)
        assert json.loads(store.read(first.url).data)["sets"][-1] == 'python_path=["python_path/0"]'

        log = HostLog("gs://bucket/runs/a", attempt=1)
        assert log.new_lines() == []  # not written yet
        store.write(log.url, b"train | start | step 0/10 | batch 8\ntrain | step 1/10 | loss 2.3\ntrain | st")
        assert log.new_lines() == ["train | start | step 0/10 | batch 8", "train | step 1/10 | loss 2.3"]
        assert log.new_lines() == []
        store.write(log.url, b"train | start | step 0/10 | batch 8\ntrain | step 1/10 | loss 2.3\ntrain | step 2/10\n")
        assert log.new_lines() == ["train | step 2/10"] and (log.started_from, log.step) == (0, 2)


def test_a_vm_reads_its_secrets_with_its_service_accounts_token_and_only_with_it(tpu_api, tmp_path):
    from tpulaunch.remote import secret_manager

    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "API_TOKEN").write_text("v4lue")
    tpu_api.secrets_from(str(tmp_path / "secrets"))
    vms = tpu_api.run_vms(str(tmp_path / "vms"))
    ref = resolve_node(Tpu(name="sm-tpu", zone=DEFAULT_ZONE, project=DEFAULT_PROJECT, type="v3-8"))
    spec = spec_for(Tpu(name="sm-tpu", zone=DEFAULT_ZONE, project=DEFAULT_PROJECT, type="v3-8",
                        runtime_version="tpu-vm-tf-2.15.1-se"), "estimator")
    Lifecycle(ref, spec, api_endpoint=tpu_api.endpoint, poll_s=0.05).create(wait_s=30)
    (vm,) = vms.vms.values()
    on_vm = {secret_manager.METADATA_URL_ENV: f"{tpu_api.root_url}vm/{vm.vm_id}/0/computeMetadata/v1/",
             secret_manager.URL_ENV: tpu_api.secret_manager_url}
    wanted = {"project": DEFAULT_PROJECT, "names": [{"name": "API_TOKEN", "optional": False},
                                                    {"name": "LEVEL", "optional": True}]}
    assert secret_manager.read_on_vm(wanted, on_vm) == {"API_TOKEN": "v4lue"}  # LEVEL: none, its default applies
    wanted["names"][1]["optional"] = False
    with pytest.raises(secret_manager.SecretUnreadable, match="cannot read secret LEVEL of project 'test-project': "
                                                              "it has no enabled version"):
        secret_manager.read_on_vm(wanted, on_vm)
    # Anyone may learn that a secret exists (as `run` checks); its value needs a VM's token.
    assert secret_manager.existing(DEFAULT_PROJECT, ["API_TOKEN", "LEVEL"], tpu_api.secret_manager_url) == {
        "API_TOKEN": True, "LEVEL": False}
    url = f"{tpu_api.secret_manager_url}projects/{DEFAULT_PROJECT}/secrets/API_TOKEN/versions/latest:access"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": "Bearer guessed"}), timeout=5)
    assert refused.value.code == 403
