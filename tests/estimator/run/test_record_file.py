"""The run record is whole lines or nothing: a torn last line (a crash or a full disk mid-append) is set apart
before the next append, a failed write leaves nothing of its record, and every reader skips a torn line with a
message. Real `train` and `status` runs on a local model_dir; gs:// is in test_run_record_gcs.py."""

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from paths import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))

import interrupts  # noqa: E402

from tpulaunch.cli.app import cli  # noqa: E402
from tpulaunch.engine.core.records import append_record, record_lines  # noqa: E402
from tpulaunch.run.record import RECORD_FILE, TORN_SUFFIX, read_records, record_line  # noqa: E402

ENV = {"NO_COLOR": "1", "CI": "1", "COLUMNS": "200"}
OLD = [{"command": "train", "outcome": "done", "steps": {"from": 0, "to": 5}, "end": "2026-01-01T00:00:00.000Z"},
       {"command": "resume", "outcome": "done", "steps": {"from": 5, "to": 8}, "end": "2026-01-01T00:01:00.000Z"}]
TORN = '{"command": "train", "outcome": "stopped (SIG'  # a record cut short mid-write


def torn_record_file(model_dir) -> None:
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, RECORD_FILE), "w") as handle:
        handle.write("".join(record_line(r) for r in OLD) + TORN)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("records")
    return str(root), interrupts.write_project(str(root), steps=4, every=2)


def test_a_train_appends_after_a_torn_line_and_every_record_reads_back(project):
    root, job = project
    model_dir = os.path.join(root, "runs", "torn")
    torn_record_file(model_dir)

    result = CliRunner().invoke(cli, ["train", job, "--local", "--model-dir", model_dir], env=ENV)
    assert result.exit_code == 0, result.output

    with open(os.path.join(model_dir, RECORD_FILE)) as handle:
        text = handle.read()
    assert text.endswith("\n")
    records = [json.loads(line) for line in text.splitlines()]  # every line a whole record: jq reads it too
    assert records[:2] == OLD
    assert [(r["command"], r["outcome"], r["steps"]["to"]) for r in records[2:]] == [("train", "done", 4)]
    with open(os.path.join(model_dir, RECORD_FILE + TORN_SUFFIX)) as handle:
        assert handle.read() == TORN + "\n"  # set apart, not lost


def test_status_skips_a_torn_line_with_a_message(project):
    root, job = project
    model_dir = os.path.join(root, "runs", "status")
    torn_record_file(model_dir)

    result = CliRunner().invoke(cli, ["status", job, "--set", f"run.model_dir={model_dir}"], env=ENV)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert f"{model_dir}/{RECORD_FILE}: skipped 1 line (3) that is not a whole record" in result.stderr
    assert "last run: resume done, step 5 to 8, ended 2026-01-01T00:01:00.000Z" in result.stdout

    result = CliRunner().invoke(cli, ["status", job, "--set", f"run.model_dir={model_dir}", "--format", "json"],
                                env=ENV)
    assert result.exit_code == 0, result.output
    last_run = json.loads(result.stdout)["last_run"]
    assert (last_run["state"], last_run["records"], last_run["skipped"]) == ("recorded", 2, [3])
    assert last_run["record"] == OLD[-1]


def test_readers_skip_what_is_not_a_record():
    skipped = []
    lines = [record_line(OLD[0]).rstrip("\n"), "", TORN, "[1, 2]", record_line(OLD[1]).rstrip("\n")]
    assert read_records(lines, on_skipped=lambda number, why: skipped.append(number)) == OLD
    assert skipped == [3, 4]


@pytest.fixture
def full_disk(tmp_path):
    """A 16 KiB tmpfs filled to its last bytes (the machines this suite runs on run it as root, allowed to mount)."""
    mount_point = tmp_path / "full"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.fail("mounting a small tmpfs needs root: a real full disk cannot be made here")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.fail(f"this machine refuses to mount a tmpfs ({mounted.stderr.strip()}): no real full disk here")
    try:
        yield str(mount_point)
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_a_record_that_does_not_fit_leaves_nothing_of_itself(full_disk):
    """On a real full disk (ENOSPC): the append fails, and the file still ends with its last whole record."""
    model_dir = os.path.join(full_disk, "run")
    append_record(model_dir, record_line(OLD[0]))
    filler = os.open(os.path.join(full_disk, "filler"), os.O_WRONLY | os.O_CREAT)  # every block the file does not hold
    with pytest.raises(OSError):
        while True:
            os.write(filler, b"x" * 512)
    os.close(filler)
    big = dict(OLD[1], events=["x" * 64] * 200)  # larger than any free bytes left
    with pytest.raises(OSError) as failed:
        append_record(model_dir, record_line(big))
    assert failed.value.errno == 28
    assert read_records(record_lines(model_dir)) == [OLD[0]]
    with open(os.path.join(model_dir, RECORD_FILE)) as handle:
        assert handle.read() == record_line(OLD[0])


def test_data_bench_compares_with_the_whole_records_of_a_torn_file(project):
    root, job = project
    model_dir = os.path.join(root, "runs", "bench")
    torn_record_file(model_dir)
    with open(os.path.join(model_dir, RECORD_FILE), "a") as handle:  # a whole record after the torn one
        handle.write("\n" + record_line(dict(OLD[1], steady_examples_per_s=500.0)) + TORN)

    result = CliRunner().invoke(cli, ["data", "bench", job, "--local", "--seconds", "1", "--format", "json",
                                      "--set", f"run.model_dir={model_dir}"], env=ENV)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["training"]["needed_examples_per_s"] == 500.0
    assert f"{model_dir}/{RECORD_FILE}: skipped 2 lines (3, 5) that are not a whole record" in result.stderr
