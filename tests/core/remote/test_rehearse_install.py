"""`tpulaunch rehearse --install`: the rehearsal's TPU VM hosts run the startup script's real install (a venv made by
this machine's base `python3 -m venv`, pip against the package index) instead of checking this machine's Python;
without the flag, a rehearsal is as before. The CLI in this process, its own local Cloud TPU API, the VM's host a
local process. The package index here is an empty folder (pip's configuration from the environment), so the
install fails at once with pip's own words: what the host did is read from its status in run.model_dir (with
the end of its startup output). No TensorFlow here; the real install against the real index (minutes) is in docs/cloud-tpu.md.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpulaunch.cli.app import cli

JOB = textwrap.dedent("""\
    name: installs
    model: {builder: my_model:build, optimizer: {name: sgd, learning_rate: 0.1}}
    data:
      train: data/train-*.tfrecord
      features: {x: {shape: [4]}}
      labels: {label: {shape: [], dtype: int64}}
    tpu: {name: my-tpu, zone: us-central1-a, project: p, type: v3-8, runtime_version: tpu-vm-tf-2.15.1-se}
    train: {batch_size: 8, steps: 10}
    run: {model_dir: runs/a}
    """)


@pytest.mark.parametrize("install", [False, True], ids=["this-machines-python", "install"])
def test_install_makes_the_hosts_run_the_vms_own_install_and_without_it_nothing_is_installed(
        install, tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "my_model.py").write_text("def build(**kw):\n    raise NotImplementedError\n")
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "index").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TPULAUNCH_TPU_API_ENDPOINT", raising=False)
    # pip's whole configuration: an index with nothing in it, so that an install from it fails at once
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "index").as_uri())
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    monkeypatch.setenv("TPULAUNCH_LOCAL_VM_FAIL_INSTALL", "0")  # a rehearsal's install check fails, as before

    done = CliRunner().invoke(cli, ["rehearse", "job.yaml", "--host-timeout", "120"]
                              + (["--install"] if install else []))

    assert done.exit_code == 3, done.output  # the host failed while installing: not retried
    model_dir = tmp_path / "runs/a/tpulaunch-remote"
    status = json.loads((model_dir / "attempts/1/worker-0.json").read_text())
    assert (status["phase"], status["failed"]) == ("installing", "installing the job's requirements failed")
    log = "\n".join(status["log_tail"])  # the end of its startup output, as its status carries it
    if install:
        # the VM's own path: its venv, then pip asking the index (empty here) for the engine's requirements
        assert "a rehearsal: this machine's Python" not in log
        assert f"{(tmp_path / 'index').as_uri()}/" in log and "ERROR: No matching distribution found for" in log, log
        assert "none at " + str(model_dir / "wheelhouse") in log  # it looked for the run's wheelhouse first
        assert "tpulaunch-rehearsal-missing-package" not in log  # the rehearsal's check did not run
    else:
        assert "a rehearsal: this machine's Python and its packages, nothing installed" in log
        assert "ERROR: tpulaunch-rehearsal-missing-package is not installed in this machine's Python" in log
        assert "No matching distribution" not in log
    assert not (model_dir / "wheelhouse").exists() or not any((model_dir / "wheelhouse").iterdir())
