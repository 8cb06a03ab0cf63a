"""Damaged TFRecords (written by TensorFlow, then broken): validate names each file, training stops or skips.

benchmarks/corrupt_data.py runs the same damage at volume (seeded); here every kind once.
"""

import os
import random
import sys

import pytest

from paths import BENCHMARKS  # noqa: E402

sys.path.insert(0, str(BENCHMARKS))

import corrupt_data  # noqa: E402

from tpulaunch.engine import pipeline as data  # noqa: E402
from tpulaunch.errors import TpuLaunchError  # noqa: E402
from tpulaunch.job.load import load_job  # noqa: E402
from tpulaunch.checks.validate import validate_job  # noqa: E402


@pytest.fixture(scope="module")
def damaged_shards(tmp_path_factory):
    """One job whose train data is a clean shard plus one shard per kind of damage."""
    root = tmp_path_factory.mktemp("corrupt")
    job, _, _ = corrupt_data.make_case(str(root), "crc", random.Random(0), skip=False)
    rng = random.Random(1)
    shards = {}
    for kind in corrupt_data.KINDS:
        path = str(root / f"{kind}.tfrecord")
        shards[kind] = (path, corrupt_data.damage(kind, path, rng))
    text = open(job).read().replace("train: [clean.tfrecord, damaged.tfrecord]",
                                    f"train: [clean.tfrecord, {', '.join(k + '.tfrecord' for k in corrupt_data.KINDS)}]")
    with open(job, "w") as handle:
        handle.write(text)
    return job, shards


def test_validate_names_every_damaged_file_and_record(damaged_shards):
    job, shards = damaged_shards
    result = validate_job(job, all_records=True, records_per_file=corrupt_data.RECORDS)
    messages = {p.message: p for p in result.problems}

    def named(kind):
        path, bad = shards[kind]
        return [p for p in result.problems if p.message.startswith(f"{path}:") or p.message.startswith(f"{path} ")]

    for kind in ("truncated", "crc", "huge_length"):
        path, bad = shards[kind]
        (problem,) = named(kind)
        assert problem.code in corrupt_data.VALIDATE_CODES[kind], problem
        assert problem.message.startswith(f"{path}: record {bad} is ") and " at byte " in problem.message, problem
        assert (problem.severity, problem.path, problem.line) == ("error", "data.train", 5)
    (empty,) = named("empty_file")
    assert (empty.severity, empty.code, empty.message) == ("warning", "empty-file", f"{shards['empty_file'][0]} is empty (0 bytes)")
    # Record-level damage: one problem per kind of mistake, at the spec it contradicts, naming file and record.
    for kind in ("wrong_kind", "short_array", "long_array", "missing_key", "huge_record", "not_example"):
        path, bad = shards[kind]
        found = [p for p in named(kind) if p.code in corrupt_data.VALIDATE_CODES[kind]]
        assert found or any(p.code in corrupt_data.VALIDATE_CODES[kind] and "more record" in p.message
                            for p in messages.values()), kind
        for p in found:
            assert p.message.startswith(f"{path}: record {bad}"), p
    assert not result.ok


@pytest.mark.parametrize("kind", ["crc", "truncated", "wrong_kind", "not_example"])
def test_training_input_stops_with_the_file_named(tmp_path, kind):
    job, damaged, bad = corrupt_data.make_case(str(tmp_path), kind, random.Random(3), skip=False)
    loaded = load_job(job)
    dataset_fn = data.make_dataset_fn(loaded.job, "train", use_tpu=False)
    with pytest.raises(TpuLaunchError) as error:
        with data.naming_read_errors(loaded.job, "train"):
            for _ in dataset_fn(1).take(100):
                pass
    assert error.value.message.startswith(f"data.train: {damaged}: record {bad} cannot be read: "), error.value.message
    assert "skip_corrupt" in error.value.hint


@pytest.mark.parametrize("kind", ["crc", "huge_length", "short_array", "not_example"])
def test_skip_corrupt_keeps_every_clean_record(tmp_path, kind):
    job, damaged, bad = corrupt_data.make_case(str(tmp_path), kind, random.Random(4), skip=True)
    outcome, failures = corrupt_data.check_pipeline(job, damaged, kind, skip=True)
    assert (outcome, failures) == ("skipped", [])


def test_errors_no_data_file_explains_pass_through(tmp_path):
    """A model's own InvalidArgumentError is not blamed on the (clean) data."""
    import tensorflow as tf

    job, _, _ = corrupt_data.make_case(str(tmp_path), "empty_file", random.Random(5), skip=False)
    loaded = load_job(job)
    with pytest.raises(tf.errors.InvalidArgumentError):
        with data.naming_read_errors(loaded.job, "train"):
            tf.reshape(tf.zeros([3]), [2])


def test_a_cut_inside_a_record_header_is_found_by_validate(tmp_path):
    """TensorFlow reads such a file as complete (records silently missing): only validate can tell."""
    job, damaged, _ = corrupt_data.make_case(str(tmp_path), "empty_file", random.Random(6), skip=False)
    offsets = corrupt_data.write_records(damaged, corrupt_data.clean_records(100.0))
    with open(damaged, "r+b") as handle:
        handle.truncate(offsets[4] + 5)
    result = validate_job(job, all_records=True)
    message = f"{damaged}: record 4 is truncated at byte {offsets[4]} (5 bytes after the last complete record)"
    assert [(p.severity, p.code, p.path, p.message) for p in result.problems if p.code.startswith("record-")] == [
        ("error", "record-truncated", "data.train", message), ("error", "record-truncated", "data.eval", message)]
