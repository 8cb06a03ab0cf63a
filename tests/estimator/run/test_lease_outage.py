"""A storage outage is not a takeover: real `tpulaunch train` runs on a gs:// model_dir whose Cloud Storage stops
answering for a while (the proxy of gcs_fake closes every connection, the server and what it holds untouched) and
loses the replies of lease writes it applied. TensorFlow's gs:// and the lease's google-cloud-storage both go
through that proxy to fake-gcs-server, which enforces generation preconditions.

The run waits for its store and carries on (exit 0, its record line, its lease released); only a lease another
run holds fences it (exit 5). Every wait is on a line a run printed, never on a sleep."""

from __future__ import annotations

from pathlib import Path

import pytest

from lease_runs import Run, check_resumes_on_gcs, cli_env, gcs_objects, gcs_records, outage_storage, storage_client_env, unreachable
from train_jobs import JOB, MODELS, write_records
from tpulaunch.errors import ExitCode
from tpulaunch.run import lease as leases

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

# Renewed every second, stale after 60 s: an outage of a few seconds misses several renewals, far from stale.
LEASE_ENV = {leases.RENEW_ENV: "1", leases.STALE_ENV: "60"}
# TensorFlow's gs:// retries for minutes, a second apart at most (its defaults retry ten times, up to 32 s apart):
# a write during the outage waits for the store, as it does on Cloud Storage.
PATIENT_TF = {"GCS_RETRY_CONFIG_MAX_RETRIES": "1000", "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "1000000"}
LONG = ["--set", "eval=null", "--set", "train.steps=200", "--set", "run.log_every_steps=1"]

GATED_MODELS = """
import os
import time

import tensorflow as tf

class Gate(tf.keras.layers.Layer):
    \"\"\"Identity. In training each step first waits while the file `path` exists: the test holds the run there.\"\"\"

    def __init__(self, path, **kwargs):
        super().__init__(**kwargs)
        self.path = path

    def call(self, x, training=None):
        if not training:
            return x

        def wait(value):
            while os.path.exists(self.path):
                time.sleep(0.01)
            return value

        return tf.ensure_shape(tf.numpy_function(wait, [x], x.dtype), x.shape)

def classifier(num_classes=2, input_shape=(8, 8, 1), gate="", **unused):
    image = tf.keras.Input(shape=tuple(input_shape), name="image")
    x = tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu")(Gate(gate)(image))
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(image, tf.keras.layers.Dense(num_classes)(x))
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lease_outage")
    (root / "train_models.py").write_text(MODELS)
    (root / "gated_models.py").write_text(GATED_MODELS)
    (root / "job.yaml").write_text(JOB)
    write_records(root / "data" / "train.tfrecord", 64, seed=1)
    return root


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    with outage_storage(tmp_path_factory) as both:
        yield both


@pytest.fixture
def direct(storage, monkeypatch):
    """This process reaches the server through the proxy that never fails (a run elsewhere, the test's reads)."""
    for name, value in storage_client_env(storage[1]).items():
        monkeypatch.setenv(name, value)


def _train(project: Path, gcs, model_dir: str, *args: str) -> Run:
    env = cli_env(**{**gcs.env, **storage_client_env(gcs), **LEASE_ENV, **PATIENT_TF})
    return Run(["train", str(project / "job.yaml"), "--local", "--model-dir", model_dir, *LONG, *args],
               env=env, cwd=project)


def test_a_run_rides_out_lost_replies_and_an_outage_of_its_store(project, storage, direct, tmp_path):
    """The replies of the lease's create and of a renewal are lost after the server applied them (the client's retry
    then fails its generation precondition), and later the store stops answering while the run is in a step: the
    run knows the lease it reads back for its own, says the store is unreachable and since when, and once it
    answers again carries on to its end: done, its record line written, its lease released."""
    gcs, _ = storage
    model_dir = "gs://runs/outage"
    lease_write = ["/upload/storage/v1/b/runs/o?uploadType=multipart"]
    created = gcs.lose_reply(lease_write + ["ifGenerationMatch=0"], body="outage/" + leases.LEASE_FILE)
    renewed = gcs.lose_reply(lease_write, body="outage/" + leases.LEASE_FILE, unless=["ifGenerationMatch=0"])
    gate = tmp_path / "hold"
    gate.touch()
    run = _train(project, gcs, model_dir, "--set", "train.steps=20", "--set", "model.builder=gated_models:classifier",
                 "--set", f"model.params.gate={gate}")
    try:
        run.wait_for_line(lambda line: line == "phase | first step")  # held in it by the gate
        assert {created, renewed} <= set(gcs.replies_lost()), run.text()  # renewed every second as TF loaded
        with gcs.outage():
            since = run.wait_for_line(unreachable, stream="err", limit_s=120)
        run.wait_for_line(lambda line: line.startswith("lease | reachable again"), stream="err", limit_s=120)
        gate.unlink()
        assert run.finish() == 0, run.text()
    finally:
        run.kill()
    err = "\n".join(run.err)
    assert "Traceback" not in err and "lease | lost" not in err and "took run.model_dir" not in err, err
    assert f"cannot reach the lease {model_dir}/{leases.LEASE_FILE} since " in since and " UTC " in since, since
    assert run.out[-1].startswith("done | step 20/20"), run.text()
    held = leases.read_lease(model_dir)
    assert held["state"] == "released" and held["pid"] == run.pid, held
    records = gcs_records(model_dir)
    assert [(r["run_id"], r["outcome"]) for r in records] == [(held["run_id"], "done")], records
    check_resumes_on_gcs(lambda *args: _train(project, gcs, model_dir, "--set", "model.builder=gated_models:classifier",
                                              "--set", f"model.params.gate={gate}", *args), model_dir, 20)


def test_a_run_cut_off_from_its_store_is_fenced_when_another_run_took_its_lease(project, storage, direct):
    """While the run cannot reach its store, a run elsewhere (this test, reaching the server directly) takes the
    lease with --take-lease: once the store answers again the first run finds that lease another run's, and stops
    fenced (exit 5) naming it, without writing a checkpoint there."""
    gcs, _ = storage
    model_dir = "gs://runs/partition"
    run = _train(project, gcs, model_dir)
    taker = None
    try:
        run.wait_for_line(lambda line: line.startswith("train | step "))
        with gcs.outage():
            run.wait_for_line(unreachable, stream="err", limit_s=120)
            taker = leases.acquire(model_dir, run_id="taker-run", command="train", take=True)
            saved = gcs_objects(model_dir)
        assert run.finish() == ExitCode.LEASE_LOST, run.text()
        assert gcs_objects(model_dir) == saved  # no checkpoint, nothing written after the takeover
        err = "\n".join(run.err)
        assert "Traceback" not in err, err
        assert f"run taker-run took run.model_dir {model_dir} over while this run held it" in err, err
        assert leases.read_lease(model_dir)["run_id"] == "taker-run"
        assert not [r for r in gcs_records(model_dir)], "a fenced run on gs:// leaves the record to the new holder"
    finally:
        run.kill()
        if taker is not None:
            taker.release()


def test_a_run_cut_off_from_its_store_past_the_stale_time_stops_without_writing(storage, monkeypatch):
    """The lease's own code in this process (no training), through the proxy that fails: the check before a write
    waits for an unreachable store up to the lease's stale time (here 1 s), says so once, then stops the run
    (`StoreUnreachable`, exit 1) naming model_dir and since when, rather than writing without knowing whether
    another run holds it now. The store back, the lease is still this run's, and said so."""
    gcs, _ = storage
    for name, value in storage_client_env(gcs).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(leases.RENEW_ENV, "0.2")
    monkeypatch.setenv(leases.STALE_ENV, "1")
    model_dir = "gs://runs/cut-off"
    lease = leases.acquire(model_dir, run_id="cut-off-run", command="train")
    said = []
    lease.on_unreachable = lambda since, exc: said.append("unreachable")
    lease.on_reachable = lambda since, seconds: said.append("reachable")
    try:
        with gcs.outage():
            with pytest.raises(leases.StoreUnreachable) as stopped:
                lease.ensure_held()
        assert stopped.value.exit_code == ExitCode.PROBLEMS
        assert stopped.value.message.startswith(f"could not reach the store of run.model_dir {model_dir} for "), \
            stopped.value.message
        assert " UTC; " in stopped.value.message and said == ["unreachable"]
        lease.ensure_held()
        assert said == ["unreachable", "reachable"]
    finally:
        lease.release()
    assert leases.read_lease(model_dir)["state"] == "released"
