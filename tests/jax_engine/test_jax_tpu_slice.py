"""The jax engine on a TPU slice, rehearsed on this CPU: `tpulaunch rehearse` of a jax job on a two-host v4-16,
each host a local process running the node's startup script and `tpulaunch train`, the two joined by
jax.distributed (coordinator, count and index from the $TF_CONFIG the host runner gives every host; CPU devices
through gloo), each feeding its half of every batch. The node is preempted at step 4 and recreated; the run resumes
from step 3 and ends with the weights one process trains on the same examples (within 1e-5). Worker 0 alone holds
the lease and writes the checkpoints."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import yaml

from jax_runs import HELD, TPULAUNCH, checkpoint_variables, run_env
from jax_runs import project  # noqa: F401  (the fixture: the jax engine's small job)

import pytest

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first


def test_two_hosts_rehearsed_through_a_preemption_train_what_one_process_trains(project, tmp_path):  # noqa: F811
    job = yaml.safe_load((project / "job.yaml").read_text())
    job.pop("eval")
    job.pop("flags")  # its model is HELD's (which defines no flag)
    job["tpu"] = {"name": "jax-tpu", "zone": "us-central1-a", "project": "test-project", "type": "v4-16"}
    job["train"]["steps"] = 8
    job["model"]["builder"] = "held:held"
    (project / "held.py").write_text(HELD)
    (project / "slice.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    env = dict(run_env(), NO_GCE_CHECK="True")
    slice_dir, one_dir = tmp_path / "slice", tmp_path / "one"

    rehearsed = subprocess.run([*TPULAUNCH, "rehearse", "slice.yaml", "--hosts", "2", "--preempt-at", "4",
                                "--recreate", "1", "--set", f"run.model_dir={slice_dir}"],
                               cwd=project, env=dict(env, HOLD_UNTIL=str(slice_dir / "tpulaunch-remote/attempts/2")),
                               capture_output=True, text=True, timeout=400)
    said = rehearsed.stdout + rehearsed.stderr
    assert rehearsed.returncode == 0, said
    assert "tpu | creating TPU node 'jax-tpu' (v4-16, on-demand, tpu-ubuntu2204-base)" in rehearsed.stderr
    assert "every host trains, worker 0 the chief" in rehearsed.stderr
    assert "rehearsal | preempted TPU node 'jax-tpu' at step 4: 2 host processes killed" in rehearsed.stderr
    assert "resumed from step 3" in rehearsed.stdout
    assert rehearsed.stdout.strip().splitlines()[-1].startswith("run | done | step 8/8 | 2 VMs | 1 recovery")

    first = (slice_dir / "tpulaunch-remote/attempts/1/worker-0.log").read_text()
    assert "train | step 4/8" in first and "train | step 5/8" not in first  # held at step 4 until preempted
    attempt = slice_dir / "tpulaunch-remote/attempts/2"
    hosts = [json.loads((attempt / f"worker-{w}.json").read_text()) for w in (0, 1)]
    assert [(h["role"], h["exit_code"]) for h in hosts] == [("train", 0), ("train", 0)]
    logs = [(attempt / f"worker-{w}.log").read_text() for w in (0, 1)]
    for index, log in enumerate(logs):
        assert f"jax | data-parallel over 2 cpu devices on 2 hosts (this is host {index})" in log
        assert "train | step 8/8" in log
    assert "checkpoint | step 8" in logs[0] and "checkpoint |" not in logs[1]  # the chief alone writes model_dir
    lease = json.loads((slice_dir / "tpulaunch.lease").read_text())
    assert lease["pid"] == hosts[0]["train_pid"]

    alone = subprocess.run([*TPULAUNCH, "train", "slice.yaml", "--local", "--model-dir", str(one_dir)],
                           cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "jax | data-parallel over 1 cpu device\n" in alone.stdout
    two, one = checkpoint_variables(slice_dir), checkpoint_variables(one_dir)
    assert sorted(two) == sorted(one) and one["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == 8
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-5, err_msg=name)
