"""A write refused for want of space or permission says so, with its errno and path, on the CLI's every way out:
never TensorFlow's out-of-memory hint, never a traceback, exit code 1. The full disk during a checkpoint is in
test_faults.py (estimator) and keras_engine/test_keras_disk_errors.py (keras)."""

import os
import sys

import pytest
from click.testing import CliRunner

from paths import BENCHMARKS
from small_disks import read_only_dir

sys.path.insert(0, str(BENCHMARKS))

import interrupts  # noqa: E402

from tpulaunch.cli.app import cli  # noqa: E402

ENV = {"NO_COLOR": "1", "CI": "1", "COLUMNS": "200"}
SAID = {"EROFS": "read-only file system", "EACCES": "permission denied"}


def assert_named(result, errno_name: str, path: str):
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "unexpected" not in result.output, result.output
    assert f"{SAID[errno_name]} ({errno_name}): {path}" in result.output, result.output


def test_a_program_written_where_nothing_can_be_written(tmp_path):
    """`explain -o` into a read-only directory: the errno and the file, exit 1 (no TensorFlow involved)."""
    job = interrupts.write_project(str(tmp_path / "project"), steps=4, every=2)
    with read_only_dir(tmp_path / "read-only") as (directory, errno_name):
        program = os.path.join(directory, "program.py")
        result = CliRunner().invoke(cli, ["explain", job, "-o", program], env=ENV)
        assert_named(result, errno_name, program)
        assert not os.path.exists(program)


def test_a_run_into_a_read_only_model_dir(tmp_path):
    """`train` into a read-only model_dir stops before TensorFlow with the path and why; nothing is left."""
    job = interrupts.write_project(str(tmp_path / "project"), steps=4, every=2)
    with read_only_dir(tmp_path / "read-only") as (directory, errno_name):
        model_dir = os.path.join(directory, "run")
        result = CliRunner().invoke(cli, ["train", job, "--local", "--model-dir", model_dir], env=ENV)
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.output and "unexpected" not in result.output, result.output
        assert model_dir in result.output and SAID[errno_name] in result.output.lower(), result.output
        assert os.listdir(directory) == []


def test_a_job_copy_that_does_not_fit_leaves_the_previous_one(tmp_path):
    """On a real full disk the job copy is not half-written (a resume would read half a job as another model)
    and its temporary file is gone."""
    from small_disks import tmpfs
    from tpulaunch.engine.core.model_dir import JOB_COPY, model_dir_errors, write_job_copy
    from tpulaunch.errors import TpuLaunchError
    from tpulaunch.job.load import load_job

    job = interrupts.write_project(str(tmp_path / "project"), steps=4, every=2)
    loaded = load_job(job)
    with tmpfs(tmp_path / "disk", size="16k") as disk:
        model_dir = os.path.join(disk, "run")
        write_job_copy(loaded.job, model_dir)
        with open(os.path.join(model_dir, JOB_COPY)) as handle:
            before = handle.read()
        filler = os.open(os.path.join(disk, "filler"), os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(filler, b"x" * 512)
        except OSError:
            pass
        finally:
            os.close(filler)
        bigger = loaded.job.model_copy(update={"name": "y" * 100})  # same model and data: a resume's copy
        with pytest.raises(TpuLaunchError) as failed, model_dir_errors(model_dir):
            write_job_copy(bigger, model_dir)
        assert "no space left on device (ENOSPC)" in failed.value.message
        assert sorted(os.listdir(model_dir)) == [JOB_COPY]
        with open(os.path.join(model_dir, JOB_COPY)) as handle:
            assert handle.read() == before
