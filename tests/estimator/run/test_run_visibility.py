"""What a run shows and records, end to end on the CPU: real TensorFlow, real TFRecords, real TPUEstimator.

An input-bound job (PNG images, a model that barely computes) and a compute-bound job (small raw
images, a few convolutions) are told apart by their run records; a whole `tpulaunch train` process
shows its first lines before TensorFlow is imported, records phases that add up to its wall time
and captures a profile; `data bench` times the pipeline of a shard `tpulaunch data synth` wrote.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

from paths import REPO
from tpulaunch.cli import data as cli_data
from tpulaunch.cli import run as cli_run
from tpulaunch.data.bench import BOUND_RATIO
from tpulaunch.run import phases
from tpulaunch.run.record import RECORD_FILE, last_training


MODELS = textwrap.dedent('''
    import tensorflow as tf

    def _image(input_shape):
        image = tf.keras.Input(shape=tuple(input_shape), dtype="uint8", name="image")
        return image, tf.keras.layers.Rescaling(1 / 255)(image)

    def barely_computes(num_classes=2, input_shape=(256, 256, 3), **unused):
        """A dense layer on a 4x4 corner of the image: next to nothing to compute."""
        image, x = _image(input_shape)
        corner = tf.keras.layers.Cropping2D(((0, input_shape[0] - 4), (0, input_shape[1] - 4)))(x)
        return tf.keras.Model(image, tf.keras.layers.Dense(num_classes)(tf.keras.layers.Flatten()(corner)))

    def convolutions(num_classes=2, input_shape=(32, 32, 3), **unused):
        image, x = _image(input_shape)
        for _ in range(2):
            x = tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
        x = tf.keras.layers.GlobalAveragePooling2D()(x)
        return tf.keras.Model(image, tf.keras.layers.Dense(num_classes)(x))
''')

JOB = textwrap.dedent('''
    name: {name}
    model:
      builder: vis_models:{builder}
      params: {{num_classes: 2}}
      optimizer: {{name: sgd, learning_rate: 0.01}}
    data:
      train: data/{name}.tfrecord
      eval: data/{name}.tfrecord
      features: {{image: {{shape: [{side}, {side}, 3], dtype: uint8, encoding: {encoding}}}}}
      labels: {{label: {{shape: [], dtype: int64}}}}
      shuffle_buffer: 0
    train: {{batch_size: {batch}, steps: 30}}
    eval: {{batch_size: 16, steps: 2}}
    run: {{model_dir: runs/{name}, save_checkpoints_steps: 1000, log_every_steps: 10, seed: 1}}
''')


def write_images(path: Path, count: int, side: int, encoding: str) -> None:
    """Noise images (PNG cannot squeeze noise: every record decodes a full image) and 0/1 labels."""
    rng = np.random.default_rng(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for index in range(count):
            pixels = rng.integers(0, 256, size=(side, side, 3), dtype=np.uint8)
            stored = tf.io.encode_png(pixels).numpy() if encoding == "png" else pixels.tobytes()
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[stored])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[index % 2])),
            })).SerializeToString())


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("visibility")
    (root / "vis_models.py").write_text(MODELS)
    # Decoding a 256x256 PNG costs far more than the model's step; 32x32 raw bytes cost nothing next
    # to two convolutions.
    for name, builder, side, encoding, batch, records in (("png", "barely_computes", 256, "png", 32, 64),
                                                           ("raw", "convolutions", 32, "raw", 16, 256)):
        (root / f"{name}.yaml").write_text(JOB.format(name=name, builder=builder, side=side, encoding=encoding,
                                                      batch=batch))
        write_images(root / "data" / f"{name}.tfrecord", records, side, encoding)
    return root


def records(model_dir: Path) -> list:
    return [json.loads(line) for line in (model_dir / RECORD_FILE).read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(project):
    """Both jobs trained once, in this process: their outputs."""
    outputs = {}
    for name in ("png", "raw"):
        result = CliRunner().invoke(cli_run.train, [str(project / f"{name}.yaml"), "--local"],
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
        outputs[name] = result.output
    return outputs


def test_the_run_record_tells_an_input_bound_job_from_a_compute_bound_one(project, trained):
    (png,) = records(project / "runs" / "png")
    (raw,) = records(project / "runs" / "raw")
    assert (png["input_bound"], raw["input_bound"]) == (True, False), (png["input_wait_share"],
                                                                        raw["input_wait_share"])
    assert png["input_wait_share"] > 4 * raw["input_wait_share"]
    # Each says so before its final line; the input-bound one with what would help this job.
    assert re.search(r"^input \| steps waited for input \d+ % of [\d.]+ s of training \| input-bound \| may help: "
                     r"store data\.features\.image raw instead of PNG/JPEG", trained["png"], re.M), trained["png"]
    assert re.search(r"^input \| steps waited for input \d+ % .* \| (not|partly) input-bound$", trained["raw"], re.M)


def test_a_train_record_holds_the_run(project, trained):
    (record,) = records(project / "runs" / "raw")
    assert (record["command"], record["outcome"], record["job"]) == ("train", "done", "raw")
    assert record["steps"] == {"from": 0, "to": 30, "run": 30, "total": 30}
    assert record["job_hash"].startswith("sha256:") and record["model_dir"] == str(project / "runs" / "raw")
    assert record["versions"] == {"tpulaunch": "0.1.0", "tensorflow": tf.__version__}
    assert set(record["phases"]) >= {phases.CHECK, phases.LOAD, phases.BUILD, phases.INITIALISE, phases.FIRST_STEP,
                                     phases.TRAINING, phases.CHECKPOINT, phases.EVALUATION, phases.OTHER}
    assert [e["step"] for e in record["evals"]] == [30]
    assert sum(record["phases"].values()) == pytest.approx(record["wall_s"], abs=0.01)
    assert 0 < record["goodput"] == pytest.approx(record["phases"][phases.TRAINING] / record["wall_s"], abs=1e-3)
    (done,) = [line for line in trained["raw"].splitlines() if line.startswith("done |")]
    shown = re.search(r" \| loss [^|]+ \| goodput (\d+) % \| ", done)  # as of the final line, before the record
    assert shown and abs(int(shown.group(1)) - record["goodput"] * 100) <= 1, done


def test_a_resumed_run_and_an_evaluation_append_their_own_records(project, trained, tmp_path):
    job = str(project / "raw.yaml")
    result = CliRunner().invoke(cli_run.train, [job, "--local", "--set", "train.steps=34"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    *_, resumed = records(project / "runs" / "raw")
    assert (resumed["command"], resumed["steps"]["from"], resumed["steps"]["to"]) == ("resume", 30, 34)
    assert phases.RESTORE in resumed["phases"] and phases.INITIALISE not in resumed["phases"]

    result = CliRunner().invoke(cli_run.evaluate, [job, "--local"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert [line for line in result.output.splitlines() if line.startswith("phase | ")][-2:] == [
        "phase | evaluation", "phase | evaluation | " + result.output.split("phase | evaluation | ")[1].split("\n")[0]]
    *_, evaluated = records(project / "runs" / "raw")
    assert (evaluated["command"], evaluated["outcome"], evaluated["steps"]["from"]) == ("evaluate", "done", 34)
    assert [e["step"] for e in evaluated["evals"]] == [34] and "loss" in evaluated["evals"][0]["metrics"]
    assert sum(evaluated["phases"].values()) == pytest.approx(evaluated["wall_s"], abs=0.01)


def run_bench(*args: str) -> dict:
    result = CliRunner().invoke(cli_data.bench, [*args, "--format", "json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_data_bench_times_a_shard_written_by_data_synth(tmp_path):
    out = CliRunner().invoke(cli_data.synth, ["--example", "quickstart", str(tmp_path / "data"), "--records", "256",
                                              "--shards", "2"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    bench = run_bench(str(REPO / "configs" / "quickstart.yaml"), "--seconds", "1",
                      "--set", f"data.train={tmp_path / 'data'}/train-*.tfrecord",
                      "--set", f"run.model_dir={tmp_path / 'runs'}")
    assert bench["batch_size"] == 64 and bench["input_pipelines"] == 1
    assert bench["bytes_per_batch"] == 64 * (32 * 32 * 3 * 4 + 8)  # float32 images and int64 labels, decoded
    assert bench["batches"] >= 1 and bench["examples_per_s"] == pytest.approx(
        bench["batches"] * 64 / bench["seconds"], rel=1e-3)
    assert bench["training"] is None  # nothing trained in that model_dir yet


def test_data_bench_compares_the_pipeline_with_what_training_consumed(project, trained):
    bench = run_bench(str(project / "raw.yaml"), "--local", "--seconds", "1")
    record = last_training(records(project / "runs" / "raw"))
    compared = bench["training"]
    assert compared["needed_examples_per_s"] == pytest.approx(record["steady_examples_per_s"])
    assert compared["ratio"] == pytest.approx(bench["examples_per_s"] / compared["needed_examples_per_s"], rel=1e-3)
    assert compared["ratio"] > BOUND_RATIO and compared["input_bound"] is False  # convolutions, not input, limit it


PROBE = """
import sys
from tpulaunch.cli.render import run_plain as render_plain

write = render_plain.PlainRenderer._out
render_plain.PlainRenderer._out = lambda self, line: write(
    self, line + (" [tensorflow imported]" if "tensorflow" in sys.modules else " [no tensorflow]"))
from tpulaunch.cli.app import main
main(sys.argv[1:])
"""


def test_a_train_process_shows_phases_before_tensorflow_and_records_its_whole_wall_time(project, tmp_path):
    """The first lines come before TensorFlow is imported; the record's phases cover the process from
    its start to the record; --profile leaves a TensorBoard profile of the steps asked for."""
    model_dir = tmp_path / "run"
    env = dict(os.environ, CI="1", PYTHONPATH=str(REPO))
    launched = time.time()
    proc = subprocess.run([sys.executable, "-c", PROBE, "train", str(project / "raw.yaml"), "--local",
                           "--model-dir", str(model_dir), "--set", "train.steps=8", "--profile", "3-5"],
                          capture_output=True, text=True, env=env, timeout=300)
    exited = time.time()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:3] == ["phase | check the job | " + lines[0].split(" | ")[2],
                         "phase | load TensorFlow [no tensorflow]",
                         "phase | load TensorFlow | " + lines[2].split(" | ")[2]]
    assert lines[0].endswith(" s [no tensorflow]") and lines[2].endswith(" s [tensorflow imported]")

    (record,) = records(model_dir)
    assert sum(record["phases"].values()) == pytest.approx(record["wall_s"], abs=0.01)
    started = calendar.timegm(time.strptime(record["start"][:19], "%Y-%m-%dT%H:%M:%S"))
    started += float(record["start"][19:-1] or 0)  # ".250Z": the milliseconds
    # The record starts with the process (/proc's start time: 10 ms ticks) and ends before it exits.
    assert launched - 0.05 <= started and started + record["wall_s"] <= exited

    profile = [line for line in lines if line.startswith("profile |")]
    assert profile == [f"profile | steps 3-5 | {model_dir}/plugins/profile | open it: tensorboard --logdir "
                       f"{model_dir} (Profile tab) [tensorflow imported]"]
    assert list((model_dir / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert record["profile"] == f"{model_dir}/plugins/profile"


def test_profile_steps_outside_the_run_are_named_not_silently_dropped(project, tmp_path):
    result = CliRunner().invoke(cli_run.train, [str(project / "raw.yaml"), "--local", "--model-dir",
                                                str(tmp_path / "run"), "--set", "train.steps=2", "--profile", "5-9"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "profile | steps 5-9 are not trained in this run (steps 1 to 2): nothing profiled" in result.output
    assert not (tmp_path / "run" / "plugins").exists()


@pytest.mark.parametrize("value, message", [("5", None), ("9-3", "END at least START"), ("a-b", "is not START-END"),
                                            ("0-4", "START must be at least 1")])
def test_profile_option_reads_start_end(value, message):
    if message is None:
        assert cli_run.StepRange().convert(value, None, None) == (5, 5)
        return
    result = CliRunner().invoke(cli_run.train, ["job.yaml", "--profile", value])
    assert result.exit_code == 2 and message in result.output, result.output
