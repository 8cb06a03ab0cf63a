"""A storage outage is not a takeover, on the keras engine: a real `train` on a gs:// model_dir (TensorFlow's gs://
and the lease's google-cloud-storage through gcs_fake's proxy to fake-gcs-server) whose lease writes lose their
replies after the server applied them, and whose store then stops answering after its first checkpoint. The
estimator engine's tests, and how the fake works: tests/estimator/run/test_lease_outage.py."""

from __future__ import annotations

from pathlib import Path

from keras_jobs import project  # noqa: F401  (the fixture: a small keras-engine job)
from lease_runs import Run, check_resumes_on_gcs, cli_env, gcs_records, outage_storage, storage_client_env, unreachable
from tpulaunch.run import lease as leases


def test_a_keras_run_rides_out_lost_replies_and_an_outage_of_its_store(project, tmp_path_factory,  # noqa: F811
                                                                       monkeypatch):
    model_dir = "gs://runs/k"
    with outage_storage(tmp_path_factory) as (gcs, direct):
        lease_write = ["/upload/storage/v1/b/runs/o?uploadType=multipart"]
        created = gcs.lose_reply(lease_write + ["ifGenerationMatch=0"], body="k/" + leases.LEASE_FILE)
        renewed = gcs.lose_reply(lease_write, body="k/" + leases.LEASE_FILE, unless=["ifGenerationMatch=0"])
        # Renewed every second, stale after a minute; TensorFlow's gs:// retries a second apart at most, for minutes.
        env = cli_env(**{**gcs.env, **storage_client_env(gcs), leases.RENEW_ENV: "1", leases.STALE_ENV: "60",
                         "GCS_RETRY_CONFIG_MAX_RETRIES": "1000", "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "1000000"})
        def train(*args: str) -> Run:
            return Run(["train", str(project / "job.yaml"), "--model-dir", model_dir, "--set", "eval=null", *args],
                       env=env, cwd=project)

        run = train()
        try:
            run.wait_for_line(lambda line: line.startswith("checkpoint | step 5 "))
            assert {created, renewed} <= set(gcs.replies_lost()), run.text()  # renewed every second as TF loaded
            with gcs.outage():  # the run cannot end without its store: its last save checks the lease there
                since = run.wait_for_line(unreachable, stream="err", limit_s=120)
            run.wait_for_line(lambda line: line.startswith("lease | reachable again"), stream="err", limit_s=120)
            assert run.finish() == 0, run.text()
        finally:
            run.kill()
        for name, value in storage_client_env(direct).items():
            monkeypatch.setenv(name, value)
        err = "\n".join(run.err)
        assert "Traceback" not in err and "lease | lost" not in err and "took run.model_dir" not in err, err
        assert f"cannot reach the lease {model_dir}/{leases.LEASE_FILE} since " in since, since
        assert run.out[-1].startswith("done | step 12/12"), run.text()
        held = leases.read_lease(model_dir)
        assert held["state"] == "released" and held["pid"] == run.pid, held
        assert [(r["run_id"], r["outcome"]) for r in gcs_records(model_dir)] == [(held["run_id"], "done")]
        check_resumes_on_gcs(train, model_dir, 12)
