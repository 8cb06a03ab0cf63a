"""`tpulaunch run` on bad input, as a user meets it: one located message, a known exit code, nothing created.
The CLI in a process of its own against the local Cloud TPU API; no TensorFlow."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from paths import REPO

JOB = textwrap.dedent("""\
    name: faults
    model: {builder: tpulaunch.models.cnn:build, params: {num_classes: 10}, loss: sparse_categorical_crossentropy,
            optimizer: {name: sgd, learning_rate: 0.1}}
    data:
      train: gs://tpulaunch-test-bucket/data/train-*.tfrecord
      features: {image: {shape: [32, 32, 3]}}
      labels: {label: {shape: [], dtype: int64}}
    tpu: {name: faults-tpu, zone: us-central1-a, project: test-project, type: v3-8, iterations_per_loop: 5}
    train: {batch_size: 8, steps: 10}
    run: {model_dir: gs://tpulaunch-test-bucket/runs/a, save_checkpoints_steps: 5}
    """)


def test_no_credentials_is_one_message_and_nothing_is_created(tpu_api, tmp_path):
    (tmp_path / "job.yaml").write_text(JOB)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TPULAUNCH_", "TPU_", "GOOGLE_", "CLOUDSDK_", "STORAGE_EMULATOR"))}
    env.update(PYTHONPATH=str(REPO), HOME=str(tmp_path), NO_GCE_CHECK="True", TPULAUNCH_TPU_API_ENDPOINT=tpu_api.endpoint,
               GCE_METADATA_HOST="127.0.0.1:9", GCE_METADATA_IP="127.0.0.1:9")  # no metadata server to ask either
    failed = subprocess.run([sys.executable, "-m", "tpulaunch", "run", "job.yaml"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert failed.returncode == 3, failed.stdout + failed.stderr
    assert "error: no Google Cloud credentials to read gs://tpulaunch-test-bucket/runs/a/tpulaunch-remote/" in failed.stderr
    assert "hint: gcloud auth application-default login" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert tpu_api.created == []  # nothing staged, nothing created


def test_a_var_with_no_secret_is_refused_at_its_key_with_the_command_that_creates_it(tpu_api, tmp_path):
    tpu_api.secrets_from(str(tmp_path))  # a Secret Manager with no secret API_TOKEN (nor any)
    job = JOB.replace("params: {num_classes: 10}", 'params: {num_classes: 10, api_token: "${API_TOKEN}"}')
    job = job.replace("steps: 10}", "steps: '${STEPS:-10}'}")  # a default: fine without a secret
    (tmp_path / "job.yaml").write_text(job)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPULAUNCH_", "TPU_"))}
    env.update(PYTHONPATH=str(REPO), NO_GCE_CHECK="True", TPULAUNCH_TPU_API_ENDPOINT=tpu_api.endpoint,
               TPULAUNCH_SECRET_MANAGER_URL=tpu_api.secret_manager_url, API_TOKEN="set-here-but-not-on-the-vm")
    failed = subprocess.run([sys.executable, "-m", "tpulaunch", "run", "job.yaml"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "job.yaml:2:" in failed.stderr
    assert ("${API_TOKEN} is read on the TPU VM from secret API_TOKEN, which does not exist in Secret Manager "
            "(project 'test-project')") in failed.stderr
    assert "gcloud secrets create API_TOKEN --project test-project --data-file=-" in failed.stderr
    assert "STEPS" not in failed.stderr and "set-here-but-not-on-the-vm" not in failed.stderr
    assert "Traceback" not in failed.stderr
    assert tpu_api.created == []


def test_a_secret_given_with_set_is_refused_before_anything_is_staged(tpu_api, tmp_path):
    """The VM's train reads its --sets from the stage: a secret there would be written in clear under model_dir."""
    tpu_api.secrets_from(str(tmp_path))
    (tmp_path / "job.yaml").write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPULAUNCH_", "TPU_"))}
    env.update(PYTHONPATH=str(REPO), NO_GCE_CHECK="True", TPULAUNCH_TPU_API_ENDPOINT=tpu_api.endpoint,
               TPULAUNCH_SECRET_MANAGER_URL=tpu_api.secret_manager_url)
    failed = subprocess.run([sys.executable, "-m", "tpulaunch", "run", "job.yaml", "--set", "train.steps=5",
                             "--set", "model.params.db_password=hunter2-on-the-command-line"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "--set:2:" in failed.stderr
    assert ("model.params.db_password: a secret given with --set: the TPU VM's train reads its --sets from the "
            "stage under run.model_dir, which would hold it in clear") in failed.stderr
    assert 'write `db_password: "${DB_PASSWORD}"` into the job file instead' in failed.stderr
    assert "hunter2-on-the-command-line" not in failed.stdout + failed.stderr and "Traceback" not in failed.stderr
    assert tpu_api.created == []

def test_without_the_cloud_tpu_client_nothing_is_staged_and_the_hint_adds_no_tensorflow(tmp_path, monkeypatch):
    """The quickstart's environment without google-cloud-tpu: refused before staging, with a hint that installs the
    client alone (tpulaunch[tpu] would put `tensorflow` beside the installed tensorflow-cpu)."""
    from click.testing import CliRunner

    from tpulaunch.cli.app import cli

    import google.cloud

    monkeypatch.setitem(sys.modules, "google.cloud.tpu_v2", None)  # an environment without it
    monkeypatch.delattr(google.cloud, "tpu_v2", raising=False)  # as imported by an earlier test of this process
    (tmp_path / "job.yaml").write_text(JOB.replace("gs://tpulaunch-test-bucket/runs/a", str(tmp_path / "runs"))
                                       .replace("gs://tpulaunch-test-bucket/data", str(tmp_path / "data")))
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["rehearse", "job.yaml"])
    assert result.exit_code != 0 and "needs google-cloud-tpu, which is not installed" in result.stderr, result.output
    assert "installs no TensorFlow" in result.stderr and "tpulaunch[tpu]" not in result.stderr
    assert not (tmp_path / "runs" / "tpulaunch-remote").exists()
