"""`tpulaunch rehearse` of a keras job on a two-host slice (v4-16): the keras engine's hosts all train
(`EngineAbout.on_tpu.hosts` "every"), each a local process running the node's startup script, told its index by
$TF_CONFIG built from the slice's worker-network-endpoints (127.0.0.1 ports in a rehearsal), so the two run one
MultiWorkerMirroredStrategy on this CPU; worker 0 alone holds the model_dir lease and writes the checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from paths import REPO

JOB = textwrap.dedent("""\
    name: hosts
    model:
      builder: tpulaunch.models.cnn:build
      params: {num_classes: 10}
      loss: sparse_categorical_crossentropy
      optimizer: {name: adam, learning_rate: 0.003}
    data:
      train: data/train-*.tfrecord
      features:
        image: {shape: [32, 32, 3], dtype: float32}
      labels:
        label: {shape: [], dtype: int64}
    tpu: {name: hosts-tpu, zone: us-central1-a, project: test-project, type: v4-16}
    train: {batch_size: 8, steps: 6}
    run: {engine: keras, model_dir: runs/k, save_checkpoints_steps: 3, log_every_steps: 1}
    """)


def test_every_host_trains_and_only_the_chief_holds_the_lease(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPULAUNCH_TPU", "TPU_", "TF_CONFIG"))}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               NO_GCE_CHECK="True")
    subprocess.run([sys.executable, "-m", "tpulaunch", "data", "synth", "--example", "quickstart",
                    str(tmp_path / "data"), "--records", "32"], check=True, cwd=REPO, capture_output=True, env=env)
    (tmp_path / "job.yaml").write_text(JOB)
    done = subprocess.run([sys.executable, "-m", "tpulaunch", "rehearse", "job.yaml", "--hosts", "2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "on each of its 2 hosts; every host trains, worker 0 the chief" in done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("run | done | step 6/6 | 1 VM |")
    attempt = tmp_path / "runs/k/tpulaunch-remote/attempts/1"
    hosts = [json.loads((attempt / f"worker-{w}.json").read_text()) for w in (0, 1)]
    assert [(h["role"], h["exit_code"]) for h in hosts] == [("train", 0), ("train", 0)]
    assert "train | step 6/6" in (attempt / "worker-1.log").read_text()  # it trained the same steps, in sync
    lease = json.loads((tmp_path / "runs/k/tpulaunch.lease").read_text())
    assert lease["pid"] == hosts[0]["train_pid"] and lease["took_over"] is None
    assert (tmp_path / "runs/k/model.ckpt-6.index").exists()
