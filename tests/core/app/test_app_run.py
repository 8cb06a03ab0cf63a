"""train's option rules about its TPU node, as the application layer applies them (`app/run.py`'s `watch_plan`):
refused or said before the node is asked about, so no TPU API and no TensorFlow are needed to show them."""

import pytest

from paths import TESTS
from tpulaunch.app.run import watch_plan
from tpulaunch.errors import ExitCode, TpuLaunchError
from tpulaunch.job.load import load_job

WATCH = dict(wait_s=0, interval=1, resume_wait=0)


@pytest.fixture(scope="module")
def jobs():
    """A job with a tpu: section and one without, as loaded (no check, no TensorFlow)."""
    return {name: load_job(str(TESTS / "jobs" / "good" / f"{name}.yaml"), [], env={}).job
            for name in ("tpu_ct", "local_dict")}


def test_recreate_needs_auto_resume(jobs):
    with pytest.raises(TpuLaunchError) as refused:
        watch_plan(jobs["tpu_ct"], local=True, watch_node=True, auto_resume=0, recreate=True, **WATCH)
    assert refused.value.message.startswith("--recreate needs --auto-resume N")
    assert refused.value.exit_code == ExitCode.USAGE  # a usage mistake: exit 2


def test_watch_node_needs_the_jobs_tpu_section(jobs):
    with pytest.raises(TpuLaunchError) as refused:
        watch_plan(jobs["local_dict"], local=True, watch_node=True, auto_resume=0, **WATCH)
    assert refused.value.message == "--watch-node needs the job's tpu: section (the node to watch)"
    assert "drop --watch-node" in refused.value.hint


def test_a_local_run_watches_nothing_and_says_auto_resume_has_no_effect(jobs):
    said = []
    assert watch_plan(jobs["tpu_ct"], local=True, watch_node=False, auto_resume=3, say=said.append, **WATCH) is None
    assert said == ["--auto-resume has no effect on a --local run without --watch-node"]
    said.clear()
    assert watch_plan(jobs["local_dict"], local=False, watch_node=False, auto_resume=0, say=said.append,
                      **WATCH) is None  # a job without tpu: has no node to watch
    assert said == []
