"""Under the `[jax]` extra alone (no tf-keras) nothing sets TF_USE_LEGACY_KERAS: set there, it leaves tf.keras
nothing to load, and tensorflow_text, KerasHub with it, fails to import (RecursionError). Where tf-keras is
installed the keras engine's builders still get it (tf.keras is tf-keras). An environment without tf-keras is this
one with `sys.modules["tf_keras"] = None`: Python then neither finds nor imports it, as where it is not installed."""

from __future__ import annotations

import subprocess
import sys

from jax_runs import TPULAUNCH, run_env
from jax_runs import project  # noqa: F401  (the fixture: the small Keras 3 job)

WITHOUT_TF_KERAS = 'import sys; sys.modules["tf_keras"] = None\n'


def _python(code: str, cwd=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in run_env().items() if k != "TF_USE_LEGACY_KERAS"}  # as a fresh shell has it
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=cwd)


def test_a_jax_engine_process_without_tf_keras_imports_kerashub():
    # What every tpulaunch process sets first (tf_env.quiet_tensorflow), then the jax engine's own load().
    started = _python(WITHOUT_TF_KERAS + (
        "import os\n"
        "from tpulaunch.tf_env import quiet_tensorflow\n"
        "from tpulaunch.seam.registry import engine\n"
        "quiet_tensorflow()\n"
        "engine('jax').load()\n"
        "print('TF_USE_LEGACY_KERAS', os.environ.get('TF_USE_LEGACY_KERAS'))\n"
        "import keras_hub\n"
        "print('keras_hub', keras_hub.models.BertTextClassifier.__name__)\n"))
    assert started.returncode == 0, started.stderr[-3000:]
    assert started.stdout.splitlines() == ["TF_USE_LEGACY_KERAS None", "keras_hub BertTextClassifier"]

    with_tf_keras = _python("import os\nfrom tpulaunch.tf_env import quiet_tensorflow\nquiet_tensorflow()\n"
                            "print(os.environ.get('TF_USE_LEGACY_KERAS'))")
    assert with_tf_keras.returncode == 0 and with_tf_keras.stdout.strip() == "1", with_tf_keras.stderr


def test_the_explained_jax_program_sets_legacy_keras_only_where_tf_keras_is_installed(project, tmp_path):
    program = tmp_path / "program.py"
    explained = subprocess.run([*TPULAUNCH, "explain", str(project / "job.yaml"), "-o", str(program)],
                               capture_output=True, text=True, env=run_env(), timeout=300, cwd=project)
    assert explained.returncode == 0, explained.stdout + explained.stderr
    text = program.read_text()
    header = text[:text.index("\nimport argparse")]  # what the program runs before anything imports TensorFlow
    for hidden, expected in ((WITHOUT_TF_KERAS, "None"), ("", "1")):
        ran = _python(hidden + header + "\nprint(os.environ.get('TF_USE_LEGACY_KERAS'))")
        assert ran.returncode == 0 and ran.stdout.strip() == expected, (hidden, ran.stdout, ran.stderr)
