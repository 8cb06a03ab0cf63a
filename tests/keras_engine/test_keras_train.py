"""The keras engine trains the same job file for real: resume to exactly train.steps, Ctrl-C, evaluate, export,
several replicas on this CPU (MirroredStrategy) and two workers on 127.0.0.1 (MultiWorkerMirroredStrategy)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from keras_jobs import project  # noqa: F401  (the fixture: the job these tests train)
from paths import REPO
from tpulaunch.engine.core.model_dir import checkpoint_step

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

TRAIN = [sys.executable, "-m", "tpulaunch", "train"]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    return dict(env, PYTHONUNBUFFERED="1", CI="1", PYTHONPATH=str(REPO), **extra)


def _train(project: Path, model_dir: Path, *args: str, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([*TRAIN, str(project / "job.yaml"), "--model-dir", str(model_dir), *args],
                          capture_output=True, text=True, env=env or _env(), timeout=timeout)


def _weights(model_dir: Path) -> dict:
    path = tf.train.latest_checkpoint(str(model_dir))
    return {name: tf.train.load_variable(path, name) for name, _ in tf.train.list_variables(path)
            if name.startswith("model/") and "OPTIMIZER_SLOT" not in name}


@pytest.fixture(scope="module")
def three_steps(project, tmp_path_factory) -> tuple:
    """One run shared by two tests, as one process: `train --set train.steps=3 --set eval=null` on the job's own
    records, from an empty model_dir. It is the first run of the resume test (which trains on in that model_dir) and
    the control run of the two-replicas test (whose weights are read here, at once, before the resume test moves the
    model_dir on). Returns (its model_dir, its process, its step-3 weights)."""
    run = tmp_path_factory.mktemp("three_steps") / "run"
    first = _train(project, run, "--set", "train.steps=3", "--set", "eval=null")
    assert first.returncode == 0, first.stderr
    return run, first, _weights(run)


def test_trains_resumes_to_exactly_train_steps_evaluates_and_exports(project, three_steps, tmp_path):
    """The first run stops at step 3, between the periodic saves (every 5): its end-of-run checkpoint; the rerun
    saves on the same grid (5, 10) and at its end (12), keeping all four."""
    run, _, _ = three_steps
    assert checkpoint_step(str(run)) == 3
    assert sorted(p.name for p in run.glob("model.ckpt-*.index")) == ["model.ckpt-3.index"]

    rerun = _train(project, run)
    assert rerun.returncode == 0, rerun.stderr
    assert f"resumed from step 3 ({run})" in rerun.stdout.splitlines()
    (done,) = [line for line in rerun.stdout.splitlines() if line.startswith("done |")]
    assert done.startswith("done | step 12/12 | 9 steps in "), done
    assert checkpoint_step(str(run)) == 12
    assert sorted(p.name for p in run.glob("model.ckpt-*.index")) == [
        "model.ckpt-10.index", "model.ckpt-12.index", "model.ckpt-3.index", "model.ckpt-5.index"]
    (trained_eval,) = [line for line in rerun.stdout.splitlines() if line.startswith("eval | step 12 |")]

    evaluated = subprocess.run([sys.executable, "-m", "tpulaunch", "evaluate", str(project / "job.yaml"),
                                "--set", f"run.model_dir={run}"], capture_output=True, text=True, env=_env(),
                               timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr
    assert trained_eval in evaluated.stdout.splitlines()  # the same checkpoint, the same metrics

    records = [json.loads(line) for line in (run / "tpulaunch-runs.jsonl").read_text().splitlines()]
    assert [r["command"] for r in records] == ["train", "resume", "evaluate"]

    exported = subprocess.run([sys.executable, "-m", "tpulaunch", "export", str(project / "job.yaml"),
                               str(tmp_path / "exported"), "--set", f"run.model_dir={run}"],
                              capture_output=True, text=True, env=_env(), timeout=300)
    assert exported.returncode == 0, exported.stderr
    (path,) = re.findall(r"^exported (.+)$", exported.stdout, re.MULTILINE)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    outputs = serve(image=tf.ones([3, 8, 8, 1]))
    assert {k: v.shape.as_list() for k, v in outputs.items()} == {"outputs": [3, 3]}


def test_two_replicas_take_the_same_step_as_one(project, three_steps, tmp_path):
    """MirroredStrategy over two CPU devices: each replica's loss is scaled so the summed gradients are the global
    batch's mean, as on one device; the same examples give the same weights. The file repeats 4 records, so every
    batch (8 on one device, 4 per replica) holds the same records whatever order the pipeline's parallel parse
    yields them in."""
    distinct = [bytes(r.numpy()) for r in tf.data.TFRecordDataset(str(project / "train.tfrecord")).take(4)]
    with tf.io.TFRecordWriter(str(tmp_path / "repeated.tfrecord")) as writer:
        for _ in range(16):
            for record in distinct:
                writer.write(record)
    same = ["--set", "train.steps=3", "--set", "eval=null", "--set", f"data.train={tmp_path / 'repeated.tfrecord'}"]
    one = _train(project, tmp_path / "one", *same)
    two = _train(project, tmp_path / "two", *same, "--cpu-replicas", "2")
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    single, mirrored = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    assert single.keys() == mirrored.keys() and single
    for name in single:
        np.testing.assert_allclose(mirrored[name], single[name], rtol=1e-4, atol=1e-5, err_msg=name)
    # And the check can fail: a third run whose second replica saw other examples takes another step (the run of
    # `three_steps`: the same 3 steps with eval=null, on the job's own records).
    _, other, other_weights = three_steps
    assert other.returncode == 0, other.stderr
    assert any(not np.allclose(other_weights[n], single[n], rtol=1e-4, atol=1e-5) for n in single)


def test_cpu_replicas_that_do_not_divide_the_batch_are_refused(project, tmp_path):
    result = _train(project, tmp_path / "run", "--cpu-replicas", "3")
    assert result.returncode == 1
    assert "train.batch_size 8 does not divide over the 3 replicas of MirroredStrategy" in result.stderr
    assert "Traceback" not in result.stderr


def _free_ports(count: int) -> list:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _two_workers(project: Path, run: Path, *args: str) -> list:
    """Run `tpulaunch train` as worker 1 and worker 0 of one TF_CONFIG cluster on 127.0.0.1; their stdout lines."""
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    children = []
    for index in (1, 0):
        tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
        children.append(subprocess.Popen([*TRAIN, str(project / "job.yaml"), "--model-dir", str(run), *args],
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         env=_env(TF_CONFIG=tf_config)))
    outputs = [child.communicate(timeout=300) for child in children]
    for child, (out, err) in zip(children, outputs):
        assert child.returncode == 0, err[-3000:]
    return [out.splitlines() for out, _ in outputs]


def test_two_workers_train_one_job_with_multi_worker_mirrored_strategy(project, tmp_path):
    """Two `tpulaunch train` processes with TF_CONFIG on 127.0.0.1: one run, one set of checkpoints and one run
    record per run in model_dir (the chief's), both workers at the same step and loss, and both resume from the
    chief's checkpoint."""
    run = tmp_path / "run"
    _two_workers(project, run, "--set", "train.steps=6", "--set", "eval=null")
    assert checkpoint_step(str(run)) == 6

    outputs = _two_workers(project, run)
    for lines in outputs:
        assert f"resumed from step 6 ({run})" in lines, lines
    dones = [[line for line in lines if line.startswith("done |")] for lines in outputs]
    assert all(d and d[0].startswith("done | step 12/12 | 6 steps in ") for d in dones), dones
    losses = {re.search(r"\| loss ([0-9.e-]+)", d[0]).group(1) for d in dones}
    assert len(losses) == 1, dones  # one model: the replicas' losses are all-reduced
    assert checkpoint_step(str(run)) == 12
    assert not list(run.glob("worker-*")), list(run.iterdir())  # the other worker's scratch checkpoints are gone
    records = [json.loads(line) for line in (run / "tpulaunch-runs.jsonl").read_text().splitlines()]
    assert [r["command"] for r in records] == ["train", "resume"]
    # One lease for the cluster, the chief's (worker 0 here): its run id is the one its records carry.
    assert [p.relative_to(run) for p in run.rglob("tpulaunch.lease*")] == [Path("tpulaunch.lease")]
    lease = json.loads((run / "tpulaunch.lease").read_text())
    assert lease["state"] == "released" and lease["took_over"] is None  # the first run had released it
    assert records[-1]["run_id"] == lease["run_id"] and records[0]["run_id"] != lease["run_id"]


def test_sigint_saves_a_checkpoint_and_the_rerun_finishes_exactly(project, tmp_path):
    """Ctrl-C once a progress line shows training under way, in a run far longer than the test lasts."""
    run = tmp_path / "run"
    child = subprocess.Popen([*TRAIN, str(project / "job.yaml"), "--model-dir", str(run), "--set", "eval=null",
                              "--set", "train.steps=1000000", "--set", "run.log_every_steps=10"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    line = child.stdout.readline()
    while line and not line.startswith("train | step "):
        line = child.stdout.readline()
    assert line.startswith("train | step 10/1000000 | "), child.stderr.read()
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)

    assert child.returncode == 130, err
    stopped = re.search(r"stopped at step (\d+), checkpoint saved; rerun the same command to resume", err)
    assert stopped, err
    step = int(stopped.group(1))
    assert checkpoint_step(str(run)) == step >= 10

    target = step + 7
    rerun = _train(project, run, "--set", "eval=null", "--set", f"train.steps={target}")
    assert rerun.returncode == 0, rerun.stderr
    assert f"resumed from step {step} ({run})" in rerun.stdout.splitlines()
    assert checkpoint_step(str(run)) == target
