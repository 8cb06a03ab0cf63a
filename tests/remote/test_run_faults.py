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
    assert "error: no Google Cloud credentials to write gs://tpulaunch-test-bucket/runs/a/tpulaunch-remote/" in failed.stderr
    assert "hint: gcloud auth application-default login" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert tpu_api.created == []  # nothing staged, nothing created
