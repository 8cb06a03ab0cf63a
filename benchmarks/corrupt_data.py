"""Corrupt TFRecord shards, then check that `validate` names each and that training stops or skips cleanly.

Each case writes two shards with TensorFlow's own TFRecordWriter, a clean one and one damaged in one
way (seeded): truncated, a flipped byte (CRC), a record length that claims gigabytes, wrong feature
kinds, short or long arrays, a missing key, a payload that is not a tf.train.Example, an empty
file, a huge record. Then:

- `validate_job(..., all_records=True, records_per_file=6)` (`validate --all-records --records 6`:
  framing is checked over whole files, contents on the first N records of each) reports a problem
  whose message names the damaged file and the record (and the byte offset, for framing damage); an
  empty file is a warning naming it;
- the input pipeline (`data.make_dataset_fn`, iterated eagerly) either raises a TpuLaunchError naming
  the file (inside `data.naming_read_errors`), or, with `data.skip_corrupt: true`, yields every record
  of the clean shard and ends without an error.

Run: .venv/bin/python benchmarks/corrupt_data.py [--cases 200] [--seed 0]
Prints counts per kind of damage and exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import re
import sys
import tempfile
import textwrap
import time
import traceback
from typing import List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

RECORDS = 6  # per shard
KINDS = ("truncated", "crc", "huge_length", "wrong_kind", "short_array", "long_array", "missing_key",
         "not_example", "empty_file", "huge_record")
# What validate calls each kind of damage.
VALIDATE_CODES = {
    "truncated": {"record-truncated", "record-corrupt"}, "crc": {"record-corrupt"},
    "huge_length": {"record-corrupt", "record-truncated"}, "wrong_kind": {"record-wrong-kind"},
    "short_array": {"record-wrong-length"}, "long_array": {"record-wrong-length"},
    "missing_key": {"record-missing-key"}, "not_example": {"record-not-example", "record-missing-key"},
    "empty_file": {"empty-file"}, "huge_record": {"record-wrong-length"},
}

BUILDER = textwrap.dedent('''
    import tensorflow as tf

    def build(**unused):
        x = tf.keras.Input(shape=(4,), name="x")
        return tf.keras.Model(x, tf.keras.layers.Dense(2)(x))
''')

JOB = textwrap.dedent('''
    name: corrupt
    model: {builder: "tiny_builder:build"}
    data:
      train: [clean.tfrecord, damaged.tfrecord]
      eval: [clean.tfrecord, damaged.tfrecord]
      features: {x: {shape: [4]}}
      labels: {y: {shape: [], dtype: int64}}
      shuffle_buffer: 0
      skip_corrupt: SKIP
    train: {batch_size: 1, steps: 10}
    eval: {batch_size: 1, steps: 1}
    run: {model_dir: runs}
''')


def example(x, y=1, **extra) -> bytes:
    import tensorflow as tf

    feature = {"y": tf.train.Feature(int64_list=tf.train.Int64List(value=[y]))}
    if x is not None:
        feature["x"] = x if isinstance(x, tf.train.Feature) else tf.train.Feature(float_list=tf.train.FloatList(value=x))
    feature.update(extra)
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_records(path: str, records: List[bytes]) -> List[int]:
    """Write with TensorFlow's writer; returns each record's starting byte offset."""
    import tensorflow as tf

    offsets, at = [], 0
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
            offsets.append(at)
            at += 16 + len(record)
    return offsets


def clean_records(first: float) -> List[bytes]:
    return [example([first + i] * 4, y=i % 2) for i in range(RECORDS)]


def damage(kind: str, path: str, rng: random.Random) -> int:
    """Write the damaged shard at `path`; returns the index of the first bad record."""
    import tensorflow as tf

    records = clean_records(100.0)
    bad = rng.randrange(RECORDS)
    if kind in ("wrong_kind", "short_array", "long_array", "missing_key", "not_example", "huge_record"):
        records[bad] = {
            "wrong_kind": lambda: example(tf.train.Feature(int64_list=tf.train.Int64List(value=[1, 2, 3, 4]))),
            "short_array": lambda: example([1.0] * rng.randint(0, 3)),
            "long_array": lambda: example([1.0] * rng.randint(5, 64)),
            "missing_key": lambda: example(None),
            "not_example": lambda: bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64))),
            "huge_record": lambda: example([0.5] * (1 << 20)),  # 4 MiB of floats where 4 are declared
        }[kind]()
        write_records(path, records)
        return bad
    if kind == "empty_file":
        open(path, "wb").close()
        return 0
    offsets = write_records(path, records)
    raw = bytearray(open(path, "rb").read())
    start = offsets[bad]
    end = offsets[bad + 1] if bad + 1 < RECORDS else len(raw)
    if kind == "truncated":
        raw = raw[: rng.randrange(start + 1, end)]
    elif kind == "crc":
        i = rng.randrange(start, end)
        raw[i] ^= rng.randrange(1, 256)
    elif kind == "huge_length":
        raw[start:start + 8] = (rng.randrange(1 << 32, 1 << 40)).to_bytes(8, "little")
    with open(path, "wb") as handle:
        handle.write(bytes(raw))
    return bad


def make_case(workdir: str, kind: str, rng: random.Random, *, skip: bool) -> tuple:
    """A job directory with a clean and a damaged shard; returns (job file, damaged file, first bad index)."""
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "tiny_builder.py"), "w") as handle:
        handle.write(BUILDER)
    job = os.path.join(workdir, "job.yaml")
    with open(job, "w") as handle:
        handle.write(JOB.replace("SKIP", "true" if skip else "false"))
    write_records(os.path.join(workdir, "clean.tfrecord"), clean_records(0.0))
    damaged = os.path.join(workdir, "damaged.tfrecord")
    return job, damaged, damage(kind, damaged, rng)


def check_validate(job: str, damaged: str, kind: str, bad: int) -> List[str]:
    """`validate --all-records --records RECORDS` names the damaged file and the record."""
    from tpulaunch.checks.validate import validate_job

    result = validate_job(job, all_records=True, records_per_file=RECORDS)
    found = [p for p in result.problems if p.code in VALIDATE_CODES[kind]]
    failures = []
    if not found:
        return [f"validate reported none of {sorted(VALIDATE_CODES[kind])}: {[(p.code, p.message) for p in result.problems]}"]
    for p in found:
        if damaged not in p.message:
            failures.append(f"validate does not name the file: {p.message}")
        if kind != "empty_file" and not re.search(rf"record {bad}\b", p.message):
            failures.append(f"validate does not name record {bad}: {p.message}")
        if kind in ("truncated", "crc", "huge_length") and "byte" not in p.message:
            failures.append(f"validate gives no byte offset: {p.message}")
        if p.line < 1 or not p.path:
            failures.append(f"unlocated problem {p}")
    if kind == "empty_file" and any(p.is_error for p in found):
        failures.append("an empty file is an error, expected a warning")
    other_errors = [p for p in result.problems if p.is_error and p.code not in VALIDATE_CODES[kind]]
    if other_errors:
        failures.append(f"unexpected errors: {[(p.code, p.message) for p in other_errors]}")
    return failures


def check_pipeline(job: str, damaged: str, kind: str, *, skip: bool) -> tuple:
    """Iterate the eval input_fn: ("named", "skipped" or "clean") and the failures."""
    import tensorflow as tf

    from tpulaunch.engine import pipeline as data
    from tpulaunch.errors import TpuLaunchError
    from tpulaunch.job.load import load_job

    loaded = load_job(job)
    dataset_fn = data.make_dataset_fn(loaded.job, "eval", use_tpu=False)
    seen = []
    try:
        with data.naming_read_errors(loaded.job, "eval"):
            for features, _ in dataset_fn(1):
                seen.append(float(features.numpy()[0][0]))
    except TpuLaunchError as exc:
        if skip:
            return "raised", [f"skip_corrupt is on but the pipeline stopped: {exc.message}"]
        if damaged not in exc.message:
            return "raised", [f"the error does not name the file: {exc.message}"]
        return "named", []
    except tf.errors.OpError as exc:
        return "raised", [f"a TensorFlow error escaped: {type(exc).__name__}: {exc.message[:300]}"]
    clean = [float(i) for i in range(RECORDS)]
    if [v for v in seen if v < 100] != clean:
        return "lost-clean", [f"records of the clean shard went missing: {seen}"]
    if kind == "empty_file":
        return "clean", []
    if not skip and kind == "truncated" and _cut_inside_a_header(damaged):
        # TensorFlow's reader takes a file cut inside a record's 12-byte length header for a clean end
        # of file: no step of the pipeline can tell. `validate --all-records` reports it (checked above).
        return "tf-silent", []
    if not skip:
        return "unnoticed", [f"damage went unnoticed without skip_corrupt: read {seen}"]
    return "skipped", []


def _cut_inside_a_header(path: str) -> bool:
    """Whether the file ends less than 12 bytes after its last complete record."""
    import tensorflow as tf

    complete = sum(16 + len(r) for r in tf.compat.v1.io.tf_record_iterator(path))
    return 0 < os.path.getsize(path) - complete < 12


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from tpulaunch.tf_env import import_tensorflow, quiet_tensorflow

    quiet_tensorflow(0)
    import_tensorflow()
    rng = random.Random(args.seed)
    root = tempfile.mkdtemp(prefix="tpulaunch-corrupt-")
    counts: dict = collections.defaultdict(collections.Counter)
    failures = []
    started = time.monotonic()
    for i in range(args.cases):
        kind = KINDS[i % len(KINDS)]
        skip = (i // len(KINDS)) % 2 == 1
        job, damaged, bad = make_case(os.path.join(root, f"case{i:04d}"), kind, rng, skip=skip)
        try:
            problems = check_validate(job, damaged, kind, bad)
            outcome, more = check_pipeline(job, damaged, kind, skip=skip)
        except Exception:  # noqa: BLE001 - counted as a failure, with its traceback
            problems, outcome, more = ["raised:\n" + traceback.format_exc()[-1500:]], "traceback", []
        counts[kind][outcome] += 1
        counts[kind]["cases"] += 1
        if problems + more:
            failures.append((i, kind, skip, problems + more))
    print(f"cases: {args.cases} (seed {args.seed}, {time.monotonic() - started:.0f} s); "
          f"validate named the file/record in {args.cases - sum(1 for f in failures if any('validate' in m for m in f[3]))}")
    print(f"{'damage':12s} {'cases':>5s} {'named (stop)':>12s} {'skipped':>8s} {'clean':>6s} {'tf-silent':>9s} {'failures':>8s}")
    for kind in KINDS:
        c = counts[kind]
        bad_cases = sum(1 for f in failures if f[1] == kind)
        print(f"{kind:12s} {c['cases']:5d} {c['named']:12d} {c['skipped']:8d} {c['clean']:6d} {c['tf-silent']:9d} {bad_cases:8d}")
    print(f"failures: {len(failures)}")
    for i, kind, skip, messages in failures[:8]:
        print(f"--- case {i} {kind} skip_corrupt={skip}")
        for m in messages:
            print("    " + m[:800].replace("\n", "\n    "))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
