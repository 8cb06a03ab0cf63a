"""SIGTERM, SIGHUP and SIGINT from a run's first instant: real `tpulaunch train` processes, real signals, each sent
when the run has printed the line it waits for (never after a sleep).

Before TensorFlow has loaded a signal unwinds the run: the lease is released and the run record says how it
ended. Once training runs, SIGHUP (a closed SSH session) is SIGTERM's twin: a checkpoint at the current step, exit
129, and the rerun resumes from it."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from lease_runs import Run, cli_env, wait_frozen
from train_jobs import JOB, MODELS, write_records
from tpulaunch.run import lease as leases
from tpulaunch.run.record import RECORD_FILE


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("signals")
    (root / "train_models.py").write_text(MODELS)
    (root / "job.yaml").write_text(JOB)
    write_records(root / "data" / "train.tfrecord", 64, seed=1)
    write_records(root / "data" / "eval.tfrecord", 32, seed=2)
    return root


def _train(project: Path, model_dir: Path, *args: str, **env: str) -> Run:
    return Run(["train", str(project / "job.yaml"), "--local", "--model-dir", str(model_dir), "--set", "eval=null",
                *args], env=cli_env(**env))


def _records(model_dir: Path) -> list:
    return [json.loads(line) for line in (model_dir / RECORD_FILE).read_text().splitlines()]


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_a_signal_while_tensorflow_loads_releases_the_lease_and_records_the_run(project, tmp_path, signum, code):
    """The signal arrives as the run says it starts loading TensorFlow (the import takes seconds): no traceback,
    the signal's exit code, the lease released (a rerun anywhere starts at once), one record line."""
    run_dir = tmp_path / "run"
    run = _train(project, run_dir, "--set", "train.steps=3")
    run.wait_for_line(lambda line: line == "phase | load TensorFlow")
    run.process.send_signal(signum)
    assert run.finish() == code, run.text()
    name = signal.Signals(signum).name
    assert "Traceback" not in run.text(), run.text()
    assert run.err[-1] == ("interrupted" if signum == signal.SIGINT else f"stopped by {name}"), run.err
    lease = leases.read_lease(str(run_dir))
    assert (lease["state"], lease["pid"]) == ("released", run.pid)
    [record] = _records(run_dir)
    assert (record["run_id"], record["outcome"]) == (lease["run_id"], f"stopped ({name})")
    assert not list(run_dir.glob("model.ckpt-*")), list(run_dir.iterdir())  # it never trained


def test_a_signal_the_moment_the_lease_is_taken_still_leaves_a_record(project, tmp_path):
    """The run freezes itself the moment model_dir's lease is written, before its record is set up
    (`TPULAUNCH_FREEZE_AT=lease-taken`), and is sent SIGTERM there: the lease released and one record line,
    `stopped (SIGTERM)`."""
    run_dir = tmp_path / "run"
    run = _train(project, run_dir, "--set", "train.steps=3", TPULAUNCH_FREEZE_AT="lease-taken")
    wait_frozen(run, "lease-taken")
    assert leases.read_lease(str(run_dir))["state"] == "held" and not (run_dir / RECORD_FILE).exists()
    for signum in (signal.SIGTERM, signal.SIGCONT):
        run.process.send_signal(signum)
    assert run.finish() == 143, run.text()
    lease = leases.read_lease(str(run_dir))
    assert (lease["state"], lease["pid"]) == ("released", run.pid)
    [record] = _records(run_dir)
    assert (record["run_id"], record["outcome"]) == (lease["run_id"], "stopped (SIGTERM)")


def test_sighup_mid_training_saves_a_checkpoint_at_the_step_and_the_rerun_resumes_from_it(project, tmp_path):
    run_dir = tmp_path / "run"
    run = _train(project, run_dir, "--set", "train.steps=100000", "--set", "run.log_every_steps=1",
                 "--set", "run.save_checkpoints_steps=100000")
    run.wait_for_line(lambda line: line.startswith("train | step ") and int(line.split()[3].split("/")[0]) >= 5)
    run.process.send_signal(signal.SIGHUP)
    assert run.finish() == 129, run.text()
    stopped = [line for line in run.err if line.startswith("stopped at step ")]
    assert stopped and stopped[0].endswith("checkpoint saved; rerun the same command to resume"), run.text()
    step = int(stopped[0].split()[3].rstrip(","))
    assert step >= 5 and (run_dir / f"model.ckpt-{step}.index").exists(), sorted(p.name for p in run_dir.iterdir())
    assert _records(run_dir)[-1]["outcome"] == "stopped (SIGHUP)"
    assert leases.read_lease(str(run_dir))["state"] == "released"

    rerun = _train(project, run_dir, "--set", f"train.steps={step + 3}")
    assert rerun.finish() == 0, rerun.text()
    assert f"resumed from step {step} ({run_dir})" in rerun.out, rerun.text()
    assert rerun.out[-1].startswith(f"done | step {step + 3}/{step + 3} | "), rerun.text()


# How a SIGINT while libraries load goes astray, reproduced by the job's own module as it is imported (no timing):
# a garbage-collection callback that reports the handler's KeyboardInterrupt as "Exception ignored" (JAX's, while
# Keras loads), and C code running Python through which the KeyboardInterrupt passes (TensorFlow's pybind11 exec).
SWALLOWED_IN_GC = '''
import gc, os, signal

def _interrupted_in_a_callback(phase, info):
    gc.callbacks.remove(_interrupted_in_a_callback)
    os.kill(os.getpid(), signal.SIGINT)  # the handler runs here; the callback's caller swallows its exception

gc.callbacks.append(_interrupted_in_a_callback)
gc.collect()
'''
THROUGH_C_CODE = '''
import ctypes

ctypes.pythonapi.PyRun_String.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object]
ctypes.pythonapi.PyRun_String.restype = ctypes.py_object
ctypes.pythonapi.PyRun_String(b"import os, signal; os.kill(os.getpid(), signal.SIGINT)", 257, {}, {})
'''


@pytest.mark.parametrize("how", ["swallowed by a gc callback", "through C code"])
def test_a_sigint_that_library_code_mishandles_still_stops_the_run_with_130(project, tmp_path, how):
    """Swallowed, it would be lost (the run trained to its end, exit 0); passed through C code, CPython remembers
    it and ends `python -m tpulaunch` by SIGINT after the clean exit (-2). Both: exit 130, never trained."""
    root = tmp_path / "job"
    root.mkdir()
    (root / "train_models.py").write_text((SWALLOWED_IN_GC if how.startswith("swallowed") else THROUGH_C_CODE)
                                          + MODELS)
    (root / "job.yaml").write_text(JOB)
    (root / "data").symlink_to(project / "data")
    run_dir = tmp_path / "run"
    run = _train(root, run_dir, "--set", "train.steps=3")
    assert run.finish() == 130, run.text()
    assert run.err[-1] == "interrupted", run.text()
    assert "Traceback" not in run.text(), run.text()
    assert not list(run_dir.glob("model.ckpt-*")), sorted(p.name for p in run_dir.iterdir())
    assert leases.read_lease(str(run_dir))["state"] == "released"
