"""TensorFlow 2.16+ prints start-up lines (oneDNN, CPU features, CUDA probes) that TF_CPP_MIN_LOG_LEVEL does not
hold back: every verb keeps them off the terminal, as `train` does, unless -vv asks for everything.

Which lines TensorFlow prints depends on the machine (oneDNN's line on some CPUs, `cpu_feature_guard` on others,
the CUDA probes where there is no GPU driver), so the lines expected under -vv are the ones a bare
`import tensorflow` prints on this machine, not a fixed list.
"""

import os
import re
import subprocess
import sys

import pytest
from paths import REPO

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

# A C++ log line (`I0000 00:00:1795762751.030190    2189 port.cc:153] ...`) and absl's notice before it.
CPP_LINE = re.compile(r"\b(\w+\.cc):\d+\]|absl::InitializeLog")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # as a user's shell has it
    return {**env, "NO_COLOR": "1"}


def _tags(stderr: str) -> set:
    return {match.group(1) or match.group(0) for match in map(CPP_LINE.search, stderr.splitlines()) if match}


@pytest.fixture(scope="module")
def machine_start_up_tags() -> set:
    """What a bare `import tensorflow` (and its device probe) prints on this machine."""
    bare = subprocess.run([sys.executable, "-c", "import tensorflow as tf; tf.config.list_physical_devices()"],
                          capture_output=True, text=True, env=_env())
    assert bare.returncode == 0, bare.stderr
    return _tags(bare.stderr)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("startup")
    made = tpulaunch("data", "synth", "--example", "quickstart", str(path / "data"), "--records", "80", "--shards", "1")
    assert made.returncode == 0, made.stderr
    return path


def tpulaunch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpulaunch", *args], cwd=REPO, capture_output=True, text=True,
                          env=_env())


def job_args(workdir) -> list:
    return ["configs/quickstart.yaml", "--set", "run.engine=keras",
            "--set", f"data.train={workdir}/data/train-*.tfrecord", "--set", f"data.eval={workdir}/data/eval-*.tfrecord",
            "--set", f"run.model_dir={workdir}/model", "--set", "train.steps=2", "--set", "train.batch_size=8",
            "--set", "eval.batch_size=8", "--set", "eval.steps=1"]


def test_every_verb_keeps_tensorflows_start_up_lines_off_the_terminal(workdir):
    """The full path: a job that builds, trains, evaluates and exports; and the data tools."""
    runs = {
        "validate": tpulaunch("validate", *job_args(workdir)),
        "plan": tpulaunch("plan", *job_args(workdir)),
        "train": tpulaunch("train", *job_args(workdir)),
        "evaluate": tpulaunch("evaluate", *job_args(workdir)),
        "export": tpulaunch("export", *job_args(workdir)[:1], str(workdir / "exported"), *job_args(workdir)[1:]),
        "data inspect": tpulaunch("data", "inspect", str(workdir / "data" / "train-00000-of-00001.tfrecord")),
    }
    for verb, run in runs.items():
        assert run.returncode == 0, f"{verb}: {run.stdout}{run.stderr}"
        assert not _tags(run.stderr), f"{verb} printed TensorFlow's start-up lines:\n{run.stderr}"
    assert "done | step 2/2" in runs["train"].stdout + runs["train"].stderr


def test_minus_vv_shows_them(workdir, machine_start_up_tags):
    # TensorFlow 2.16+ prints at least its device probe's lines (CUDA drivers, cuInit, CPU features) at start-up.
    assert machine_start_up_tags, "a bare `import tensorflow` printed no start-up lines: nothing for -vv to show"
    loud = tpulaunch("-vv", "plan", *job_args(workdir))
    assert loud.returncode == 0, loud.stderr
    assert machine_start_up_tags <= _tags(loud.stderr), loud.stderr
