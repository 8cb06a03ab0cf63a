"""TensorFlow 2.16+ prints start-up lines (oneDNN, CUDA probes) that TF_CPP_MIN_LOG_LEVEL does not hold back:
tpulaunch keeps them off the terminal unless -vv asks for everything."""

import os
import subprocess
import sys
from paths import REPO

STARTUP = ("oneDNN custom operations", "cuda drivers", "cuInit")


def validate(*flags: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # as a user's shell has it
    return subprocess.run([sys.executable, "-m", "tpulaunch", *flags, "validate", "configs/quickstart.yaml",
                           "--set", "run.engine=keras", "--set", "data.train=missing-*.tfrecord"],
                          cwd=REPO, capture_output=True, text=True, env={**env, "NO_COLOR": "1"})


def test_tensorflows_start_up_lines_stay_off_the_terminal():
    quiet = validate()
    assert quiet.returncode == 1 and "data.train" in quiet.stdout, quiet.stdout + quiet.stderr
    assert not [line for line in quiet.stderr.splitlines() if any(s in line for s in STARTUP)], quiet.stderr


def test_minus_vv_shows_them():
    loud = validate("-vv")
    assert "oneDNN custom operations" in loud.stderr, loud.stderr
