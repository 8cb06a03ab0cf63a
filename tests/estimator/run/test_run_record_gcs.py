"""The run record appended to a gs:// model_dir through TensorFlow's own filesystem (the local GCS of gcs_fake)."""

import pytest


# Every test here requests `gcs`, so the environment is set before this process's first gs:// call.


def test_each_run_appends_one_line_to_a_gs_model_dir(gcs):
    from tpulaunch.engine.core.records import append_record, record_lines
    from tpulaunch.run.record import RECORD_FILE, read_records, record_line

    import tensorflow as tf

    model_dir = gcs.url(gcs.make_bucket("runs"), "cnn")
    with tf.io.gfile.GFile(f"{model_dir}/tpulaunch-job.yaml", "w") as handle:  # as `train` writes first
        handle.write("name: cnn\n")
    assert record_lines(model_dir) == []  # nothing recorded yet: no file
    first = append_record(model_dir, record_line({"command": "train", "steps": {"from": 0, "to": 6}}))
    append_record(model_dir, record_line({"command": "resume", "steps": {"from": 6, "to": 8}}))

    assert first == f"{model_dir}/{RECORD_FILE}"
    assert [r["command"] for r in read_records(record_lines(model_dir))] == ["train", "resume"]


def test_a_torn_last_line_on_gs_is_set_apart_before_the_next_append(gcs):
    """Cloud Storage has no append: the object is rewritten whole, its whole lines and the new one in one upload;
    a torn tail (written by a crash elsewhere) goes to tpulaunch-runs.jsonl.torn first."""
    from tpulaunch.engine.core.records import append_record, record_lines
    from tpulaunch.run.record import RECORD_FILE, TORN_SUFFIX, read_records, record_line

    import tensorflow as tf

    model_dir = gcs.url(gcs.make_bucket("torn"), "cnn")
    torn = '{"command": "train", "outc'
    with tf.io.gfile.GFile(f"{model_dir}/{RECORD_FILE}", "w") as handle:
        handle.write(record_line({"command": "train", "steps": {"from": 0, "to": 6}}) + torn)

    append_record(model_dir, record_line({"command": "resume", "steps": {"from": 6, "to": 8}}))

    lines = record_lines(model_dir)
    assert [r["command"] for r in read_records(lines)] == ["train", "resume"] and len(lines) == 2
    with tf.io.gfile.GFile(f"{model_dir}/{RECORD_FILE}{TORN_SUFFIX}") as handle:
        assert handle.read() == torn + "\n"
