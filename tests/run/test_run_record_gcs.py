"""The run record appended to a gs:// model_dir through the store (google-cloud-storage against fake-gcs-server)."""

import os

import pytest

from gcs_fake import free_port
from lease_runs import fake_gcs_server
from tpulaunch import store
from tpulaunch.engine.core.records import append_record, record_lines
from tpulaunch.run.record import RECORD_FILE, TORN_SUFFIX, read_records, record_line


@pytest.fixture(scope="module")
def bucket():
    """fake-gcs-server with the bucket `records`, reached by this process's store for the module."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    with fake_gcs_server(free_port()) as url:
        saved = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = url
        try:
            storage.Client(project="test", credentials=AnonymousCredentials()).create_bucket("records")
            yield "gs://records"
        finally:
            if saved is None:
                os.environ.pop("STORAGE_EMULATOR_HOST", None)
            else:
                os.environ["STORAGE_EMULATOR_HOST"] = saved


def test_each_run_appends_one_line_to_a_gs_model_dir(bucket):
    model_dir = f"{bucket}/cnn"
    store.write(f"{model_dir}/tpulaunch-job.yaml", b"name: cnn\n")  # as `train` writes first
    assert record_lines(model_dir) == []  # nothing recorded yet: no file
    first = append_record(model_dir, record_line({"command": "train", "steps": {"from": 0, "to": 6}}))
    append_record(model_dir, record_line({"command": "resume", "steps": {"from": 6, "to": 8}}))

    assert first == f"{model_dir}/{RECORD_FILE}"
    assert [r["command"] for r in read_records(record_lines(model_dir))] == ["train", "resume"]


def test_a_torn_last_line_on_gs_is_set_apart_before_the_next_append(bucket):
    """Cloud Storage has no append: the object is rewritten whole, its whole lines and the new one in one upload;
    a torn tail (written by a crash elsewhere) goes to tpulaunch-runs.jsonl.torn first."""
    model_dir = f"{bucket}/torn"
    torn = '{"command": "train", "outc'
    store.write(f"{model_dir}/{RECORD_FILE}",
                (record_line({"command": "train", "steps": {"from": 0, "to": 6}}) + torn).encode())

    append_record(model_dir, record_line({"command": "resume", "steps": {"from": 6, "to": 8}}))

    lines = record_lines(model_dir)
    assert [r["command"] for r in read_records(lines)] == ["train", "resume"] and len(lines) == 2
    assert store.read(f"{model_dir}/{RECORD_FILE}{TORN_SUFFIX}").data == (torn + "\n").encode()


def test_appends_at_once_to_a_gs_record_all_land(bucket):
    """Each upload is conditional on the generation it read: one refused reads again, so no line is lost."""
    import threading

    model_dir = f"{bucket}/race"
    barrier = threading.Barrier(4)

    def append(index):
        barrier.wait()
        append_record(model_dir, record_line({"command": "train", "run_id": f"run-{index}"}))

    threads = [threading.Thread(target=append, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r["run_id"] for r in read_records(record_lines(model_dir))) == [f"run-{i}" for i in range(4)]
