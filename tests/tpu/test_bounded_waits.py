"""Every read of the TPU API answers within a stated time when what it asks cannot be reached, saying what it could
not reach: a closed port, and the local TPU API server answering too late (the store's reads are bounded the same
way: tests/store/). $TPULAUNCH_TPU_API_REACH_S is the bound (30 s by default); `--wait` is for waiting on purpose."""

import textwrap
import time

from click.testing import CliRunner

from gcs_fake import free_port
from tpulaunch.cli.app import cli
from tpulaunch.errors import ExitCode

JOB = textwrap.dedent("""\
    name: bounded
    model: {builder: tpulaunch.models.cnn:build}
    data:
      train: /data/train-*.tfrecord
      features: {image: {shape: [32, 32, 3]}}
      labels: {label: {shape: [], dtype: int64}}
    tpu: {name: my-tpu, zone: us-central1-a, project: test-project, type: v3-8}
    train: {batch_size: 64, steps: 10}
    run: {model_dir: MODEL_DIR}
    """)


def status(tmp_path, *args):
    job = tmp_path / "job.yaml"
    job.write_text(JOB.replace("MODEL_DIR", str(tmp_path / "run")))
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["status", str(job), *args], env={"NO_COLOR": "1", "COLUMNS": "200"})
    return result, time.monotonic() - started


def test_status_answers_within_the_bound_when_the_api_port_is_closed(tpu_api, tmp_path, monkeypatch):
    monkeypatch.setenv("TPULAUNCH_TPU_API_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("TPULAUNCH_TPU_API_REACH_S", "2")
    result, took = status(tmp_path)
    assert result.exit_code == ExitCode.CLUSTER, result.output
    assert took < 6, took  # 2 s of tries, not 4 tries of up to 20 s each
    assert ("error: could not read TPU node 'my-tpu' (projects/test-project/locations/us-central1-a/nodes/my-tpu) "
            "within 2 s (") in result.stderr, result.stderr
    assert "cannot connect to the TPU API" in result.stderr and "TPULAUNCH_TPU_API_REACH_S" in result.stderr
    assert "Traceback" not in result.output


def test_status_answers_within_the_bound_when_the_api_answers_too_late(tpu_api, tmp_path, monkeypatch):
    monkeypatch.setenv("TPULAUNCH_TPU_API_ENDPOINT", tpu_api.endpoint)
    monkeypatch.setenv("TPULAUNCH_TPU_API_REACH_S", "1.5")
    tpu_api.set_node("my-tpu")
    tpu_api.delay_next(100, 6.0)
    result, took = status(tmp_path)
    assert result.exit_code == ExitCode.CLUSTER, result.output
    assert took < 5, took
    assert "within 1.5 s (1 try): the TPU API did not answer in time" in result.stderr, result.stderr

    tpu_api.clear_faults()  # reachable again: the same command answers
    result, _ = status(tmp_path)
    assert result.exit_code == 0, result.output
    assert "TPU node my-tpu: usable" in result.stdout


def test_a_bound_that_is_not_a_number_of_seconds(tpu_api, tmp_path, monkeypatch):
    monkeypatch.setenv("TPULAUNCH_TPU_API_ENDPOINT", tpu_api.endpoint)
    monkeypatch.setenv("TPULAUNCH_TPU_API_REACH_S", "soon")
    result, _ = status(tmp_path)
    assert result.exit_code == 1
    assert "$TPULAUNCH_TPU_API_REACH_S='soon' is not a number of seconds above 0" in result.stderr
