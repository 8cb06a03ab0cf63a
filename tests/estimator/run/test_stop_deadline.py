"""A stop honoured within a stated time, whatever the step waits on, and the machine's limits named (the
estimator engine; the keras and jax engines: tests/keras_engine/test_keras_stop_deadline.py). Real `tpulaunch`
processes, real FIFOs, real signals, a real address-space limit.

A run's input that blocks (the job's input_fn reads a FIFO that nothing more is written into) holds its step:
the graceful stop at the next step boundary cannot come. After the grace ($TPULAUNCH_STOP_GRACE_S, 2 s here)
the run is stopped where it is: exit 130, its record says why, its lease is released, and the last checkpoint
stays the one to resume from."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from lease_runs import Run, cli_env
from stop_runs import GRACE_S, STUCK, address_space_limit, assert_ended_whole, records
from train_jobs import JOB, MODELS, write_records
from tpulaunch.engine.core.model_dir import checkpoint_step

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("stop_deadline")
    (root / "train_models.py").write_text(MODELS)
    (root / "job.yaml").write_text(JOB)
    write_records(root / "data" / "train.tfrecord", 64, seed=1)
    write_records(root / "data" / "eval.tfrecord", 32, seed=2)
    return root


def _copy(project, tmp_path):
    """The job with a data directory of its own (its eval file is turned into a FIFO)."""
    root = tmp_path / "job"
    (root / "data").mkdir(parents=True)
    for name in ("train_models.py", "job.yaml"):
        (root / name).write_text((project / name).read_text())
    for name in ("train.tfrecord", "eval.tfrecord"):
        (root / "data" / name).write_bytes((project / "data" / name).read_bytes())
    return root


def test_a_fifo_among_the_data_files_is_refused_by_validate_and_train_at_its_key(project, tmp_path):
    """validate read it as an empty file (a warning); train opened it and waited forever for a writer."""
    root = _copy(project, tmp_path)
    os.mkfifo(root / "data" / "train-stream.tfrecord")
    (root / "job.yaml").write_text(JOB.replace("train: data/train.tfrecord", "train: data/train*.tfrecord"))
    said = f"{root}/data/train-stream.tfrecord is a FIFO (named pipe), not a TFRecord file"
    data = []

    validate = subprocess.run([sys.executable, "-m", "tpulaunch", "validate", str(root / "job.yaml"), *data],
                              capture_output=True, text=True, env=cli_env(), timeout=300)
    assert validate.returncode == 1, validate.stdout + validate.stderr
    assert f"data.train: {said}" in validate.stdout and "[data-not-a-file]" in validate.stdout, validate.stdout

    run_dir = tmp_path / "run"
    train = Run(["train", str(root / "job.yaml"), "--local", "--model-dir", str(run_dir), *data], env=cli_env())
    try:
        assert train.finish(limit_s=300) == 1, train.text()
    finally:
        train.end()
    # refused by train's own run of validate's data stage, at its key; the run's record says so, its lease released
    err = " ".join(" ".join(train.err).split())
    assert f"data.train: {said}" in err and "[data-not-a-file]" in err, train.text()
    assert_ended_whole(train, run_dir, f"failed: not running train on {root / 'job.yaml'}: fix the problems above "
                                       f"(tpulaunch validate {root / 'job.yaml'})")


# The job's own input_fn streams examples from a FIFO (64 float32 pixels and a label each): the run's input is what
# the test writes there, so the step after the last whole batch written waits on its input.
STREAM = """
import os

import numpy as np
import tensorflow as tf

FIFO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stream.fifo")
SIZE = 65 * 4


def train_input_fn(params):
    def examples():
        with open(FIFO, "rb") as stream:
            while True:
                data = stream.read(SIZE)
                if len(data) < SIZE:
                    return
                values = np.frombuffer(data, np.float32)
                yield values[:64].reshape(8, 8, 1), np.int64(values[64])

    spec = (tf.TensorSpec([8, 8, 1], tf.float32), tf.TensorSpec([], tf.int64))
    return tf.data.Dataset.from_generator(examples, output_signature=spec).batch(params["batch_size"],
                                                                               drop_remainder=True)
"""


@pytest.mark.parametrize("how", ["after the grace", "at a second Ctrl-C"])
def test_a_step_waiting_on_its_input_is_stopped_record_written_lease_released(project, tmp_path, how):
    """The test writes two batches into the FIFO the job's input_fn reads and keeps it open; SIGINT once step 2 is
    told: step 3 waits on its input and never returns. After the grace (or at once at a second Ctrl-C, with a grace
    far longer than the test) the run ends, exit 130, saying why; nothing is saved from inside the step."""
    import numpy as np

    root = _copy(project, tmp_path)
    (root / "stream.py").write_text(STREAM)
    os.mkfifo(root / "stream.fifo")
    run_dir = tmp_path / "run"
    grace = GRACE_S if how == "after the grace" else "600"
    run = Run(["train", str(root / "job.yaml"), "--local", "--model-dir", str(run_dir), "--set", "eval=null",
               "--set", "data.input_fn=stream:train_input_fn", "--set", "data.train=null", "--set", "data.eval=null",
               "--set", "train.steps=100000",
               "--set", "run.log_every_steps=1"], env=cli_env(TPULAUNCH_STOP_GRACE_S=grace))
    writer = []
    opening = threading.Thread(target=lambda: writer.append(os.open(root / "stream.fifo", os.O_WRONLY)), daemon=True)
    opening.start()  # returns once the input_fn's generator opened the FIFO for reading
    try:
        while opening.is_alive():
            if run.process.poll() is not None:  # let the thread's open go (a reader), then fail
                os.close(os.open(root / "stream.fifo", os.O_RDONLY | os.O_NONBLOCK))
                raise AssertionError("the run ended before it read its input:\n" + run.text())
            opening.join(0.5)
        examples = np.zeros((16, 65), np.float32)
        examples[:, 64] = np.arange(16) % 2
        os.write(writer[0], examples.tobytes())  # two batches of 8; the FIFO stays open, nothing more comes
        run.wait_for_line(lambda line: line.startswith("train | step 2/"))
        run.process.send_signal(signal.SIGINT)
        if how == "at a second Ctrl-C":
            run.wait_for_line(lambda line: line.startswith("stop | SIGINT: "), stream="err")
            run.process.send_signal(signal.SIGINT)
        code = run.finish(limit_s=120)  # without the stop's deadline it never ends
    finally:
        run.end()
        for fd in writer:
            os.close(fd)
    assert code == 130, run.text()
    # The SIGINT lands in the third step, which waits on input that never comes: stopped where it is, nothing saved
    # since the run's first checkpoint. Or it lands on the boundary after step 2, where the run saves its checkpoint
    # and then waits closing its session on the same input: stopped there, its step-2 checkpoint kept.
    stuck_step = STUCK if how == "after the grace" else \
        "a second Ctrl-C; the step did not return (waiting on its input, a store or a collective?)"
    closing = ("the phase 'close the session' did not end within 2 s of SIGINT" if how == "after the grace" else
               "a second Ctrl-C; the phase 'close the session' did not end")
    outcomes = [(stuck_step, 0), (closing, 2)]
    if how == "at a second Ctrl-C":  # or the second Ctrl-C comes while that step-2 checkpoint is being written: the
        # save is cut off, and the run resumes from whichever checkpoint is complete (the hint names it)
        outcomes.append(("a second Ctrl-C; the phase 'checkpoint' did not end", None))
    said = {reason: step for reason, step in outcomes
            if f"stopped by SIGINT: {reason}; nothing was saved at the stop" in run.err}
    assert len(said) == 1, run.text()
    (reason, step), = said.items()
    assert_ended_whole(run, run_dir, f"stopped (SIGINT): {reason}")
    newest = checkpoint_step(str(run_dir))
    assert newest == (step if step is not None else newest) and newest in (0, 2)  # nothing from inside the stuck step
    assert f"resumes from the last complete checkpoint, {run_dir}/model.ckpt-{newest}" in run.text(), run.text()
    assert "Traceback" not in run.text(), run.text()


def test_a_run_out_of_memory_under_ulimit_v_names_the_limit_and_is_recorded(project, tmp_path):
    """Under `ulimit -v 400000` TensorFlow's libraries cannot even be mapped: exit 1 naming the limit and its fix
    (it was exit 70, "an internal error, report it", and no record line)."""
    root = _copy(project, tmp_path)
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "tpulaunch", "train", str(root / "job.yaml"), "--local",
                           "--model-dir", str(run_dir)], capture_output=True, text=True, env=cli_env(), timeout=300,
                          preexec_fn=address_space_limit(400000))
    assert done.returncode == 1, done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert error.startswith("error: out of memory under this process's address-space limit of 391 MiB "
                            "(ulimit -v 400000): "), done.stderr
    assert "  hint: raise the limit before running (ulimit -v unlimited, or well above 391 MiB)" in done.stderr
    # said before the run starts: under such a limit TensorFlow may also abort natively, where nothing is recorded
    assert "warning: this process runs under an address-space limit of 391 MiB (ulimit -v 400000): TensorFlow and " \
           "XLA may then fail to start a thread and abort natively" in done.stderr
    [record] = records(run_dir)
    assert record["outcome"] == "failed: " + error[len("error: "):]
