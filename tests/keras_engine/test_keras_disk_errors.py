"""The keras engine on a disk that fills up mid-run (a real tmpfs): the save that does not fit is named with its
errno and path (not TensorFlow's out-of-memory hint), its debris removed, the last complete checkpoint kept (a
rerun resumes from it: test_keras_train.py). Skipped where this machine cannot mount a tmpfs (the estimator's twin is in
tests/estimator/run/test_faults.py, which falls back to TensorFlow's own file layer there)."""

import json
import os
import subprocess
import sys

from paths import BENCHMARKS, REPO
from small_disks import tmpfs

sys.path.insert(0, str(BENCHMARKS))

import interrupts  # noqa: E402

from tpulaunch.engine.core.model_dir import checkpoint_step  # noqa: E402
from tpulaunch.run.record import RECORD_FILE  # noqa: E402


def test_disk_full_mid_run_names_the_disk_and_keeps_the_last_checkpoint(tmp_path):
    job = interrupts.write_project(str(tmp_path / "project"), steps=100000, every=5)
    env = dict(os.environ, PYTHONUNBUFFERED="1", CI="1", NO_COLOR="1", PYTHONPATH=str(REPO))
    with tmpfs(tmp_path / "disk", size="1m") as disk:
        model_dir = os.path.join(disk, "run")
        child = subprocess.Popen([sys.executable, "-m", "tpulaunch", "train", job, "--local", "--model-dir", model_dir,
                                  "--set", "run.engine=keras"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env)
        for line in child.stdout:  # the first checkpoint is saved: now the disk fills up
            if line.startswith("checkpoint | step "):
                break
        filler = os.open(os.path.join(disk, "filler"), os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(filler, b"x" * 4096)
        except OSError:
            pass
        finally:
            os.close(filler)
        out, err = child.communicate(timeout=300)
        assert child.returncode == 1, err[-3000:]
        assert "Traceback" not in err and "allocated tensors" not in err and "OOM" not in err, err[-3000:]
        assert f"error: run.model_dir {model_dir}: no space left on device (ENOSPC): {model_dir}/" in err, err[-3000:]
        assert not [name for name in os.listdir(model_dir) if name.endswith("_temp")]
        last = checkpoint_step(model_dir)
        assert last is not None and last >= 5
        # The run's record fitted in what the failed save freed, or not ("run record not written"): whole lines only.
        record = os.path.join(model_dir, RECORD_FILE)
        if os.path.exists(record):
            with open(record) as handle:
                assert [json.loads(line)["outcome"] for line in handle.read().splitlines()][-1].startswith("failed")
        else:
            assert "run record not written" in err

