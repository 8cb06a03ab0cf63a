"""Faults around a real CPU training run: signals, an unusable model_dir, a full disk, a vanished model_dir.

Every fault must end with exit code 1 (or the signal's own code), no traceback, a message that names the
path at fault, and no loss of the last complete checkpoint: a rerun resumes from it and ends at exactly
train.steps. benchmarks/interrupts.py runs the signal part 50 times at random moments.
"""

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

from paths import BENCHMARKS  # noqa: E402

sys.path.insert(0, str(BENCHMARKS))

import interrupts  # noqa: E402

from tpulaunch.engine.core.model_dir import checkpoint_step, model_dir_errors  # noqa: E402
from tpulaunch.errors import TpuLaunchError  # noqa: E402
from tpulaunch.cli.app import cli  # noqa: E402

STEPS, EVERY = 40, 5


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    return str(root), interrupts.write_project(str(root), steps=STEPS, every=EVERY)


def train(job: str, model_dir: str, *extra: str):
    """`tpulaunch train JOB --local` in this process, through the command group (its error handling included)."""
    result = CliRunner().invoke(cli, ["train", job, "--local", "--model-dir", model_dir, *extra],
                                env={"NO_COLOR": "1", "CI": "1", "COLUMNS": "200"})
    return result


def assert_finished_exactly(result, model_dir: str, steps: int = STEPS):
    assert result.exit_code == 0, result.output
    assert [line.split(" | ")[1] for line in result.output.splitlines() if line.startswith("done |")] == [f"step {steps}/{steps}"]
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
    assert int(reader.get_tensor("global_step")) == steps
    for name in reader.get_variable_to_shape_map():
        assert np.all(np.isfinite(reader.get_tensor(name))), name


def resumed_from(result) -> int:
    for line in result.output.splitlines():
        if line.startswith("resumed from step "):
            return int(line.split()[3])
    return 0


def assert_clean_failure(result, *names: str):
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "unexpected" not in result.output, result.output  # a named place and a hint, not an internal error
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    for name in names:
        assert name in result.output, result.output


class _SignalAtStep(threading.Thread):
    """Sends a signal to a child once its progress output reaches a step."""

    def __init__(self, child, signum: int, step: int):
        super().__init__(daemon=True)
        self.child, self.signum, self.step = child, signum, step
        self.seen_step = None
        self.seen_checkpoint = None
        self.lines = []

    def run(self):
        for line in self.child.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("checkpoint | step "):
                self.seen_checkpoint = int(line.split()[3])
            if line.startswith("train | step ") and self.seen_step is None:
                step = int(line.split()[3].split("/")[0])
                if step >= self.step:
                    self.seen_step = step
                    self.child.send_signal(self.signum)


def test_each_signal_loses_nothing_but_uncheckpointed_steps_on_kill(project):
    """SIGINT, SIGTERM and SIGKILL mid-run (three runs at once), then a resume of each to the exact step."""
    root, job = project
    at_step = {signal.SIGINT: 12, signal.SIGTERM: 17, signal.SIGKILL: 13}
    runs = {}
    for signum, step in at_step.items():
        model_dir = os.path.join(root, "runs", signal.Signals(signum).name)
        child = subprocess.Popen(interrupts.train_command(job, model_dir), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=interrupts._env())
        watcher = _SignalAtStep(child, signum, step)
        watcher.start()
        runs[signum] = (model_dir, child, watcher)
    for signum, (model_dir, child, watcher) in runs.items():
        _, err = child.communicate(timeout=300)
        watcher.join(10)
        name = signal.Signals(signum).name
        assert child.returncode == interrupts.EXPECTED_EXIT[signum], (name, err[-2000:])
        assert "Traceback" not in err, err
        assert watcher.seen_step is not None, watcher.lines

        rerun = train(job, model_dir)
        assert_finished_exactly(rerun, model_dir)
        start = resumed_from(rerun)
        if signum == signal.SIGKILL:
            assert start >= watcher.seen_checkpoint and watcher.seen_step - start <= EVERY, (start, watcher.lines)
        else:
            assert start >= watcher.seen_step, (name, start, watcher.lines)  # zero steps lost
            assert f"stopped at step {start}, checkpoint saved" in err


def test_model_dir_that_cannot_be_created(project, tmp_path):
    """model_dir below a regular file: no user (root included) can create it, unlike a chmod 0o500 directory."""
    root, job = project
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    result = train(job, str(blocker / "run"))
    assert_clean_failure(result, str(blocker))
    assert not os.path.isdir(str(blocker))


@pytest.fixture
def small_disk(tmp_path):
    """A directory on a 600 KiB tmpfs when this machine lets us mount one (root), else None."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount_point)],
                             capture_output=True).returncode == 0 if os.geteuid() == 0 else False
    yield str(mount_point) if mounted else None
    if mounted:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_disk_full_during_a_checkpoint_keeps_the_last_complete_one(project, small_disk, monkeypatch):
    """The disk fills up while a checkpoint is written: exit 1 naming the file, and the rerun resumes.

    Where a tmpfs can be mounted (root), the disk is real and 600 KiB: the checkpoint's .meta file
    (70 KiB for this graph) runs out of space after a few saves. Elsewhere the same failure is made
    in TensorFlow's own file layer: `file_io.atomic_write_string_to_file`, which writes the
    `checkpoint` state file after each save, raises ResourceExhaustedError("No space left on
    device") from the third save on.
    """
    root, job = project
    if small_disk is not None:
        model_dir = os.path.join(small_disk, "run")
        result = train(job, model_dir, "--set", "train.steps=60")
    else:
        from tensorflow.python.lib.io import file_io

        model_dir = os.path.join(root, "runs", "disk-full")
        real_write = file_io.atomic_write_string_to_file
        calls = []

        def write_until_full(filename, contents, overwrite=True):
            calls.append(filename)
            if len(calls) >= 3:
                raise tf.errors.ResourceExhaustedError(None, None, f"{filename}; No space left on device")
            return real_write(filename, contents, overwrite)

        monkeypatch.setattr(file_io, "atomic_write_string_to_file", write_until_full)
        result = train(job, model_dir, "--set", "train.steps=60")
        monkeypatch.undo()
    assert_clean_failure(result, model_dir, "no space left on device (ENOSPC): ")
    assert "OOM" not in result.output and "allocated tensors" not in result.output  # a full disk, not memory
    assert not [name for name in os.listdir(model_dir) if name.endswith(("_temp", ".tempstate"))]  # no save debris
    last = checkpoint_step(model_dir)
    assert last is not None and last >= EVERY  # the last complete checkpoint survived

    if small_disk is not None:
        subprocess.run(["mount", "-o", "remount,size=50m", small_disk], check=True)
    rerun = train(job, model_dir, "--set", "train.steps=60")
    assert_finished_exactly(rerun, model_dir, steps=60)
    assert resumed_from(rerun) == last


def test_model_dir_removed_mid_run(project, tmp_path):
    """Someone deletes model_dir while training: no traceback, and nothing half-done afterwards.

    Depending on which file TensorFlow writes next, the run either stops (exit 1, naming the path)
    or TensorFlow recreates the directory and carries on to the end. Either way a rerun ends at
    exactly train.steps with a restorable, finite checkpoint.
    """
    root, job = project
    model_dir = str(tmp_path / "vanishing")

    def remove_after_a_save_mid_run():
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(model_dir, f"model.ckpt-{EVERY}.index")) and time.monotonic() < deadline:
            time.sleep(0.01)
        shutil.rmtree(model_dir, ignore_errors=True)

    remover = threading.Thread(target=remove_after_a_save_mid_run, daemon=True)
    remover.start()
    result = train(job, model_dir)
    remover.join(10)
    if result.exit_code != 0:
        assert_clean_failure(result, model_dir)
    rerun = train(job, model_dir)
    assert_finished_exactly(rerun, model_dir)


def test_saver_refusing_a_vanished_model_dir_is_one_clear_error(tmp_path):
    """TensorFlow's Saver raises a bare ValueError when model_dir is no directory at save time (removed
    mid-run; here a file stands in its place): it must read as a problem with run.model_dir, while other
    ValueErrors keep their own handling."""
    model_dir = str(tmp_path / "gone")
    with open(model_dir, "w") as stand_in:
        stand_in.write("not a directory")
    with pytest.raises(TpuLaunchError) as caught, model_dir_errors(model_dir):
        with tf.Graph().as_default():
            tf.compat.v1.Variable(1.0)
            saver = tf.compat.v1.train.Saver()
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                saver.save(session, os.path.join(model_dir, "model.ckpt"))
    assert str(caught.value).startswith(f"run.model_dir {model_dir}: Parent directory of ")
    assert "recreate the directory" in caught.value.hint

    with pytest.raises(ValueError, match="unrelated"), model_dir_errors(model_dir):
        raise ValueError(f"unrelated: {model_dir}")
