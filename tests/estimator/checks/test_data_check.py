"""The data dry run on real TFRecord files written by TensorFlow: every mistake named, with its place."""

import os
import textwrap

import numpy as np
import tensorflow as tf

import records

from tpulaunch.checks.validate import validate_job


def example(**features) -> bytes:
    return records.example(features)


def write(path, records, compression=None):
    with tf.io.TFRecordWriter(str(path), options=compression) as writer:
        for record in records:
            writer.write(record)
    return str(path)


def good_records(n, *, volume=(4, 4, 4)):
    rng = np.random.default_rng(0)
    return [example(image=rng.random(volume, dtype=np.float32).tobytes(),
                    label=np.int64(i % 3)) for i in range(n)]


JOB = """\
name: dry-run
model: {{builder: tpulaunch.models.cnn:build}}
data:
  train: {train}
  eval: {eval}
  features:
    image: {{shape: [4, 4, 4], dtype: float32, encoding: raw}}
  labels:
    label: {{shape: [], dtype: int64}}
  skip_corrupt: {skip}
train: {{batch_size: 4, steps: 10}}
eval: {{batch_size: 4, steps: 2}}
run: {{model_dir: runs/x}}
"""


def job(tmp_path, train="data/train-*.tfrecord", eval="data/eval-*.tfrecord", skip="false"):
    path = tmp_path / "job.yaml"
    path.write_text(JOB.format(train=train, eval=eval, skip=skip))
    (tmp_path / "data").mkdir(exist_ok=True)
    return str(path)


def problems(path, **kwargs):
    result = validate_job(path, **kwargs)
    # the model check is not under test here
    return [(p.severity, p.code, p.path, p.line, p.message) for p in result.problems if p.code not in ("model-input-shape",)], result


def test_clean_data_counts_and_steps(tmp_path):
    path = job(tmp_path)
    for i in range(2):
        write(tmp_path / f"data/train-{i}.tfrecord", good_records(10))
    write(tmp_path / "data/eval-0.tfrecord", good_records(8))
    found, result = problems(path, all_records=True)
    assert [f for f in found if f[0] == "error"] == []
    train, ev = result.data_reports
    assert (train.split, train.files, train.records_counted, train.steps_per_epoch) == ("train", 2, 20, 5)
    assert (ev.records_counted, ev.steps_per_epoch) == (8, 2)
    sampled, _ = problems(path)  # sampling estimates the count from file sizes
    assert validate_job(path).data_reports[0].records_estimated == 20


def test_glob_without_files_is_located_at_its_line(tmp_path):
    path = job(tmp_path, train="data/trian-*.tfrecord")
    write(tmp_path / "data/eval-0.tfrecord", good_records(8))
    found, _ = problems(path)
    assert ("error", "no-files", "data.train", 4, f"no files match '{tmp_path}/data/trian-*.tfrecord'") in found


def test_list_entries_are_located_individually(tmp_path):
    path = job(tmp_path, train="[data/train-0.tfrecord, data/missing.tfrecord]")
    write(tmp_path / "data/train-0.tfrecord", good_records(8))
    write(tmp_path / "data/eval-0.tfrecord", good_records(8))
    found, _ = problems(path)
    assert [(f[1], f[2]) for f in found if f[0] == "error"] == [("no-files", "data.train[1]")]


def test_records_that_disagree_with_the_spec(tmp_path):
    path = job(tmp_path)
    rng = np.random.default_rng(1)
    write(tmp_path / "data/train-0.tfrecord", [
        example(image=rng.random((4, 4, 4)).astype(np.float64).tobytes(), label=np.int64(1)),  # float64 bytes
        example(image=rng.random((4, 4, 4)).astype(np.float64).tobytes(), label=np.int64(1)),
    ])
    write(tmp_path / "data/eval-0.tfrecord", [example(image=rng.random((4, 4, 4), dtype=np.float32).tobytes(),
                                                      label=np.array([1.0, 2.0], np.float32))] * 4)
    found, _ = problems(path)
    train_file = f"{tmp_path}/data/train-0.tfrecord"
    eval_file = f"{tmp_path}/data/eval-0.tfrecord"
    assert ("error", "record-wrong-length", "data.features.image", 7,
            f"{train_file}: record 0: 'image' has 512 bytes, but [4, 4, 4] x float32 is 256 (and 1 more record like it)") in found
    assert ("error", "record-wrong-kind", "data.labels.label", 9,
            f"{eval_file}: record 0: 'label' is stored as float_list, but encoding int64_list reads int64_list (and 1 more record like it)") in found


def test_missing_key_names_what_the_record_has(tmp_path):
    path = job(tmp_path)
    write(tmp_path / "data/train-0.tfrecord", [example(img=b"x" * 256, label=np.int64(0))] * 4)
    write(tmp_path / "data/eval-0.tfrecord", good_records(8))
    found, _ = problems(path)
    [missing] = [f for f in found if f[1] == "record-missing-key"]
    assert missing[2] == "data.features.image"
    assert missing[4].endswith("record 0: no feature 'image' (the record has: img, label) (and 1 more record like it)")


def _corrupt(path, offset):
    data = bytearray(open(path, "rb").read())
    data[offset] ^= 0xFF
    open(path, "wb").write(bytes(data))


def test_corrupt_and_truncated_records_named_with_byte_offset(tmp_path):
    path = job(tmp_path)
    bad = write(tmp_path / "data/train-0.tfrecord", good_records(4))
    size = os.path.getsize(bad)
    record = size // 4
    _corrupt(bad, record + 40)  # inside record 1's payload: its data CRC fails
    short = write(tmp_path / "data/train-1.tfrecord", good_records(4))
    with open(short, "r+b") as handle:
        handle.truncate(size - 10)
    write(tmp_path / "data/eval-0.tfrecord", good_records(8))
    found, result = problems(path, all_records=True)
    errors = sorted((f[1], f[4]) for f in found if f[0] == "error")
    assert errors == [
        # TensorFlow's offsets: the payload (after the 12-byte length header) for a bad data CRC,
        # the record's start when the file ends inside it
        ("record-corrupt", f"{bad}: record 1 is corrupt at byte {record + 12}"),
        ("record-truncated", f"{short}: record 3 is truncated at byte {3 * record}"),
    ]
    assert result.data_reports[0].corrupt_records == 2


def test_skip_corrupt_turns_corruption_into_a_warning(tmp_path):
    path = job(tmp_path, skip="true")
    bad = write(tmp_path / "data/train-0.tfrecord", good_records(4))
    _corrupt(bad, os.path.getsize(bad) // 4 + 40)
    write(tmp_path / "data/train-1.tfrecord", good_records(8))
    write(tmp_path / "data/eval-0.tfrecord", good_records(8))
    found, result = problems(path, all_records=True)
    assert [(f[0], f[1]) for f in found if f[1].startswith("record-")] == [("warning", "record-corrupt")]
    assert result.ok


def test_compressed_files_without_compression_declared(tmp_path):
    path = job(tmp_path)
    write(tmp_path / "data/train-0.tfrecord", good_records(8), compression="GZIP")
    write(tmp_path / "data/eval-0.tfrecord", good_records(8))
    result = validate_job(path)
    [problem] = [p for p in result.problems if p.code.startswith("record-")]
    assert problem.hint == "the file is GZIP-compressed: set data.compression: GZIP"


def test_split_smaller_than_one_batch(tmp_path):
    path = job(tmp_path)
    write(tmp_path / "data/train-0.tfrecord", good_records(8))
    write(tmp_path / "data/eval-0.tfrecord", good_records(3))
    found, _ = problems(path, all_records=True)
    assert [(f[1], f[2], f[3]) for f in found if f[0] == "error"] == [("split-smaller-than-batch", "eval.batch_size", 12)]


def test_png_images_checked_against_declared_size(tmp_path):
    png = tf.io.encode_png(np.zeros((6, 5, 3), np.uint8)).numpy()
    (tmp_path / "data").mkdir()
    write(tmp_path / "data/train-0.tfrecord", [example(image=png, label=np.int64(0))] * 4)
    path = tmp_path / "job.yaml"
    path.write_text(textwrap.dedent("""\
        name: png
        model: {builder: tpulaunch.models.cnn:build}
        data:
          train: data/train-*.tfrecord
          features: {image: {shape: [8, 8, 3], dtype: uint8, encoding: png}}
          labels: {label: {shape: [], dtype: int64}}
        train: {batch_size: 2, steps: 10}
        run: {model_dir: runs/x}
        """))
    result = validate_job(str(path))
    [problem] = [p for p in result.problems if p.code.startswith("record-")]
    assert (problem.code, problem.path) == ("record-wrong-shape", "data.features.image")
    assert "record 0: 'image' is a 6x5 image but the declared shape is [8, 8, 3]" in problem.message


def test_a_directory_among_the_matches_is_named(tmp_path):
    path = job(tmp_path, train="data/train-*")
    write(tmp_path / "data/train-0.tfrecord", good_records(8))
    (tmp_path / "data/train-dir").mkdir()
    write(tmp_path / "data/eval-0.tfrecord", good_records(8))
    found, _ = problems(path)
    assert [(f[1], f[2], f[4]) for f in found if f[0] == "error"] == [
        ("data-is-directory", "data.train",
         f"{tmp_path}/data/train-dir is a directory, not a TFRecord file: a directory holds files, it is not one")]


def test_a_fifo_and_a_socket_among_the_matches_are_refused_at_their_key_never_opened(tmp_path):
    """A FIFO nobody writes would hold the dry run forever (it was reported as an empty file once opened); a
    socket cannot be read. Each is refused at the key whose pattern matched it, with the fix."""
    import socket

    path = job(tmp_path, train="data/train-*")
    write(tmp_path / "data/train-0.tfrecord", good_records(8))
    os.mkfifo(tmp_path / "data/train-fifo")
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(tmp_path / "data/train-socket"))
    write(tmp_path / "data/eval-0.tfrecord", good_records(8))
    try:
        found, _ = problems(path)
    finally:
        listening.close()
    assert [(f[1], f[2], f[4]) for f in found if f[0] == "error"] == [
        ("data-not-a-file", "data.train", f"{tmp_path}/data/train-fifo is a FIFO (named pipe), not a TFRecord file: "
                                          "reading it waits, without end, for something to write into it"),
        ("data-not-a-file", "data.train", f"{tmp_path}/data/train-socket is a socket, not a TFRecord file: it cannot "
                                          "be read as a file")]
