"""The one gate: every verb that acts on a job refuses the same mistakes, located, before doing anything;
and the Plan it hands over carries the numbers TensorFlow uses."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from paths import REPO
from tpulaunch.cli.app import cli
from tpulaunch.job.load import load_job
from tpulaunch.plan.build import build_plan

ROOT = str(REPO)
CT = os.path.join(ROOT, "tests", "jobs", "good", "tpu_ct.yaml")
LABELS_ONLY = os.path.join(ROOT, "tests", "jobs", "bad", "52_labels_split_feature_whole.yaml")


@pytest.mark.parametrize("verb", [["validate", "--static"], ["plan", "--no-memory"], ["train"], ["evaluate"],
                                  ["explain"]])
def test_every_verb_refuses_partitioned_labels_beside_a_whole_feature(verb):
    """(export builds a CPU serving graph, where partition: does not apply, so it is not refused.)"""
    result = CliRunner().invoke(cli, [verb[0], LABELS_ONLY, *verb[1:]])
    assert result.exit_code == 1, result.output
    assert f"{LABELS_ONLY}:22:3: partition: labels are partitioned but the only feature 'image' is not" in result.output
    assert "unexpected" not in result.output and "Traceback" not in result.output


def test_status_is_refused_only_for_mistakes_in_tpu(tmp_path):
    bad_tpu = tmp_path / "job.yaml"
    bad_tpu.write_text(open(CT).read().replace("type: v3-8", "type: v3-6"))
    result = CliRunner().invoke(cli, ["status", str(bad_tpu)])
    assert result.exit_code == 1
    assert f"{bad_tpu}:18:9: tpu.type: v3-6 does not exist" in result.output
    assert "not checking the TPU of" in result.output


def test_status_without_google_cloud_tpu_names_the_extra():
    probe = textwrap.dedent(f"""
        import sys
        sys.modules["google.cloud.tpu_v2"] = None  # as on an install without the Cloud TPU client
        from tpulaunch.cli import main
        main(["status", {CT!r}])
    """)
    child = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                           env=dict(os.environ, TPULAUNCH_TPU_API_ENDPOINT="http://127.0.0.1:9"))
    assert child.returncode == 1, child.stderr
    assert child.stderr.splitlines()[0] == ("error: asking the Cloud TPU API needs google-cloud-tpu, which is not "
                                            "installed (no module named 'google.cloud.tpu_v2')")
    assert "pip install 'google-cloud-tpu>=1.10,<1.28' (the Cloud TPU client; it installs no TensorFlow)" \
        in child.stderr and "unexpected" not in child.stderr


def test_plan_matches_tensorflows_per_host_v2_arithmetic():
    """One input_fn call per host (tpu_estimator's generate_per_host_v2_enqueue_ops_fn_for_host), whose dataset
    is dequeued once per replica on the host: examples per host per step = per-replica batch x replicas per host."""
    job = load_job(CT, ["tpu.type=v3-32", "tpu.cores_per_replica=2", "partition.features.image=[1, 2, 1, 1, 1]",
                        "partition.labels.mask=[1, 2, 1, 1]", "train.batch_size=32"]).job
    plan = build_plan(job)
    assert (plan.slice.hosts, plan.slice.replicas, plan.slice.replicas_per_host) == (4, 16, 4)
    assert plan.slice.input_fn_calls_per_host == 1
    train = plan.batch("train")
    assert (train.global_batch, train.per_replica, train.params_batch_size, train.per_host) == (32, 2, 2, 8)
    assert build_plan(job, local=True).slice is None and build_plan(job, local=True).feed_partition is None


def test_plan_finds_a_builder_beside_the_job_file(tmp_path):
    """plan's memory estimate imports the builder from the job file's directory, as validate and train do."""
    (tmp_path / "mymodels.py").write_text(textwrap.dedent("""
        import tensorflow as tf

        def build(input_shape=(8, 8, 1), num_classes=2):
            inputs = tf.keras.Input(shape=input_shape, name="image")
            x = tf.keras.layers.Conv2D(4, 3, padding="same")(inputs)
            x = tf.keras.layers.GlobalAveragePooling2D()(x)
            return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(x))
    """))
    job = tmp_path / "job.yaml"
    job.write_text(textwrap.dedent("""
        name: beside
        model: {builder: "mymodels:build", loss: sparse_categorical_crossentropy}
        data:
          train: data/train-*.tfrecord
          features: {image: {shape: [8, 8, 1]}}
          labels: {label: {shape: [], dtype: int64}}
        train: {batch_size: 4, steps: 2}
        run: {model_dir: runs/beside}
    """))
    child = subprocess.run([sys.executable, "-m", "tpulaunch", "plan", str(job), "--format", "json"], cwd=ROOT,
                           capture_output=True, text=True)
    assert child.returncode == 0, child.stderr
    memory = json.loads(child.stdout)["memory"]
    assert memory["params"] == (3 * 3 * 1 * 4 + 4) + (4 * 2 + 2), memory  # the model was built: conv + dense
    assert memory["reason"] == "runs locally: no TPU memory to compare against"


def test_padding_warnings_only_where_the_padded_size_matters(tmp_path):
    """A classification label padded 32x (a few KiB) says nothing; a thin 1-channel tile of MiBs does."""
    from tpulaunch.checks.validate import validate_job

    job = tmp_path / "job.yaml"
    job.write_text(open(CT).read())
    codes = [p.code for p in validate_job(str(job), static=True).problems]
    assert "layout-padding-waste" not in codes
    # 16 volumes of 24^3 x 3 per core: every axis is small, so the minor one pads 24 -> 128 (x5.3, ~5.6 MiB).
    thin = validate_job(str(job), ["data.features.image.shape=[24, 24, 24, 3]", "data.labels.mask.shape=[24, 24, 24]",
                                   "tpu.cores_per_replica=1", "partition=null", "train.batch_size=128",
                                   "eval.batch_size=128"], static=True)
    padding = [p for p in thin.problems if p.code == "layout-padding-waste"]
    assert [p.path for p in padding] == ["data.features.image", "data.labels.mask"], thin.problems
    assert "[16, 24, 24, 24, 3] takes 5x its size" in padding[0].message


def test_validate_local_checks_the_target_train_local_uses():
    """A TPU job's batch of 3 does not split over its 2 replicas, which matters on the TPU only: validate
    refuses it for the slice, and `validate --local` accepts it, as `train --local` does."""
    odd = ["--set", "train.batch_size=3", "--set", "eval.batch_size=3"]
    for_tpu = CliRunner().invoke(cli, ["validate", "--static", "configs/unet3d_ct.yaml", *odd])
    assert for_tpu.exit_code == 1 and "[batch-not-divisible]" in for_tpu.output, for_tpu.output
    for_cpu = CliRunner().invoke(cli, ["validate", "--static", "--local", "configs/unet3d_ct.yaml", *odd])
    assert for_cpu.exit_code == 0 and for_cpu.output.startswith("OK configs/unet3d_ct.yaml"), for_cpu.output
    both = CliRunner().invoke(cli, ["validate", "--local", "--tf", "configs/unet3d_ct.yaml"])
    assert both.exit_code == 2 and "use one" in both.output
