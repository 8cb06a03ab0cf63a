"""`run`'s follow of a JobSet across its restarts, with the JobSet's status given by hand and the chiefs' logs in a
local model_dir: the lost generation's last lines, two restarts in a row, a reattach after restarts."""

from __future__ import annotations

import os
import re

from tpulaunch.errors import ExitCode
from tpulaunch.remote import gke, layout
from tpulaunch.remote.follow import HostLog, Recovery


def _write(model_dir: str, attempt: int, text: str) -> None:
    path = layout.host_log(model_dir, attempt, 0)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as handle:
        handle.write(text)


def _follower(model_dir: str, statuses: list, between=None):
    """A GkeRun whose JobSet reads as each of `statuses` in turn (`between(i)` called before the i-th read)."""
    run = object.__new__(gke.GkeRun)
    said, out = [], []
    manifest = {"spec": {"failurePolicy": {"maxRestarts": 5}, "replicatedJobs": [{"template": {"spec": {"template": {
        "spec": {"containers": [{"env": [{"name": "TPULAUNCH_ATTEMPT_BASE", "value": "0"}]}]}}}}}]}}
    stage = type("Stage", (), {"model_dir": model_dir})
    run.sub = type("Sub", (), {"manifest": manifest, "name": "js", "stage": stage})
    run.say, run.out, run.poll_s, run.timeout_s = said.append, out.append, 0, 0
    reads = iter(range(len(statuses)))

    def get():
        i = next(reads)
        if between is not None:
            between(i)
        return {"status": statuses[i]}

    run.get = get
    return run, said, out


DONE = {"conditions": [{"type": "Completed", "status": "True"}]}


def test_the_lost_generations_last_lines_are_shown_and_count_in_the_steps_lost(tmp_path):
    model_dir = str(tmp_path / "m")

    def between(i):
        if i == 0:
            _write(model_dir, 1, "train | start | step 0/100 | batch 8\ntrain | step 10/100 | loss 1\n")
        if i == 1:  # written after the follower's last read of it, before the restart was seen
            _write(model_dir, 1, "train | step 40/100 | loss 0.5\nerror: the node went away\n")
            _write(model_dir, 2, "train | start | step 30/100 | batch 8\ntrain | step 50/100 | loss 0.4\n")

    run, said, out = _follower(model_dir, [{"restarts": 0}, {"restarts": 1}, {"restarts": 1, **DONE}], between)
    assert run.follow() == 0
    assert "train | step 40/100 | loss 0.5" in out and "error: the node went away" in out
    (back,) = [line for line in said if line.startswith("gke | back in")]
    assert re.search(r"resumed from step 30 \(10 steps since the last logged step lost\)", back), said
    # the last line says what the restarts cost in all
    assert re.fullmatch(r"gke \| JobSet 'js' completed after 1 restart \(back in \d+\.\d s; 10 steps lost since "
                        r"the last logged step\)", said[-1]), said


def test_two_restarts_in_a_row_count_the_time_back_from_the_first_loss():
    first = HostLog("unused", 1)
    first.step = 40
    second = HostLog("unused", 2)  # lost before it logged a step
    recovery = Recovery()
    recovery.lost(first, 100.0)
    recovery.lost(second, 160.0)
    third = HostLog("unused", 3)
    third.first_step, third.started_from = 35, 30
    words = recovery.back(third, 200.0)
    assert recovery.recoveries == [{"recovery_s": 100.0, "step": 40, "resumed_from": 30, "steps_lost": 10}]
    assert words.startswith("back in 100.0 s") and "(10 steps since the last logged step lost)" in words
    # the run's last line: each restart counted (two in a row are one time back to training)
    assert recovery.summary() == " after 2 restarts (back in 100.0 s; 10 steps lost since the last logged step)"
    fourth = HostLog("unused", 4)  # lost again before it logged a step: its steps lost are not known
    recovery.lost(fourth, 300.0)
    fifth = HostLog("unused", 5)
    fifth.first_step, fifth.started_from = 31, 30
    recovery.back(fifth, 331.5)
    assert recovery.summary() == " after 3 restarts (back in 100.0 s and 31.5 s; at least 10 steps lost since " \
                                 "the last logged step)"
    recovery.lost(fifth, 400.0)  # and lost once more, the run ending before it trains again
    assert recovery.summary() == " after 4 restarts (back in 100.0 s and 31.5 s; not trained again after the " \
                                 "last; at least 10 steps lost since the last logged step)"


def test_a_jobset_that_fails_after_a_restart_it_never_trained_again_after_says_so(tmp_path):
    model_dir = str(tmp_path / "m")
    _write(model_dir, 1, "train | start | step 0/100 | batch 8\ntrain | step 10/100 | loss 1\n")
    failed = {"conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}]}
    run, said, out = _follower(model_dir, [{"restarts": 0}, {"restarts": 1}, {"restarts": 1, **failed}])
    assert run.follow() == int(ExitCode.CLUSTER)
    assert said[-1] == "gke | JobSet 'js' failed after 1 restart (not trained again after the last): " \
                       "BackoffLimitExceeded", said


def test_a_reattach_after_restarts_follows_the_current_chief_and_tells_no_restart_as_new(tmp_path):
    model_dir = str(tmp_path / "m")
    _write(model_dir, 1, "train | start | step 0/100 | batch 8\ntrain | step 10/100 | loss 1\n")
    _write(model_dir, 3, "train | start | step 60/100 | batch 8\ntrain | step 70/100 | loss 0.2\n")
    run, said, out = _follower(model_dir, [{"restarts": 2}, {"restarts": 2, **DONE}])
    assert run.follow() == 0
    assert "train | step 70/100 | loss 0.2" in out
    assert not [line for line in said if "back in" in line or line.startswith("gke | restart ")], said
    assert said[-1] == "gke | JobSet 'js' completed", said  # restarts before the follow: none it saw the cost of
