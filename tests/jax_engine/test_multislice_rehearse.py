"""The jax engine across two slices of TPU VMs, rehearsed on this CPU: `tpulaunch rehearse` of a job with
`tpu.slices: 2` of v4-16 and no gke: creates one multislice queued resource on the local Cloud TPU API, its two nodes'
four hosts (2 slices x 2 hosts) local processes that run the startup script, the host runner and `tpulaunch train`,
each told its slice by its VM's tpu-env, joined by jax.distributed into one data-parallel run. The last slice's node
is preempted at step 4: the queued resource is recreated whole, the run resumes from its newest checkpoint and ends at
the job's steps with the weights one process trains on the same examples."""

from __future__ import annotations

import json
import subprocess

import yaml

from jax_runs import HELD, TPULAUNCH, assert_weights_of_one_process, run_env
from jax_runs import project  # noqa: F401  (the fixture: the jax engine's small job)

import pytest

pytestmark = pytest.mark.slow  # a long end-to-end run: its worker starts it first


def test_two_slices_of_tpu_vms_rehearsed_through_a_preempted_slice_train_what_one_process_trains(
        project, tmp_path):  # noqa: F811
    job = yaml.safe_load((project / "job.yaml").read_text())
    job.pop("eval")
    job.pop("flags")  # its model is HELD's (which defines no flag)
    job["tpu"] = {"type": "v4-16", "slices": 2, "name": "slices", "zone": "us-central2-b", "project": "test-project"}
    job["train"]["steps"] = 8
    job["train"]["batch_size"] = 16  # divisible over two v4-16 slices' 16 devices (the 8 records, each twice)
    job["model"]["builder"] = "held:held"
    (project / "held.py").write_text(HELD)
    (project / "slices.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    env = dict(run_env(), NO_GCE_CHECK="True")
    run_dir, one_dir = tmp_path / "slices", tmp_path / "one"

    rehearsed = subprocess.run([*TPULAUNCH, "rehearse", "slices.yaml", "--preempt-at", "4", "--recreate", "1",
                                "--set", f"run.model_dir={run_dir}"],
                               cwd=project, env=dict(env, HOLD_UNTIL=str(run_dir / "tpulaunch-remote/attempts/2")),
                               capture_output=True, text=True, timeout=600)
    said = rehearsed.stdout + rehearsed.stderr
    assert rehearsed.returncode == 0, said
    assert "as a queued resource of 2 slices" in said, said
    assert "-1' at step 4" in said, said
    assert "recovery 1 of 1: creating queued resource 'slices' of 2 slices (TPU nodes slices-0, slices-1) again" \
        in said, said

    first = (run_dir / "tpulaunch-remote/attempts/1/worker-0.log").read_text()
    assert "train | step 4/8" in first and "train | step 5/8" not in first  # held at step 4 until preempted
    attempt = run_dir / "tpulaunch-remote/attempts/2"
    hosts = [json.loads((attempt / f"worker-{w}.json").read_text()) for w in range(4)]
    assert [(h["role"], h["exit_code"], h["slice"]) for h in hosts] == [("train", 0, w // 2) for w in range(4)]
    logs = [(attempt / f"worker-{w}.log").read_text() for w in range(4)]
    for index, log in enumerate(logs):
        assert f"jax | data-parallel over 4 cpu devices on 4 hosts (this is host {index})" in log
        assert "train | step 8/8" in log
    assert "checkpoint | step 8" in logs[0] and all("checkpoint |" not in log for log in logs[1:])

    assert_weights_of_one_process(project, "slices.yaml", run_dir, one_dir, env)
