"""`tpulaunch down JOB` finds the job's node wherever `tpulaunch run` made it: in the zone the run's record
(run.json under run.model_dir) names, else in each of tpu.zones. The CLI in a process of its own against the local
Cloud TPU API; no TensorFlow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from paths import REPO
from tpu_api_server import DEFAULT_PROJECT

A, B, C = "us-central1-a", "us-central1-b", "us-central1-c"
JOB = textwrap.dedent("""\
    name: downs
    model: {builder: tpulaunch.models.cnn:build, params: {num_classes: 10}, loss: sparse_categorical_crossentropy,
            optimizer: {name: sgd, learning_rate: 0.1}}
    data:
      train: data/train-*.tfrecord
      features: {image: {shape: [32, 32, 3]}}
      labels: {label: {shape: [], dtype: int64}}
    tpu: {name: down-tpu, zones: [ZONES], project: test-project, type: v3-8}
    train: {batch_size: 8, steps: 10}
    run: {model_dir: runs/d}
    """)


def down(tpu_api, folder) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPULAUNCH_", "TPU_"))}
    env.update(PYTHONPATH=str(REPO), NO_GCE_CHECK="True", TPULAUNCH_TPU_API_ENDPOINT=tpu_api.endpoint)
    return subprocess.run([sys.executable, "-m", "tpulaunch", "down", "job.yaml", "--timeout", "30"], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=120)


def _node(zone: str) -> str:
    return f"projects/{DEFAULT_PROJECT}/locations/{zone}/nodes/down-tpu"


def test_down_finds_the_node_in_a_fallback_zone_of_tpu_zones(tpu_api, tmp_path):
    (tmp_path / "job.yaml").write_text(JOB.replace("ZONES", f"{A}, {B}, {C}"))
    tpu_api.set_node("down-tpu", zone=C)  # the first two zones had no capacity; no run.json (never staged here)
    done = down(tpu_api, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"TPU node 'down-tpu' deleted in {C}" in done.stdout
    assert tpu_api.nodes == {}
    again = down(tpu_api, tmp_path)  # safe to rerun: nothing anywhere, every zone named
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"does not exist in project 'test-project', zones {A}, {B}, {C}: nothing to delete" in again.stdout


def test_down_reads_the_zone_the_run_made_the_node_in_from_its_record(tpu_api, tmp_path):
    # The job now lists only zone a; run.json says the run's node was made in zone b (the job was edited since).
    (tmp_path / "job.yaml").write_text(JOB.replace("ZONES", A))
    record = tmp_path / "runs/d/tpulaunch-remote/run.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"job": "downs", "job_file": "job.yaml", "stage": "0" * 64, "node": "down-tpu",
                                  "zone": B, "project": DEFAULT_PROJECT, "started": 0.0}))
    tpu_api.set_node("down-tpu", zone=B)
    done = down(tpu_api, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"TPU node 'down-tpu' deleted in {B}" in done.stdout
    assert _node(B) not in tpu_api.nodes and tpu_api.nodes == {}
