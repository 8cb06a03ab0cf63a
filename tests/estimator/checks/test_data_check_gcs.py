"""The data dry run against gs:// through TensorFlow's own GCS filesystem (a local emulator behind it)."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from records import example
from tpulaunch.checks.validate import validate_job

JOB = """\
name: gcs-dry-run
model: {{builder: tpulaunch.models.cnn:build}}
data:
  train: {train}
  features:
    image: {{shape: [8], dtype: float32}}
  labels:
    label: {{shape: [], dtype: int64}}
train: {{batch_size: 4, steps: 10}}
run: {{model_dir: gs://ct-runs/x}}
"""


@pytest.fixture(scope="module")
def bucket(gcs):  # noqa: F811
    gcs.make_bucket("ct-data")
    for shard in range(2):
        with tf.io.TFRecordWriter(gcs.url("ct-data", f"train/train-{shard}.tfrecord")) as writer:
            for i in range(6):
                writer.write(example({"image": np.full(8, i, np.float32), "label": np.int64(i % 2)}))
    return gcs


def run(tmp_path, train, **kwargs):
    path = tmp_path / "job.yaml"
    path.write_text(JOB.format(train=train))
    result = validate_job(str(path), **kwargs)
    return [(p.severity, p.code, p.path, p.line) for p in result.problems if p.code.startswith(("no-", "data-", "record-"))], result


def test_reads_and_counts_gs_records(bucket, tmp_path):
    found, result = run(tmp_path, "gs://ct-data/train/train-*.tfrecord", all_records=True)
    assert found == []
    [report] = result.data_reports
    assert (report.files, report.records_counted, report.steps_per_epoch) == (2, 12, 3)


def test_empty_gs_glob_is_located(bucket, tmp_path):
    found, _ = run(tmp_path, "gs://ct-data/trian/*.tfrecord")
    assert found == [("error", "no-files", "data.train", 4)]


def test_missing_bucket_is_named(bucket, tmp_path):
    found, result = run(tmp_path, "gs://no-such-bucket/train/*.tfrecord")
    assert found == [("error", "data-unreachable", "data.train", 4)]
    [problem] = [p for p in result.problems if p.code == "data-unreachable"]
    assert problem.message.startswith("cannot list 'gs://no-such-bucket/train/*.tfrecord'")
    assert "gcloud storage ls gs://no-such-bucket" in problem.hint


def test_cli_dry_run_on_unreachable_storage_answers_in_seconds(bucket, tmp_path):
    """Without the test session's quick-retry settings, `validate` still bounds its own wait."""
    path = tmp_path / "job.yaml"
    path.write_text(JOB.format(train="gs://ct-data/train/train-*.tfrecord"))
    with bucket.unreachable():
        env = {k: v for k, v in os.environ.items() if not k.startswith("GCS_RETRY_CONFIG")}
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "tpulaunch", "validate", "--format", "json", str(path)],
                              capture_output=True, text=True, env=env, timeout=120)
        elapsed = time.monotonic() - started
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1
    assert [(p["code"], p["path"], p["line"]) for p in doc["problems"] if p["code"].startswith("data-")] == [
        ("data-unreachable", "data.train", 4)]
    assert elapsed < 45, elapsed  # TensorFlow's own default retries take about 200 s
