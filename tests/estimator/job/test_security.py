"""Security basics: YAML builds plain data only, secrets from the environment are never shown in full or
saved, and import strings are checked for form before anything is imported."""

import json
import os
import sys

import pytest
from click.testing import CliRunner

from tpulaunch.cli.app import cli
from tpulaunch.job.imports import ImportPathError, resolve
from tpulaunch.job.load import load_job
from tpulaunch.checks.validate import validate_job
from tpulaunch.job.yamlfile import SECRET_MASK

GOOD = """\
name: demo
model:
  builder: tpulaunch.models.cnn:build
  params: {num_classes: 2}
data:
  train: /data/train-*.tfrecord
  features:
    image: {shape: [8, 8, 1]}
  labels:
    label: {shape: [], dtype: int64}
train: {batch_size: 8, steps: 10}
run: {model_dir: /tmp/runs/demo}
"""


def write(tmp_path, text: str, name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def codes(problems):
    return [(p.code, p.path, p.line) for p in problems]


# ----------------------------------------------------------------------------------- YAML tags

@pytest.mark.parametrize("tagged", [
    "!!python/object/apply:os.system ['touch {marker}']",
    "!!python/object/apply:subprocess.check_call [['touch', '{marker}']]",
    "!!python/object/new:subprocess.Popen [['touch', '{marker}']]",
    "!!python/object/apply:builtins.open ['{marker}', 'w']",
    "!!python/name:os.system",
    "!!python/module:os",
    "!!python/object:collections.OrderedDict {{}}",
])
def test_python_tags_are_refused_and_never_run(tmp_path, tagged):
    marker = tmp_path / "PWNED"
    value = tagged.format(marker=marker)
    text = GOOD.replace("params: {num_classes: 2}", f"params:\n    num_classes: {value}")
    result = validate_job(write(tmp_path, text), static=True, env={})
    assert codes(result.problems) == [("yaml-unsupported-tag", "model.params.num_classes", 5)]
    assert not marker.exists()


def test_python_tags_in_keys_merges_and_overrides_are_refused(tmp_path):
    marker = tmp_path / "PWNED"
    attack = f"!!python/object/apply:os.system ['touch {marker}']"
    text = GOOD + f"base: &b {{x: {attack}}}\nextra:\n  <<: *b\n"
    result = validate_job(write(tmp_path, text), static=True, env={},
                          overrides=[f"model.params.num_classes={attack}"])
    assert [p.code for p in result.problems] == ["override-value"]
    result = validate_job(write(tmp_path, text), static=True, env={})
    assert ("yaml-unsupported-tag", "base.x", 13) in codes(result.problems)
    assert not marker.exists()


def test_cli_reports_the_tag_at_its_place_without_running_it(tmp_path):
    marker = tmp_path / "PWNED"
    path = write(tmp_path, GOOD.replace("name: demo", f"name: !!python/object/apply:os.system ['touch {marker}']"))
    result = CliRunner().invoke(cli, ["validate", "--static", "--format", "json", path])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert [(p["code"], p["path"], p["line"], p["column"]) for p in doc["problems"]] == [
        ("yaml-unsupported-tag", "name", 1, 7)]
    assert not marker.exists()


# ----------------------------------------------------------------------------------- secrets

SECRET = "s3cr3t-VALUE-0123456789"
SECRET_JOB = GOOD.replace("params: {num_classes: 2}", """params:
    num_classes: 2
    api_key: ${API_KEY}
    auth: {password: "${DB_PASSWORD}", user: me}
  optimizer:
    name: adam
    args: {access_token: "${API_KEY}"}""")


@pytest.mark.parametrize("fmt", ["text", "json", "github"])
def test_secret_values_are_never_printed(tmp_path, fmt):
    """A job with secrets from the environment and mistakes next to them: no output holds a secret."""
    text = SECRET_JOB.replace("steps: 10", "steps: -1").replace("name: demo", "name: demo\nsecret_key: ${API_KEY}")
    path = write(tmp_path, text)
    result = CliRunner().invoke(cli, ["validate", "--static", "--format", fmt, path,
                                      "--set", "model.params.token=${API_KEY}"],
                                env={"API_KEY": SECRET, "DB_PASSWORD": SECRET, "NO_COLOR": "1"})
    assert result.exit_code == 1
    assert SECRET not in result.output
    assert "train.steps" in result.output and "secret_key" in result.output  # the mistakes are reported


def test_secret_in_a_checked_field_is_not_echoed(tmp_path):
    """A feature `key` (a name that looks secret) with a wrong-typed value from the environment."""
    text = GOOD.replace("image: {shape: [8, 8, 1]}", "image:\n      shape: [8, 8, 1]\n      key: ${IMAGE_KEY}")
    path = write(tmp_path, text)
    result = CliRunner().invoke(cli, ["validate", "--static", "--format", "json", path],
                                env={"IMAGE_KEY": "1234567"})
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert [(p["code"], p["path"]) for p in doc["problems"]] == [("wrong-type", "data.features.image.key")]
    assert "1234567" not in result.stdout


def test_job_copy_in_model_dir_holds_no_secret(tmp_path):
    from tpulaunch.engine.core.model_dir import JOB_COPY, write_job_copy

    path = write(tmp_path, SECRET_JOB)
    loaded = load_job(path, env={"API_KEY": SECRET, "DB_PASSWORD": SECRET})
    assert loaded.job is not None, loaded.problems
    copy = write_job_copy(loaded.job, str(tmp_path / "model_dir"))
    assert os.path.basename(copy) == JOB_COPY
    text = open(copy).read()
    assert SECRET not in text
    import yaml

    saved = yaml.safe_load(text)
    assert saved["model"]["params"] == {"num_classes": 2, "api_key": SECRET_MASK,
                                        "auth": {"password": SECRET_MASK, "user": "me"}}
    assert saved["model"]["optimizer"]["args"] == {"access_token": SECRET_MASK}


# ----------------------------------------------------------------------------------- import strings

@pytest.mark.parametrize("spec", ["os.system('touch x')", "__import__('os'):system", "os; rm -rf /:x", "os:",
                                  ":system", "a..b:c", "os:system()", "../evil:build", "os:system ", ""])
def test_malformed_import_strings_are_refused_before_importing(spec):
    before = set(sys.modules)
    with pytest.raises(ImportPathError) as error:
        resolve(spec, what="model.builder")
    assert error.value.message == f"model.builder {spec!r} is not of the form 'package.module:function'"
    assert set(sys.modules) == before


@pytest.mark.parametrize("spec", ["os.system('touch x')", "../evil:build", "os:system()"])
def test_malformed_builder_is_a_located_problem(tmp_path, spec):
    path = write(tmp_path, GOOD.replace("tpulaunch.models.cnn:build", json.dumps(spec)))
    result = validate_job(path, static=True, env={})
    assert codes(result.problems) == [("invalid-value", "model.builder", 3)]


def test_failing_import_names_the_module_without_a_traceback(tmp_path):
    (tmp_path / "broken_models.py").write_text("import tensorflow as tf\nraise RuntimeError('boom at import')\n")
    with pytest.raises(ImportPathError) as error:
        resolve("broken_models:build", search_path=[str(tmp_path)], what="model.builder")
    assert error.value.message == ("importing module 'broken_models' for model.builder 'broken_models:build' failed: "
                                   "RuntimeError: boom at import")
    assert error.value.hint == f"the error is raised at {tmp_path / 'broken_models.py'}:2"
    with pytest.raises(ImportPathError) as error:
        resolve("no_such_module_here:build", search_path=[str(tmp_path)], what="model.builder")
    assert error.value.message == "cannot import model.builder 'no_such_module_here:build': no module named 'no_such_module_here'"


def test_failing_builder_import_in_validate_is_a_problem_not_a_traceback(tmp_path):
    (tmp_path / "broken_models.py").write_text("raise RuntimeError('boom at import')\n")
    path = write(tmp_path, GOOD.replace("tpulaunch.models.cnn:build", "broken_models:build")
                 .replace("/data/train-*.tfrecord", str(tmp_path / "none-*.tfrecord")))
    result = CliRunner().invoke(cli, ["validate", path], env={"NO_COLOR": "1", "COLUMNS": "300"})
    assert result.exit_code == 1
    assert "Traceback" not in result.output and "unexpected" not in result.output
    assert "broken_models" in result.output and "boom at import" in result.output


# ----------------------------------------------------------------------------------- secrets by origin

# A `${VAR}` under keys that do not look secret (a string and a number), and a --set under a secret-looking key.
CONN, PORT, PASSWORD = "postgres://me:pw-8f3a1c@db.internal/x", 54321, "hunter2-from-the-command-line"
ORIGIN_MODELS = '''
import hashlib
import os

import tensorflow as tf


def build(num_classes=2, conn=None, port=None, db_password=None):
    """Writes a hash of the values it was given where the test looks (outside model_dir)."""
    seen = f"{conn}|{port!r}|{db_password}"
    with open(os.environ["SECRET_PROOF"], "w") as handle:
        handle.write(hashlib.sha256(seen.encode()).hexdigest())
    image = tf.keras.Input(shape=(8, 8, 1), name="image")
    x = tf.keras.layers.GlobalAveragePooling2D()(tf.keras.layers.Conv2D(2, 3, padding="same")(image))
    return tf.keras.Model(image, tf.keras.layers.Dense(num_classes)(x))
'''
ORIGIN_JOB = """\
name: origin
model:
  builder: origin_models:build
  params:
    num_classes: 2
    conn: ${DB_CONN}
    port: ${DB_PORT}
  optimizer: {name: sgd, learning_rate: 0.01}
data:
  train: data/train.tfrecord
  features: {image: {shape: [8, 8, 1]}}
  labels: {label: {shape: [], dtype: int64}}
train: {batch_size: 8, steps: 2}
run: {model_dir: runs/origin, save_checkpoints_steps: 2, log_every_steps: 1}
"""


def _tpulaunch(project, *args, **env):
    import subprocess

    from paths import REPO

    environ = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "DB_CONN": CONN, "DB_PORT": str(PORT),
               "SECRET_PROOF": str(project / "proof"), **env}
    return subprocess.run([sys.executable, "-m", "tpulaunch", *args], cwd=project, env=environ, capture_output=True,
                          text=True, timeout=600)


def _holding(root, *values) -> list:
    """Every file under `root` that holds one of `values`."""
    return [str(path) for path in root.rglob("*") if path.is_file()
            and any(str(value).encode() in path.read_bytes() for value in values)]


@pytest.fixture(scope="module")
def origin_project(tmp_path_factory):
    import numpy as np

    from records import write_examples

    root = tmp_path_factory.mktemp("origin")
    (root / "origin_models.py").write_text(ORIGIN_MODELS)
    (root / "job.yaml").write_text(ORIGIN_JOB)
    (root / "data").mkdir()
    rng = np.random.default_rng(0)
    write_examples(root / "data" / "train.tfrecord",
                   [{"image": rng.normal(size=64).astype(np.float32), "label": i % 2} for i in range(16)])
    return root


def test_secrets_by_origin_reach_the_builder_and_no_file_of_model_dir_nor_the_output(origin_project):
    """`train`: the job copy, the run record and every other file it writes under model_dir, and its output."""
    import hashlib

    import yaml

    trained = _tpulaunch(origin_project, "train", "job.yaml", "--local",
                         "--set", f"model.params.db_password={PASSWORD}")
    assert trained.returncode == 0, trained.stdout + trained.stderr
    expected = hashlib.sha256(f"{CONN}|{PORT!r}|{PASSWORD}".encode()).hexdigest()
    assert (origin_project / "proof").read_text() == expected  # the builder got the values
    model_dir = origin_project / "runs" / "origin"
    assert (model_dir / "tpulaunch-job.yaml").exists() and (model_dir / "tpulaunch-runs.jsonl").exists()
    assert any(model_dir.glob("model.ckpt-2*"))
    assert _holding(model_dir, CONN, PORT, PASSWORD) == []
    assert not {CONN, str(PORT), PASSWORD} & {word for word in (trained.stdout + trained.stderr).split()}
    assert CONN not in trained.stdout + trained.stderr and PASSWORD not in trained.stdout + trained.stderr
    copy = yaml.safe_load((model_dir / "tpulaunch-job.yaml").read_text())
    assert copy["model"]["params"] == {"num_classes": 2, "conn": SECRET_MASK, "port": SECRET_MASK,
                                       "db_password": SECRET_MASK}
    assert (model_dir / "tpulaunch-job.yaml").stat().st_mode & 0o777 == 0o600


def test_explain_reads_a_var_secret_from_the_environment_and_refuses_one_from_set(origin_project):
    explained = _tpulaunch(origin_project, "explain", "job.yaml", "--engine", "estimator")
    assert explained.returncode == 0, explained.stderr
    assert "os.environ['DB_CONN']" in explained.stdout and "int(os.environ['DB_PORT'])" in explained.stdout
    assert CONN not in explained.stdout + explained.stderr
    assert str(PORT) not in explained.stdout + explained.stderr
    refused = _tpulaunch(origin_project, "explain", "job.yaml", "--engine", "estimator",
                         "--set", f"model.params.db_password={PASSWORD}")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "model.params.db_password: a secret given with --set would be written into the program" in refused.stderr
    assert 'write `db_password: "${DB_PASSWORD}"` into the job file instead' in refused.stderr
    assert PASSWORD not in refused.stdout + refused.stderr and "Traceback" not in refused.stderr


def test_a_secret_quoted_in_an_error_message_is_masked(origin_project, tmp_path):
    """The job's own builder fails with a message quoting a secret: the message shows it masked."""
    (tmp_path / "origin_models.py").write_text(
        "def build(num_classes=2, conn=None, **params):\n    raise ValueError(f'cannot reach {conn}')\n")
    (tmp_path / "job.yaml").write_text(ORIGIN_JOB.replace("data/train.tfrecord",
                                                          str(origin_project / "data" / "train.tfrecord")))
    failed = _tpulaunch(tmp_path, "validate", "job.yaml", "--local")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "cannot reach ***" in failed.stdout + failed.stderr
    assert CONN not in failed.stdout + failed.stderr


# Secrets a message can quote in another form than the job's value: one inside a longer string, a number, a
# multi-line one (a message keeps its first line).
EMBEDDED, NUMBER, LINES = "pw-Zq81xT", 98765432, "line-one-AAA\nline-two-BBB"
QUOTING_BUILDER = '''
def build(num_classes=2, url=None, pin=None, note=None, **params):
    password = url.split(":")[2].split("@")[0]
    raise ValueError(f"cannot log in with {password} and {pin} for {note}")
'''


def test_a_secret_quoted_in_another_form_is_masked_in_the_message_the_traceback_and_the_run_record(
        origin_project, tmp_path):
    """`--debug train`: the builder's message quotes the part of a URL a ${VAR} filled, a number, a multi-line
    value's lines; none of them is in the output (the traceback's included) nor in the run record."""
    (tmp_path / "origin_models.py").write_text(QUOTING_BUILDER)
    job = ORIGIN_JOB.replace("data/train.tfrecord", str(origin_project / "data" / "train.tfrecord"))
    (tmp_path / "job.yaml").write_text(job.replace(
        "    conn: ${DB_CONN}\n    port: ${DB_PORT}\n",
        '    url: "https://me:${DB_PW}@db.internal/x"\n    pin: ${DB_PIN}\n    note: "${DB_NOTE}"\n'))
    failed = _tpulaunch(tmp_path, "--debug", "train", "job.yaml", "--local",
                        DB_PW=EMBEDDED, DB_PIN=str(NUMBER), DB_NOTE=LINES)
    output = failed.stdout + failed.stderr
    assert failed.returncode == 1, output
    assert "cannot log in with *** and *** for ***" in output and "Traceback" in output
    record = tmp_path / "runs" / "origin" / "tpulaunch-runs.jsonl"
    assert "cannot log in with *** and *** for ***" in record.read_text()
    for value in (EMBEDDED, str(NUMBER), *LINES.splitlines()):
        assert value not in output
        assert _holding(tmp_path / "runs", value) == []


def test_explain_reads_a_var_with_a_default_and_a_var_that_tpulaunch_own_code_holds(origin_project, tmp_path):
    """`${VAR:-default}` (the default is the job file's text, in the program as the read's default) and a value
    that tpulaunch's own code printed after the program's banner also holds (`mean`) are read, not refused."""
    (tmp_path / "origin_models.py").write_text((origin_project / "origin_models.py").read_text())
    job = ORIGIN_JOB.replace("data/train.tfrecord", str(origin_project / "data" / "train.tfrecord"))
    (tmp_path / "job.yaml").write_text(job.replace(
        "    port: ${DB_PORT}\n", "    port: ${DB_PORT}\n    region: ${DB_REGION:-europe-west4}\n    how: ${DB_HOW}\n"))
    explained = _tpulaunch(tmp_path, "explain", "job.yaml", "--engine", "estimator", DB_HOW="mean")
    assert explained.returncode == 0, explained.stdout + explained.stderr
    assert "os.environ.get('DB_REGION', 'europe-west4')" in explained.stdout
    assert "'how': os.environ['DB_HOW']" in explained.stdout and CONN not in explained.stdout


def test_a_secret_inside_a_value_of_the_wrong_type_is_masked_before_the_value_is_cut_short(tmp_path):
    """`eval:` given a list holding a long `${VAR}`: the problem quotes the list masked, not its first 57
    characters (which the message's masking would no longer find)."""
    secret = "Sx-0123456789-abcdefghijklmnopqrstuvwxyz-ABCDEFGHIJKLMNOPQRSTUVWXYZ-9876"
    (tmp_path / "job.yaml").write_text(ORIGIN_JOB.replace("run: {", 'eval: ["${LONG_ONE}"]\nrun: {'))
    failed = _tpulaunch(tmp_path, "validate", "job.yaml", "--local", LONG_ONE=secret)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "eval: expected a mapping, got ['***']" in failed.stdout + failed.stderr
    assert secret[:12] not in failed.stdout + failed.stderr


def test_a_var_that_also_fills_a_data_path_is_shown_in_messages_about_the_path(tmp_path):
    """`${DATA_DIR}` in `data.train` (a place, shown) and in `model.params` (a secret there): the job copy masks the
    param, but a message about the data path still names the folder."""
    job = ORIGIN_JOB.replace("data/train.tfrecord", "${DATA_DIR}/missing-*.tfrecord").replace(
        "    conn: ${DB_CONN}\n", '    conn: "${DATA_DIR}"\n')
    (tmp_path / "job.yaml").write_text(job)
    failed = _tpulaunch(tmp_path, "validate", "job.yaml", "--local", DATA_DIR=str(tmp_path / "data"))
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert f"data.train: no files match '{tmp_path / 'data'}/missing-*.tfrecord'" in failed.stdout


def test_a_var_in_a_set_value_is_refused_not_given_to_the_job_as_written(tmp_path):
    """`--set 'model.params.api_key=${API_KEY}'` (quoted from the shell): --set values are not filled from the
    environment, so the builder would silently get the text `${API_KEY}`."""
    (tmp_path / "job.yaml").write_text(ORIGIN_JOB)
    refused = _tpulaunch(tmp_path, "validate", "job.yaml", "--set", "model.params.api_key=${API_KEY}",
                         API_KEY="tok-from-the-environment")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "model.params.api_key: the variable API_KEY would not be filled" in refused.stdout
    assert '--set model.params.api_key="$API_KEY"' in refused.stdout and "Traceback" not in refused.stderr


@pytest.mark.parametrize("given", ["flags.api_token=set-secret-0042",  # a path the job does not have
                                   "model.params.api_key=set-secret-0042: [x"])  # a value that is not YAML
def test_a_secret_set_that_cannot_be_applied_is_not_quoted(tmp_path, given):
    (tmp_path / "job.yaml").write_text(ORIGIN_JOB)
    refused = _tpulaunch(tmp_path, "validate", "job.yaml", "--set", given)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"--set {given.partition('=')[0]}=***" in (refused.stdout + refused.stderr).replace("'", "")
    assert "set-secret-0042" not in refused.stdout + refused.stderr
