"""The TPU watchdog and --auto-resume on the keras engine, end to end against the local Cloud TPU API: the same
job (tests/watched_runs.py, as tests/estimator/run/test_watchdog.py trains it), pinned to `run.engine: keras`, trained with `--local --watch-node`."""

from __future__ import annotations

import re

from click.testing import CliRunner

import watched_runs as watched
from tpulaunch.cli import run as cli_run
from tpulaunch.engine.core.model_dir import checkpoint_step
from tpulaunch.errors import ExitCode

project, api = watched.project, watched.api
KERAS = ["--set", "run.engine=keras"]


def train_cli(project, model_dir, *args):
    return CliRunner().invoke(cli_run.train, [str(project / "job.yaml"), "--model-dir", str(model_dir), *KERAS, *args],
                              catch_exceptions=False)


def test_preempted_mid_run_waits_resumes_and_ends_at_the_step_with_no_lost_steps(project, api, tmp_path):
    model_dir = tmp_path / "run"
    flip = watched.preempt_when_checkpoint_appears(api, model_dir, 20, back_after_s=1.0)
    result = train_cli(project, model_dir, *watched.FAST_WATCH, "--auto-resume", "2")
    flip.join()

    assert result.exit_code == 0, result.output
    (event,) = watched.lines(result.output, "tpu | PREEMPTED")
    stopped_at = int(re.fullmatch(r"tpu \| PREEMPTED \| step (\d+) \| checkpoint step \d+ \| 0 steps lost", event)
                     .group(1))
    assert event == f"tpu | PREEMPTED | step {stopped_at} | checkpoint step {stopped_at} | 0 steps lost"
    assert watched.lines(result.output, "tpu | READY") == [
        f"tpu | READY/HEALTHY | resuming from step {stopped_at} (resume 1 of 2)"]
    (done,) = watched.lines(result.output, "done")
    assert done.startswith("done | step 120/120 | 120 steps in "), done
    assert re.search(rf" \| 1 TPU event \(PREEMPTED at step {stopped_at}, back in \d+\.\d s\) \| 1 resume \| "
                     r"0 steps lost$", done), done
    assert checkpoint_step(str(model_dir)) == 120


def test_without_auto_resume_a_preemption_exits_3_and_the_rerun_finishes(project, api, tmp_path):
    model_dir = tmp_path / "run"
    flip = watched.preempt_when_checkpoint_appears(api, model_dir, 20)
    result = train_cli(project, model_dir, *watched.FAST_WATCH)
    flip.join()

    assert result.exit_code == ExitCode.CLUSTER == 3, result.output
    stopped_at = checkpoint_step(str(model_dir))
    assert 20 <= stopped_at < 120
    assert watched.lines(result.output, "TPU node 'my-tpu' lost") == [
        f"TPU node 'my-tpu' lost (PREEMPTED) at step {stopped_at}; the last complete checkpoint is at step "
        f"{stopped_at} (0 steps lost)"]

    api.set_node("my-tpu")
    rerun = train_cli(project, model_dir, *watched.FAST_WATCH)
    assert rerun.exit_code == 0, rerun.output
    assert f"resumed from step {stopped_at} ({model_dir})" in rerun.output.splitlines()
    assert checkpoint_step(str(model_dir)) == 120
