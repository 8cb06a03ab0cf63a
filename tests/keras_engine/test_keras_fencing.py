"""The keras engine's fence: a `train` frozen (SIGSTOP) after one of its checkpoints, its lease taken over by a
second `train --take-lease` that trains to its end, then thawed (SIGCONT): it writes no checkpoint and no
`checkpoint` state after the takeover, exits 5 naming the new holder, and its record line says it was fenced
(tests/estimator/run/test_fencing.py is the estimator engine's, with a takeover by staleness as well)."""

from __future__ import annotations

import hashlib
import json
import signal
from pathlib import Path

from keras_jobs import project  # noqa: F401  (the fixture: a small keras-engine job)
from lease_runs import Run, check_fenced_mid_save, cli_env, freeze_after
from tpulaunch.errors import ExitCode
from tpulaunch.run import lease as leases
from tpulaunch.run.record import RECORD_FILE


def _train(project: Path, model_dir: Path, *args: str, **extra: str) -> Run:  # noqa: F811
    env = cli_env(TPULAUNCH_LEASE_RENEW_S="0.2", TPULAUNCH_LEASE_STALE_S="600", **extra)
    return Run(["train", str(project / "job.yaml"), "--model-dir", str(model_dir), "--set", "eval=null", *args],
               env=env)


def _files(model_dir: Path) -> dict:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(model_dir.iterdir())
            if path.is_file() and path.name not in (leases.LEASE_FILE, RECORD_FILE)}


def test_a_keras_run_that_thaws_after_take_lease_writes_no_checkpoint(project, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    # Unfenced, the first would go on to step 1000 after it thaws, saving every 150 steps over the second's work.
    first = _train(project, run_dir, "--set", "train.steps=1000", "--set", "run.save_checkpoints_steps=150",
                   "--set", "run.log_every_steps=1")
    second = None
    try:
        line = freeze_after(first, run_dir, lambda line: line.startswith("checkpoint | step "))
        frozen_at = int(line.split()[3])
        held = leases.read_lease(str(run_dir))
        end = frozen_at + 25
        second = _train(project, run_dir, "--set", f"train.steps={end}", "--set", "run.save_checkpoints_steps=10",
                        "--take-lease")
        assert second.finish() == 0, second.text()
        assert f"resumed from step {frozen_at} ({run_dir})" in second.out, second.text()
        before = _files(run_dir)
        assert f'model_checkpoint_path: "model.ckpt-{end}"' in (run_dir / "checkpoint").read_text()
        first.process.send_signal(signal.SIGCONT)
        assert first.finish() == ExitCode.LEASE_LOST, first.text()
    finally:
        for run in (first, second):
            if run is not None:
                run.end()
    assert _files(run_dir) == before  # no checkpoint, no `checkpoint` state from the first after the takeover
    new = leases.read_lease(str(run_dir))
    err = "\n".join(first.err)
    assert f"error: lease lost: host {held['host']}, pid {second.pid}, run {new['run_id']} took run.model_dir" in err
    assert f"its last checkpoint there: {run_dir / f'model.ckpt-{frozen_at}'})" in err, err
    assert "Traceback" not in err
    records = [json.loads(line) for line in (run_dir / RECORD_FILE).read_text().splitlines()]
    assert [(r["run_id"], r["outcome"].split(":")[0]) for r in records] == [(new["run_id"], "done"),
                                                                            (held["run_id"], "fenced")]


def test_a_keras_run_frozen_in_the_middle_of_a_save_leaves_its_successors_checkpoint_alone(project, tmp_path):  # noqa: F811
    check_fenced_mid_save(lambda run_dir, *args, **extra: _train(project, run_dir, *args, **extra), tmp_path / "run")
