"""`explain` never writes a `${VAR}` value into the program: the program reads it from the environment when it
runs (a secret it would still hold refuses the program, naming its key); the file is made executable within the
umask, as `chmod +x` does."""

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from paths import BENCHMARKS
from programs_run import RUN_WITHOUT_TPULAUNCH

sys.path.insert(0, str(BENCHMARKS))

import interrupts  # noqa: E402

from tpulaunch.cli.app import cli  # noqa: E402

SECRET = "tok-3f9a-SECRET-value"
BUILDER = '''
import os

import tensorflow as tf


def build(num_classes=2, api_token=None, bucket=None, **unused):
    with open(os.environ["TOKEN_SEEN"], "w") as seen:  # what the program handed the builder
        seen.write(f"{api_token} {bucket}")
    x = tf.keras.Input(shape=(4,), name="x")
    return tf.keras.Model(x, tf.keras.layers.Dense(num_classes)(x))
'''
PARAMS = """params:
    num_classes: 2
    api_token: ${API_TOKEN}
    bucket: gs://${BUCKET:-fallback}/data"""


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("secrets")
    path = interrupts.write_project(str(root), steps=2, every=2)
    (root / "token_builder.py").write_text(BUILDER)
    with open(path) as handle:
        text = handle.read().replace("tiny_builder:build", "token_builder:build")
    with open(path, "w") as handle:
        handle.write(text.replace("params: {num_classes: 2}", PARAMS))
    return path


def explain(job: str, *args: str, env: dict):
    return CliRunner().invoke(cli, ["explain", job, *args], env={"NO_COLOR": "1", **env})


@pytest.mark.parametrize("engine", ["estimator", "keras"])
def test_the_program_reads_the_value_from_the_environment(job, engine):
    result = explain(job, "--engine", engine, env={"API_TOKEN": SECRET})
    assert result.exit_code == 0, result.output
    assert SECRET not in result.stdout
    assert "'api_token': os.environ['API_TOKEN']" in result.stdout
    assert "'bucket': ('gs://' + os.environ.get('BUCKET', 'fallback') + '/data')" in result.stdout


def test_the_program_runs_with_the_value_it_does_not_hold_and_honours_the_umask(job, tmp_path):
    program = str(tmp_path / "program.py")
    old = os.umask(0o077)
    try:
        result = explain(job, "-o", program, "--engine", "estimator", env={"API_TOKEN": "not-this-one"})
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert os.stat(program).st_mode & 0o777 == 0o700  # executable for its owner only, as the umask says
    with open(program) as handle:
        assert "not-this-one" not in handle.read()

    seen = tmp_path / "seen.txt"
    env = {**os.environ, "API_TOKEN": SECRET, "BUCKET": "my-bucket", "TOKEN_SEEN": str(seen)}
    env.pop("PYTHONPATH", None)
    ran = subprocess.run([sys.executable, "-c", RUN_WITHOUT_TPULAUNCH, program], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert seen.read_text() == f"{SECRET} gs://my-bucket/data"  # read when it ran, not when it was written


def test_a_secret_the_program_would_hold_refuses_the_program(job, tmp_path):
    """`api_token: ${API_TOKEN}` that YAML reads as a number equal to another number of the program: it cannot be
    told apart from that number, so no program is written."""
    program = tmp_path / "program.py"
    result = explain(job, "-o", str(program), env={"API_TOKEN": "2"})
    assert result.exit_code == 1, result.output
    assert ("model.params.api_token: the value of ${API_TOKEN} would be written into the program in clear"
            in result.output)
    assert not program.exists()
