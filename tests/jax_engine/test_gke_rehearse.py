"""The jax engine on GKE across two slices, rehearsed on this CPU: `tpulaunch rehearse` of a job with gke: and
`tpu.slices: 2` of v4-16 runs the JobSet `run` would submit, its four pods (2 slices x 2 hosts) local processes that
run the pod's startup script, the host runner and `tpulaunch train`, joined by jax.distributed into one data-parallel
run. A pod is preempted at step 4: JobSet's failure handling restarts every pod, the run resumes from its newest
checkpoint and ends at the job's steps with the weights one process trains on the same examples. A job whose own
failure ends a pod (a NaN loss) fails the JobSet at once, never restarted."""

from __future__ import annotations

import json
import re
import subprocess

import yaml

from jax_runs import HELD, TPULAUNCH, assert_weights_of_one_process, run_env
from jax_runs import project  # noqa: F401  (the fixture: the jax engine's small job)

import pytest

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

GKE = {"cluster": "c", "location": "us-central2", "project": "test-project"}


def _gke_job(project, steps: int, **extra) -> None:
    job = yaml.safe_load((project / "job.yaml").read_text())
    job.pop("eval")
    job.pop("flags")  # its model is HELD's (which defines no flag)
    job["tpu"] = {"type": "v4-16", "slices": 2, "project": "test-project"}
    job["gke"] = GKE
    job["train"]["steps"] = steps
    job["train"]["batch_size"] = 16  # divisible over two v4-16 slices' 16 devices (the 8 records, each twice)
    job["model"]["builder"] = "held:held"
    job.update(extra)
    (project / "held.py").write_text(HELD)
    (project / "gke.yaml").write_text(yaml.safe_dump(job, sort_keys=False))


def test_two_slices_rehearsed_through_a_preempted_pod_train_what_one_process_trains(project, tmp_path):  # noqa: F811
    _gke_job(project, steps=8)
    env = dict(run_env(), NO_GCE_CHECK="True")
    run_dir, one_dir = tmp_path / "gke", tmp_path / "one"
    rehearsed = subprocess.run([*TPULAUNCH, "rehearse", "gke.yaml", "--preempt-at", "4", "--recreate", "1",
                                "--set", f"run.model_dir={run_dir}"],
                               cwd=project, env=dict(env, HOLD_UNTIL=str(run_dir / "tpulaunch-remote/attempts/2")),
                               capture_output=True, text=True, timeout=600)
    said = rehearsed.stdout + rehearsed.stderr
    assert rehearsed.returncode == 0, said
    assert "rehearsal | JobSet 'jax-engine': 2 slices of 2 hosts" in rehearsed.stderr, said
    assert "rehearsal | preempted the pod of slice 1 host 1 at step 4" in rehearsed.stderr
    assert re.search(r"restarting \(1 of 1\): a pod exited (143|137), every pod recreated", rehearsed.stderr)
    # how long the restart took to train again, from the failed pod seen to the restarted chief's first step
    back = re.search(r"rehearsal \| back in (\d+\.\d) s: step (\d+) trained, resumed from step (\d+) \((\d+) steps? "
                     r"since the last logged step lost\)", rehearsed.stderr)
    assert back, said
    resumed = int(back.group(3))  # its newest checkpoint at step 4: 3 (checkpoints every 3 steps)
    assert (int(back.group(2)), int(back.group(4))) == (resumed + 1, 4 - resumed), said
    assert "rehearsal | JobSet 'jax-engine' completed" in rehearsed.stderr

    first = (run_dir / "tpulaunch-remote/attempts/1/worker-0.log").read_text()
    assert "train | step 4/8" in first and "train | step 5/8" not in first  # held at step 4 until preempted
    attempt = run_dir / "tpulaunch-remote/attempts/2"
    hosts = [json.loads((attempt / f"worker-{w}.json").read_text()) for w in range(4)]
    assert [(h["role"], h["exit_code"]) for h in hosts] == [("train", 0)] * 4
    logs = [(attempt / f"worker-{w}.log").read_text() for w in range(4)]
    for index, log in enumerate(logs):
        assert f"jax | data-parallel over 4 cpu devices on 4 hosts (this is host {index})" in log
        assert "train | step 8/8" in log
    assert "resumed from step" in logs[0] or "train | start | step 3/8" in logs[0]
    assert "checkpoint | step 8" in logs[0] and all("checkpoint |" not in log for log in logs[1:])

    assert_weights_of_one_process(project, "gke.yaml", run_dir, one_dir, env)


def test_the_jobs_own_failure_fails_the_jobset_without_a_restart(project, tmp_path):  # noqa: F811
    _gke_job(project, steps=4)
    job = yaml.safe_load((project / "gke.yaml").read_text())
    job["model"]["optimizer"] = {"name": "sgd", "learning_rate": 1.0e30}  # the loss turns NaN at once
    job["tpu"]["slices"] = 1
    (project / "gke.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    failed = subprocess.run([*TPULAUNCH, "rehearse", "gke.yaml", "--recreate", "3",
                             "--set", f"run.model_dir={tmp_path / 'nan'}"],
                            cwd=project, env=dict(run_env(), NO_GCE_CHECK="True"), capture_output=True, text=True,
                            timeout=400)
    said = failed.stdout + failed.stderr
    assert failed.returncode == 1, said
    assert "the job's own failure (PodFailurePolicy: not restarted)" in failed.stderr, said
    assert "restarting" not in failed.stderr
    assert not (tmp_path / "nan/tpulaunch-remote/attempts/2").exists()
