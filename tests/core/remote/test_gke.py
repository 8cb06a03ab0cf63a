"""`tpulaunch run` on GKE: the JobSet `--dry-run` prints, checked against the JobSet CRD's schema (unknown fields
refused, as `kubectl apply` does) and against xpk's JobSet for the same slices; the rules of gke: and tpu.slices at
their keys; the official Kubernetes client submitting and following the JobSet through a local API stand-in, its
model_dir on fake-gcs-server. No TensorFlow in the CLI processes' work here (validate's static checks only)."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
import threading
import textwrap

import pytest
import yaml

from k8s_api_server import KubeApi
from k8s_schema import XPK_JOBSET, jobset_errors
from paths import REPO

JOB = textwrap.dedent("""\
    name: ct-seg
    model: {builder: tpulaunch.models.cnn:build, params: {num_classes: 4}, optimizer: {name: adam, learning_rate: 0.001}}
    data:
      train: gs://bucket/data/train-*.tfrecord
      features: {image: {shape: [32, 32, 3]}}
      labels: {label: {shape: [], dtype: int64}}
    tpu: {type: v6e-16, slices: 2, project: p}
    gke: {cluster: c, location: us-central1, queue: multislice-queue, priority_class: medium}
    train: {batch_size: 64, steps: 100}
    run: {model_dir: gs://bucket/runs/ct, engine: jax}
    """)


def tpulaunch(*args, cwd, env=None, timeout=120) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "TPULAUNCH_"))}
    environment.update(PYTHONPATH=str(REPO), NO_COLOR="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "tpulaunch", *args], cwd=cwd, env=environment, capture_output=True,
                          text=True, timeout=timeout)


def dry_run(tmp_path, text=JOB, *args):
    (tmp_path / "job.yaml").write_text(text)
    done = tpulaunch("run", "job.yaml", "--dry-run", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    return yaml.safe_load(done.stdout)


def pod_spec(manifest: dict) -> dict:
    return manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("edit", [
    {},
    {"tpu: {type: v6e-16, slices: 2, project: p}": "tpu: {type: v5litepod-8, project: p}",
     "gke: {cluster: c, location: us-central1, queue: multislice-queue, priority_class: medium}":
         "gke: {cluster: c, location: us-central1, namespace: team-a, image: us-docker.pkg.dev/p/r/img:1, "
         "service_account: trainer}"},
    {"tpu: {type: v6e-16, slices: 2, project: p}": "tpu: {type: v4-16, project: p}", "engine: jax": "engine: keras"},
], ids=["jax-v6e-16x2-queued", "jax-v5e-8-own-image", "keras-v4-16"])
def test_the_dry_run_prints_a_jobset_the_api_server_takes(tmp_path, edit):
    text = JOB
    for old, new in edit.items():
        text = text.replace(old, new)
    manifest = dry_run(tmp_path, text)
    assert jobset_errors(manifest) == []
    assert not list(tmp_path.rglob("tpulaunch-remote"))  # nothing staged: the bucket is not even reachable here
    container = pod_spec(manifest)["containers"][0]
    assert container["command"][:2] == ["bash", "-c"] and "tpulaunch.remote.host" in container["command"][2]


def test_a_field_the_crd_does_not_know_is_refused():
    """The check itself refuses what the API server would: it is not a check that passes everything."""
    manifest = yaml.safe_load(XPK_JOBSET.read_text())
    assert any("'name' is a required property" in e for e in jobset_errors(manifest))  # the webhook defaults it
    ours = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "x"},
            "spec": {"replicatedJobs": [{"name": "s", "replicas": 1, "template": {"spec": {"template": {"spec": {
                "containers": [{"name": "c", "image": "i", "imagePullPolicyy": "Always"}]}}}}}]}}
    assert any("'imagePullPolicyy' was unexpected" in e for e in jobset_errors(ours))


def _pruned(value):
    """What the API server stores of xpk's template: nulls dropped, the webhook's default rule names given."""
    if isinstance(value, dict):
        return {k: _pruned(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def test_the_jobset_agrees_with_xpks_for_two_v6e_16_slices(tmp_path):
    ours = dry_run(tmp_path, JOB, "--recreate", "3")
    xpk = _pruned(yaml.safe_load(XPK_JOBSET.read_text()))
    for index, rule in enumerate(xpk["spec"]["failurePolicy"]["rules"]):
        rule.setdefault("name", f"failurePolicyRule{index}")
    assert jobset_errors(xpk) == []  # the reference itself, once stored, is a valid JobSet

    def job(manifest):
        return manifest["spec"]["replicatedJobs"][0]

    assert job(ours)["replicas"] == job(xpk)["replicas"] == 2
    for key in ("parallelism", "completions", "backoffLimit"):
        assert job(ours)["template"]["spec"][key] == job(xpk)["template"]["spec"][key], key
    ours_pod, xpk_pod = pod_spec(ours), pod_spec(xpk)
    assert ours_pod["nodeSelector"] == xpk_pod["nodeSelector"]
    assert ours_pod["containers"][0]["resources"]["limits"] == xpk_pod["containers"][0]["resources"]["limits"]
    for key in ("hostNetwork", "dnsPolicy", "priorityClassName", "restartPolicy"):
        assert ours_pod[key] == xpk_pod[key], key
    annotation = "alpha.jobset.sigs.k8s.io/exclusive-topology"
    assert ours["metadata"]["annotations"][annotation] == xpk["metadata"]["annotations"][annotation]
    assert ours["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "multislice-queue"
    assert ours["spec"]["failurePolicy"]["maxRestarts"] == xpk["spec"]["failurePolicy"]["maxRestarts"] == 3
    assert [r["action"] for r in ours["spec"]["failurePolicy"]["rules"]] == ["FailJobSet"]
    assert ours["spec"]["failurePolicy"]["rules"][0]["onJobFailureReasons"] == ["PodFailurePolicy"]

    # Which exit codes fail the JobSet at once (the pod failure policy's FailJob) and which restart it: the differences
    # from xpk's are the ones docs/gke.md lists.
    def fails(manifest, code):
        rule = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"][0]
        assert rule["action"] == "FailJob"
        listed = code in rule["onExitCodes"]["values"]
        return listed if rule["onExitCodes"]["operator"] == "In" else not listed

    differ = {code for code in range(1, 256) if fails(ours, code) != fails(xpk, code)}
    assert differ == {42, 127, 128, 130}
    assert all(fails(ours, code) for code in differ)  # each a code tpulaunch's train gives for the job's own cause


def test_restart_by_cause_for_the_codes_train_exits_with(tmp_path):
    """train's exit codes (docs/running.md) and what the JobSet does with each: the job's own fail it, the rest restart."""
    manifest = dry_run(tmp_path)
    rule = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"][0]
    failing = set(rule["onExitCodes"]["values"])
    job_own = {1: "the job failed (a bug, bad input, a NaN loss)", 2: "a usage error", 70: "tpulaunch crashed",
               130: "stopped by hand"}
    infrastructure = {3: "the TPU was lost or not found", 137: "SIGKILL (the node went)", 143: "SIGTERM (preempted)",
                      129: "SIGHUP"}
    assert set(job_own) <= failing
    assert not set(infrastructure) & failing
    assert 0 not in failing  # success is never a failure (and the API server refuses 0 under In)


@pytest.mark.parametrize("edit,key,code", [
    ({"engine: jax": "engine: estimator", "v6e-16, slices: 2": "v4-16"}, "gke", "gke-engine"),
    ({"engine: jax": "engine: keras"}, "tpu.slices", "slices-engine"),
    ({"v6e-16, slices: 2": "v3-32"}, "tpu.type", "gke-tpu-type"),
    ({"v6e-16, slices: 2": "v6e-8, slices: 2"}, "tpu.slices", "slices-single-host"),
    ({"gke: {cluster: c, location: us-central1, queue: multislice-queue, priority_class: medium}\n": "",
      "v6e-16, slices: 2": "v3-32, slices: 2"}, "tpu.type", "slices-tpu-type"),
    ({"gke: {cluster: c, location: us-central1, queue: multislice-queue, priority_class: medium}\n": "",
      "engine: jax": "engine: keras"}, "tpu.slices", "slices-engine"),
    ({"tpu: {type: v6e-16, slices: 2, project: p}\n": ""}, "gke", "gke-without-tpu"),
])
def test_what_cannot_run_past_one_slice_is_refused_at_its_key(tmp_path, edit, key, code):
    text = JOB
    for old, new in edit.items():
        assert old in text
        text = text.replace(old, new)
    (tmp_path / "job.yaml").write_text(text)
    done = tpulaunch("validate", "--static", "--format", "json", "job.yaml", cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    found = {(p["path"], p["code"]) for p in json.loads(done.stdout)["problems"] if p["severity"] == "error"}
    assert (key, code) in found, found
    refused = tpulaunch("run", "job.yaml", "--dry-run", cwd=tmp_path)
    assert refused.returncode == 1 and f"[{code}]" in refused.stderr and "apiVersion" not in refused.stdout



def test_a_jax_job_on_two_slices_of_tpu_vms_passes_the_slice_rules(tmp_path):
    """Without gke:, `tpulaunch run` makes the slices one multislice queued resource (tpu/lifecycle.py)."""
    (tmp_path / "job.yaml").write_text(JOB.replace(
        "gke: {cluster: c, location: us-central1, queue: multislice-queue, priority_class: medium}\n", ""))
    done = tpulaunch("validate", "--static", "--format", "json", "job.yaml", cwd=tmp_path)
    found = {(p["path"], p["code"]) for p in json.loads(done.stdout)["problems"] if p["severity"] == "error"}
    assert not {key for key in found if key[0] in ("tpu.slices", "tpu.type")}, found


# ------------------------------------------------------------------------------------------ against an API server

@pytest.fixture
def cluster(tmp_path):
    """The Kubernetes API stand-in with a kubeconfig reaching it, and fake-gcs-server as the job's bucket."""
    from gcs_fake import free_port
    from lease_runs import fake_gcs_server

    api = KubeApi().start()
    try:
        with fake_gcs_server(free_port()) as storage_url:
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            os.environ["STORAGE_EMULATOR_HOST"] = storage_url
            try:
                storage.Client(project="p", credentials=AnonymousCredentials()).create_bucket("bucket")
            finally:
                del os.environ["STORAGE_EMULATOR_HOST"]
            env = {"KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig")), "STORAGE_EMULATOR_HOST": storage_url,
                   "GOOGLE_CLOUD_PROJECT": "p", "HOME": str(tmp_path)}
            yield api, env
    finally:
        api.stop()


def _run_in_background(tmp_path, env, *args):
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "TPULAUNCH_"))}
    environment.update(PYTHONPATH=str(REPO), NO_COLOR="1", **env)
    return subprocess.Popen([sys.executable, "-m", "tpulaunch", "run", "job.yaml", "--poll", "0.1", *args],
                            cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _chief_writes(env, lines: str, status: dict, attempt: int = 1) -> None:
    """What the chief pod's host runner writes to model_dir (its log and its status), on the fake bucket, for the
    JobSet's `attempt` (its first pods 1, each restart one more)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    os.environ["STORAGE_EMULATOR_HOST"] = env["STORAGE_EMULATOR_HOST"]
    try:
        bucket = storage.Client(project="p", credentials=AnonymousCredentials()).bucket("bucket")
        bucket.blob(f"runs/ct/tpulaunch-remote/attempts/{attempt}/worker-0.log").upload_from_string(lines)
        bucket.blob(f"runs/ct/tpulaunch-remote/attempts/{attempt}/worker-0.json").upload_from_string(json.dumps(status))
    finally:
        del os.environ["STORAGE_EMULATOR_HOST"]


def test_run_submits_the_jobset_follows_it_to_its_end_and_reattaches(tmp_path, cluster):
    api, env = cluster
    (tmp_path / "job.yaml").write_text(JOB)
    follower = _run_in_background(tmp_path, env, "--recreate", "2")
    assert api.created.wait(60), follower.communicate(timeout=5)
    created = api.jobset("ct-seg")
    assert jobset_errors(created) == [] and created["spec"]["failurePolicy"]["maxRestarts"] == 2
    _chief_writes(env, "train | start | step 0/100 | batch 64\ntrain | step 100/100 | loss 0.1\n",
                  {"worker": 0, "phase": "ended", "exit_code": 0})
    api.set_status("ct-seg", {"restarts": 0, "conditions": [{"type": "Completed", "status": "True"}]})
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, out + err
    assert "train | step 100/100 | loss 0.1" in out
    assert "JobSet 'ct-seg' created in namespace 'default', queued on 'multislice-queue'" in err
    assert "JobSet 'ct-seg' completed" in err
    # The stage is in the bucket, where the pods' startup script fetches it from.
    stage_url = created["metadata"]["annotations"]["tpulaunch.dev/stage"]
    assert stage_url in created["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]["command"][2].replace(".json", "")

    again = tpulaunch("run", "job.yaml", "--poll", "0.1", cwd=tmp_path, env=env)  # the same job: reattached
    assert again.returncode == 0 and "reattached to JobSet 'ct-seg'" in again.stderr, again.stderr
    assert [m for m, _ in api.requests].count("POST") == 1

    (tmp_path / "job.yaml").write_text(JOB.replace("steps: 100", "steps: 200"))  # another job under the same name
    other = tpulaunch("run", "job.yaml", "--poll", "0.1", cwd=tmp_path, env=env)
    assert other.returncode == 1 and "runs another stage of this job" in other.stderr
    assert "tpulaunch cancel" in other.stderr and "Traceback" not in other.stderr


def _read_until(stream, text: str) -> list:
    """Lines of a running follower's stream up to the one holding `text` (an event: it printed it)."""
    lines = []
    for line in stream:
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"the follower ended without saying {text!r}: {''.join(lines)}")


def test_run_says_how_long_a_restart_took_to_train_again_and_the_steps_it_lost(tmp_path, cluster):
    """The JobSet restarts (its status's restart count grows) after the chief logged step 40; the restarted chief
    resumes from its step-30 checkpoint: `run` says the restart, then, at the restarted chief's first step, how long
    it took from the restart seen, the step it resumed from and the steps lost since the last logged one."""
    api, env = cluster
    (tmp_path / "job.yaml").write_text(JOB)
    follower = _run_in_background(tmp_path, env, "--recreate", "2")
    watchdog = threading.Timer(120, follower.kill)  # a follower that never says what is waited for ends the wait
    watchdog.start()
    try:
        assert api.created.wait(60), follower.communicate(timeout=5)
        _chief_writes(env, "train | start | step 0/100 | batch 64\ntrain | step 20/100 | loss 0.5\n"
                           "checkpoint | step 30\ntrain | step 40/100 | loss 0.4\n",
                      {"worker": 0, "phase": "training", "exit_code": None})
        _read_until(follower.stdout, "train | step 40/100")
        _chief_writes(env, "train | start | step 30/100 | batch 64\ntrain | step 50/100 | loss 0.3\n",
                      {"worker": 0, "phase": "training", "exit_code": None}, attempt=2)
        api.set_status("ct-seg", {"restarts": 1})
        said = "".join(_read_until(follower.stderr, "gke | back in "))
        assert "gke | restart 1 of at most 2: every pod recreated" in said
        back = re.search(r"gke \| back in (\d+\.\d) s: step 50 trained, resumed from step 30 \(10 steps since the "
                         r"last logged step lost\)", said)
        assert back and float(back.group(1)) < 60, said
        api.set_status("ct-seg", {"restarts": 1, "conditions": [{"type": "Completed", "status": "True"}]})
        out, err = follower.communicate(timeout=60)
    finally:
        watchdog.cancel()
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, out + err
    assert "JobSet 'ct-seg' completed" in err


def test_a_model_dir_another_live_run_writes_gets_no_jobset(tmp_path, cluster):
    """A train (here on another machine) holds run.model_dir's lease: `run` says so and creates no JobSet, rather
    than starting pods whose chief would be refused the lease (the JobSet then failing as for the job's cause)."""
    import time

    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from tpulaunch.run.lease import LEASE_FILE

    api, env = cluster
    (tmp_path / "job.yaml").write_text(JOB)
    held = {"state": "held", "host": "laptop", "pid": 4242, "run_id": "20261129T100000Z-laptop-4242-abcdef",
            "holder": "x", "command": "train", "started": time.time(), "renewed": time.time(), "renew_every_s": 30,
            "stale_after_s": 180, "took_over": None}
    os.environ["STORAGE_EMULATOR_HOST"] = env["STORAGE_EMULATOR_HOST"]
    try:
        bucket = storage.Client(project="p", credentials=AnonymousCredentials()).bucket("bucket")
        bucket.blob(f"runs/ct/{LEASE_FILE}").upload_from_string(json.dumps(held))
    finally:
        del os.environ["STORAGE_EMULATOR_HOST"]
    refused = tpulaunch("run", "job.yaml", "--poll", "0.1", cwd=tmp_path, env=env)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "run.model_dir gs://bucket/runs/ct is in use: train by host laptop, pid 4242" in refused.stderr
    assert "JobSet 'ct-seg' was not created" in refused.stderr and "Traceback" not in refused.stderr
    assert [m for m, _ in api.requests].count("POST") == 0


def test_a_failed_jobset_ends_run_with_the_chiefs_exit_code(tmp_path, cluster):
    api, env = cluster
    (tmp_path / "job.yaml").write_text(JOB)
    follower = _run_in_background(tmp_path, env)
    assert api.created.wait(60), follower.communicate(timeout=5)
    _chief_writes(env, "error: data.train: label 7 outside [0, 4)\n", {"worker": 0, "phase": "ended", "exit_code": 1})
    api.set_status("ct-seg", {"restarts": 0, "conditions": [
        {"type": "Failed", "status": "True", "reason": "FailedJobs",
         "message": "jobset failed due to PodFailurePolicy on job ct-seg-slice-0"}]})
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 1, out + err
    assert "failed: jobset failed due to PodFailurePolicy" in err and "(the chief exited 1)" in err
    assert "label 7 outside" in out


def test_no_cluster_is_one_message(tmp_path):
    (tmp_path / "job.yaml").write_text(JOB)
    done = tpulaunch("run", "job.yaml", cwd=tmp_path, env={"KUBECONFIG": str(tmp_path / "missing"),
                                                            "HOME": str(tmp_path), "STORAGE_EMULATOR_HOST":
                                                                "http://127.0.0.1:9"})
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert "error: no kubeconfig reaches the cluster" in done.stderr
    assert "gcloud container clusters get-credentials" in done.stderr


def test_logs_prints_the_chiefs_lines_and_cancel_deletes_the_jobset(tmp_path, cluster):
    api, env = cluster
    (tmp_path / "job.yaml").write_text(JOB)
    follower = _run_in_background(tmp_path, env)
    assert api.created.wait(60), follower.communicate(timeout=5)
    _chief_writes(env, "train | start | step 0/100 | batch 64\ntrain | step 10/100 | loss 1.2\n",
                  {"worker": 0, "phase": "training", "exit_code": None})
    status = tpulaunch("status", "job.yaml", cwd=tmp_path, env=env)
    assert status.returncode == 0, status.stderr
    assert "GKE: JobSet 'ct-seg' (default): Running | 0 of at most 0 restarts" in status.stdout
    assert "remote run: VM 1 | 1 host training | step 10/100" in status.stdout, status.stdout
    shown = tpulaunch("logs", "job.yaml", cwd=tmp_path, env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == ["train | start | step 0/100 | batch 64", "train | step 10/100 | loss 1.2"]
    assert "logs | host 0 of VM 1 | gs://bucket/runs/ct/tpulaunch-remote/attempts/1/worker-0.log" in shown.stderr

    cancelled = tpulaunch("cancel", "job.yaml", cwd=tmp_path, env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "JobSet 'ct-seg' deleted with its pods" in cancelled.stderr
    assert api.jobset("ct-seg") is None and ("DELETE", "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/"
                                            "ct-seg") in [(m, p.split("?")[0]) for m, p in api.requests]
    out, err = follower.communicate(timeout=60)  # the follower sees it gone
    assert follower.returncode == 3 and "JobSet 'ct-seg' is gone" in err, out + err
    again = tpulaunch("cancel", "job.yaml", cwd=tmp_path, env=env)
    assert again.returncode == 0 and "not found in namespace 'default': nothing to cancel" in again.stderr


def test_plan_counts_every_slices_devices_and_hosts(tmp_path):
    """Two v6e-16 slices train as one data-parallel run of 32 devices on 8 hosts: each host feeds 1/8 of the batch."""
    (tmp_path / "job.yaml").write_text(JOB)
    done = tpulaunch("plan", "job.yaml", "--no-memory", "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert {k: plan["slice"][k] for k in ("tpu_type", "devices", "hosts", "replicas")} == \
        {"tpu_type": "v6e-16 x 2", "devices": 32, "hosts": 8, "replicas": 32}
    (train,) = plan["batches"]
    assert (train["global_batch"], train["per_replica"], train["per_host"]) == (64, 2, 8)
