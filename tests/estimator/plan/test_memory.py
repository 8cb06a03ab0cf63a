"""The per-core memory estimate against the published Cloud TPU facts, and its place in `tpulaunch plan`.

Reference models are built symbolically (shapes only); the memory module caches each build by
(builder, kwargs) for the whole test process, so each tile size is built once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from memory_cases import NETWORKS, PUBLISHED, make_job, plan_memory
from paths import REPO
from tpulaunch.plan import memory
from tpulaunch.plan.build import build_plan
from tpulaunch.job.schema import Job, Partition

pytestmark = pytest.mark.slow  # long end-to-end runs: its worker starts it first

GiB = 1024 ** 3
PYTHON = sys.executable
REPO = str(REPO)


@pytest.fixture(scope="module")
def published_plans():
    plans = {}
    for name, (args, _, _) in PUBLISHED.items():
        optimizer = "momentum" if args[0] == "retinanet" else "adam"  # as the reference configs train
        plans[name] = plan_memory(make_job(*args, optimizer=optimizer))
    return plans


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_fact_is_reproduced(published_plans, name):
    _, expected_verdict, design_gib = PUBLISHED[name]
    plan = published_plans[name]
    assert plan.verdict == expected_verdict
    assert plan.usable_bytes == int(15.48 * GiB)
    if design_gib is not None:
        assert plan.per_core_bytes / GiB == pytest.approx(design_gib, rel=0.15)
    assert plan.per_core_bytes == sum(plan.breakdown.values())


def test_published_tiles_and_weights(published_plans):
    plan = published_plans["retinanet-2560-x8-8way"]
    assert plan.tile == [8, 640, 1280, 3]
    # The anchor targets depend on the image size, so the step is built at 2560^2 and scaled to the tile.
    assert plan.method == "scaled from [2560, 2560, 3]"
    # ResNet-50 FPN RetinaNet: every core holds all ~38M weights, their gradient and one momentum slot.
    assert plan.params == published_plans["retinanet-1280-x8-one-core"].params
    assert 30e6 < plan.params < 45e6
    assert plan.breakdown["weights"] == plan.params * 4
    assert plan.breakdown["bf16_weights"] == plan.params * 2
    assert plan.optimizer_slots == 1
    assert published_plans["unet3d-256-x1-16way"].tile == [1, 64, 128, 128, 1]


def test_unpartitioned_2560_retinanet_recommends_a_smaller_batch_then_a_partition_that_fits(published_plans):
    first = published_plans["retinanet-2560-x8-unpartitioned"].recommendation
    # One 2560^2 image per core fits: the largest batch that fits comes first (full speed) ...
    assert first["action"] == "reduce-batch" and 1 <= first["per_replica_batch"] < 8
    assert first["global_batch"] == first["per_replica_batch"] * 8  # a v3-8: 8 replicas of one core
    smaller = plan_memory(make_job("retinanet", 2560, "v3-8", 1, first["global_batch"]))
    assert smaller.verdict == "fits" and smaller.per_core_bytes == first["per_core_bytes"]
    one_more = plan_memory(make_job("retinanet", 2560, "v3-8", 1, first["global_batch"] + 8))
    assert one_more.verdict != "fits"
    # ... then spatial partitioning that keeps the batch, with its cost.
    rec = first["alternative"]
    assert {k: rec[k] for k in ("action", "cores_per_replica", "dims", "per_replica_batch", "global_batch", "cost")} == {
        "action": "partition", "cores_per_replica": 4, "dims": {"image": [1, 2, 2, 1]},
        "per_replica_batch": 8, "global_batch": 16, "cost": {"efficiency": 0.55, "core_time_per_example": 1.82}}
    # Taking the recommendation as written gives a job that fits.
    followed = plan_memory(make_job("retinanet", 2560, "v3-8", rec["cores_per_replica"], rec["global_batch"],
                                           rec["dims"]["image"]))
    assert followed.verdict == "fits"
    assert followed.per_core_bytes == rec["per_core_bytes"]


def test_unpartitioned_256_unet_recommends_fewest_cores(published_plans):
    rec = published_plans["unet3d-256-x1-unpartitioned"].recommendation
    assert (rec["action"], rec["cores_per_replica"], rec["dims"]) == ("partition", 2, {"image": [1, 2, 1, 1, 1]})
    assert rec["per_core_bytes"] < int(15.48 * GiB)


def test_large_headroom_recommends_a_larger_batch(published_plans):
    plan = published_plans["unet3d-256-x1-16way"]
    rec = plan.recommendation
    assert rec["action"] == "batch"
    assert rec["per_replica_batch"] > 1
    assert rec["global_batch"] == rec["per_replica_batch"] * 2  # 2 replicas on a v3-32
    bigger = plan_memory(make_job("unet3d", 256, "v3-32", 16, rec["global_batch"], [1, 4, 2, 2, 1], optimizer="adam"))
    assert bigger.verdict == "fits"
    one_more = plan_memory(make_job("unet3d", 256, "v3-32", 16, rec["global_batch"] + 2, [1, 4, 2, 2, 1],
                                           optimizer="adam"))
    assert one_more.verdict != "fits"


def test_fitting_job_without_headroom_gets_no_recommendation(published_plans):
    assert published_plans["retinanet-1280-x8-one-core"].recommendation is None


def test_three_state_verdict():
    usable = 16 * GiB
    assert memory.verdict(15 * GiB, 10 * GiB, usable) == "fits"
    assert memory.verdict(17 * GiB, 15 * GiB, usable) == "may-fit"
    assert memory.verdict(30 * GiB, 17 * GiB, usable) == "does-not-fit"


def test_partitioned_tile_adds_the_convolution_halo():
    whole = plan_memory(make_job("unet3d", 128, "v3-8", 1, 8, optimizer="adam"))  # 1 volume per core
    split = plan_memory(make_job("unet3d", 128, "v3-8", 8, 1, [1, 2, 2, 2, 1], optimizer="adam"))
    assert split.tile == [1, 64, 64, 64, 1]
    # 3x3x3 convolutions read one voxel beyond each face of a 64^3 .. 8^3 tile: a few % more than 1/8.
    assert 1.02 < split.breakdown["activations"] / (whole.breakdown["activations"] / 8) < 1.15


# --------------------------------------------------------------------------------- padding model
def test_least_padded_layout():
    # A one-channel 3D tile whose every axis is below 128 is padded: 32 -> 128 on the minor dim.
    assert memory.padded_elements([1, 32, 32, 32, 1]) == 4 * 32 ** 3
    # Large spatial axes leave XLA a layout without padding, whatever the channel count.
    assert memory.padded_elements([4, 128, 128, 128, 1]) == 4 * 128 ** 3
    assert memory.padded_elements([8, 160, 160, 256]) == 8 * 160 * 160 * 256
    assert memory.padded_elements([8, 160, 160, 64]) == 8 * 160 * 256 * 64  # 160 -> 256 beats 64 -> 128
    assert memory.padded_elements([3]) == 128
    assert memory.padded_elements([2, 3]) == 8 * 128


def test_thin_tiles_inflate_the_estimate():
    # 32^3 volumes, one per core: the first level's [1, 32, 32, 32, 32] tensors take 4x their size.
    small = plan_memory(make_job("unet3d", 32, optimizer="adam"))
    assert small.breakdown["padding"] > 0.5 * small.breakdown["activations"]
    large = plan_memory(make_job("unet3d", 128, optimizer="adam"))
    assert large.breakdown["padding"] < 0.05 * large.breakdown["activations"]


# ------------------------------------------------------------------------------ optimizer, precision
def test_optimizer_slots_table():
    assert {name: memory.optimizer_slots(name) for name in ("sgd", "momentum", "adam", "adagrad", "rmsprop")} == {
        "sgd": 0, "momentum": 1, "adam": 2, "adagrad": 1, "rmsprop": 2}
    assert memory.optimizer_slots("rmsprop", {"centered": True}) == 3
    assert memory.optimizer_slots("my.pkg:make_optimizer") == memory.UNKNOWN_OPTIMIZER_SLOTS


def test_optimizer_slots_cost_a_weight_copy_each():
    plans = {name: plan_memory(make_job("unet3d", 32, optimizer=name)) for name in ("sgd", "momentum", "adam")}
    trainable_bytes = plans["momentum"].breakdown["optimizer"]
    assert plans["sgd"].breakdown["optimizer"] == 0
    assert plans["adam"].breakdown["optimizer"] == 2 * trainable_bytes
    assert plans["adam"].per_core_bytes - plans["sgd"].per_core_bytes == 2 * trainable_bytes
    assert trainable_bytes == plans["sgd"].breakdown["gradients"]


def test_bfloat16_halves_activations_and_adds_a_weight_copy():
    bf16 = plan_memory(make_job("unet3d", 64, optimizer="adam", precision="bfloat16"))
    fp32 = plan_memory(make_job("unet3d", 64, optimizer="adam", precision="float32"))
    assert fp32.breakdown["bf16_weights"] == 0
    assert bf16.breakdown["bf16_weights"] == bf16.params * 2
    # Everything but the float32 logits the loss reads is half the size in bfloat16.
    assert 1.9 < fp32.breakdown["activations"] / bf16.breakdown["activations"] < 2.0


# --------------------------------------------------------------------------------- partition: auto
def test_auto_partition_chooses_the_published_dims():
    unet = build_plan(make_job("unet3d", 256, "v3-32", 16, 2, "auto")).feed_partition
    assert unet == Partition(features={"image": [1, 4, 2, 2, 1]}, labels={"mask": [1, 4, 2, 2]})
    retinanet = build_plan(make_job("retinanet", 2560, "v3-64", 8, 64, "auto")).feed_partition
    assert retinanet == Partition(features={"image": [1, 4, 2, 1]}, labels={"cls_targets": None, "box_targets": None})


def test_auto_partition_fits_and_is_shown(published_plans):
    plan = plan_memory(make_job("unet3d", 256, "v3-32", 16, 2, "auto", optimizer="adam"))
    assert plan.verdict == "fits"
    assert plan.auto_partition == {"features": {"image": [1, 4, 2, 2, 1]}, "labels": {"mask": [1, 4, 2, 2]}}
    assert plan.per_core_bytes == published_plans["unet3d-256-x1-16way"].per_core_bytes


def test_auto_partition_that_cannot_split_feeds_nothing():
    job = make_job("unet3d", 4, "v3-128", 128, 1, "auto")  # 4^3 splits at most 4 x 4 x 4 = 64 ways
    assert build_plan(job).feed_partition is None  # validate refuses it: partition-auto-impossible


def test_the_same_network_written_every_way_gets_the_same_estimate(tmp_path):
    """Memory comes from the training step the engine builds, so how the model is written does not matter."""
    (tmp_path / "networks.py").write_text(NETWORKS)
    base = {"name": "ways", "model": {"optimizer": {"name": "adam"}},
            "data": {"features": {"image": {"shape": [64, 64, 3]}}, "labels": {"label": {"shape": [], "dtype": "int64"}}},
            "tpu": {"type": "v3-8"}, "train": {"batch_size": 64, "steps": 10}, "run": {"model_dir": "gs://bucket/run"}}
    estimates = {}
    for way in ("functional", "sequential", "subclassed", "custom_layer", "model_fn"):
        document = json.loads(json.dumps(base))
        document["model"]["builder" if way != "model_fn" else "model_fn"] = f"networks:{way}"
        job = Job.model_validate(document).located_at(str(tmp_path))
        plan = plan_memory(job)
        assert plan.verdict == "fits", (way, plan.reason)
        estimates[way] = plan
    reference = estimates["functional"]
    assert reference.params == 3 * 3 * 3 * 16 + 16 + 3 * 3 * 16 * 32 + 32 + 32 * 10 + 10
    for way, plan in estimates.items():
        assert plan.params == reference.params, way
        assert abs(plan.per_core_bytes - reference.per_core_bytes) <= 0.1 * reference.per_core_bytes, (way, plan.breakdown)
    assert reference.breakdown["activations"] > 0


# ------------------------------------------------------------------------------------ plan command
JOB_YAML = """\
name: unet-small
model:
  builder: tpulaunch.models.unet3d:build
  params: {{num_classes: 3}}
  loss: sparse_categorical_crossentropy
  optimizer: adam
  precision: bfloat16
data:
  train: gs://bucket/train-*.tfrecord
  features:
    image: {{shape: [{size}, {size}, {size}, 1], encoding: raw}}
  labels:
    mask: {{shape: [{size}, {size}, {size}], dtype: uint8, encoding: raw}}
tpu:
  name: my-tpu
  type: v3-8
  cores_per_replica: {cores}
  iterations_per_loop: 10
partition: {partition}
train: {{batch_size: {batch}, steps: 100}}
run:
  model_dir: gs://bucket/runs/unet
"""


def run_plan(tmp_path, *args, size=64, cores=1, batch=8, partition="null"):
    """`tpulaunch plan JOB ARGS` through its command line, in this process: TensorFlow is loaded once for the
    module. What a process of its own adds (`plan --no-memory` never loads TensorFlow) is
    test_plan_no_memory_stays_tensorflow_free's."""
    import traceback

    from click.testing import CliRunner
    from tpulaunch.cli.app import cli

    path = tmp_path / "job.yaml"
    path.write_text(JOB_YAML.format(size=size, cores=cores, batch=batch, partition=partition))
    argv = ["plan", str(path), *args]
    result = CliRunner().invoke(cli, argv)
    said = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        said += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["tpulaunch", *argv], result.exit_code, result.stdout, said)


def test_plan_json_memory_contract(tmp_path):
    done = run_plan(tmp_path, "--format", "json", "--no-tpu-compiler")  # the estimate's contract (XLA's: test_xla_tpu)
    assert done.returncode == 0, done.stderr
    section = json.loads(done.stdout)["memory"]
    assert section["verdict"] in memory.VERDICTS
    assert isinstance(section["per_core_bytes"], int) and section["per_core_bytes"] > 0
    assert section["usable_bytes"] == int(15.48 * GiB)
    assert set(section["breakdown"]) == {"weights", "gradients", "optimizer", "bf16_weights", "activations", "padding"}
    assert section["per_core_bytes"] == sum(section["breakdown"].values())
    expected = plan_memory(make_job("unet3d", 64, "v3-8", 1, 8, optimizer="adam")).to_dict()
    assert section == expected


def test_plan_json_shows_the_auto_partition(tmp_path):
    done = run_plan(tmp_path, "--format", "json", size=128, cores=8, batch=1, partition="auto")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["partition"] == {"features": {"image": [1, 2, 2, 2, 1]}, "labels": {"mask": [1, 2, 2, 2]}}
    assert [t["dims"] for t in plan["tensors"]] == [[1, 2, 2, 2, 1], [1, 2, 2, 2]]
    assert plan["memory"]["auto_partition"] == plan["partition"]
    assert plan["memory"]["tile"] == [1, 64, 64, 64, 1]


def test_plan_text_has_the_memory_section(tmp_path):
    done = run_plan(tmp_path, size=256, batch=8)
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert "memory: does not fit" in lines
    assert any(line.startswith("recommendation: tpu.cores_per_replica: 2 with partition image: [1, 2, 1, 1, 1]")
               for line in lines)


def test_plan_no_memory_stays_tensorflow_free(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(JOB_YAML.format(size=64, cores=1, batch=8, partition="null"))
    script = textwrap.dedent(f"""
        import json, sys
        from click.testing import CliRunner
        from tpulaunch.cli.app import cli
        result = CliRunner().invoke(cli, ["plan", {str(path)!r}, "--no-memory", "--format", "json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["memory"] is None
        assert "tensorflow" not in sys.modules
        print("ok")
    """)
    done = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr


# ------------------------------------------------------------------------ builders without input_shape
def unet_fixed_at_128():
    """A builder that cannot be told the tile: the estimate scales its layer shapes instead."""
    from tpulaunch.models import unet3d

    return unet3d.build(num_classes=3, input_shape=(128, 128, 128, 1))


def test_scaled_shapes_match_a_build_at_the_tile():
    built = make_job("unet3d", 128, "v3-8", 8, 1, [1, 2, 2, 2, 1], optimizer="adam")
    fixed = built.model_copy(update={"model": built.model.model_copy(
        update={"builder": "test_memory:unet_fixed_at_128", "params": {}})})
    at_tile, scaled = plan_memory(built), plan_memory(fixed)
    assert at_tile.method == "built at tile"
    assert scaled.method == "scaled from [128, 128, 128, 1]"
    assert scaled.tile == at_tile.tile == [1, 64, 64, 64, 1]
    assert scaled.breakdown == at_tile.breakdown


def test_tile_the_model_cannot_take_is_scaled(published_plans):
    # 2560 rows split 8 ways gives 320-row tiles: not a multiple of RetinaNet's 128-pixel pyramid.
    plan = plan_memory(make_job("retinanet", 2560, "v3-64", 8, 64, [1, 8, 1, 1]))
    assert plan.method == "scaled from [2560, 2560, 3]"
    assert plan.verdict == "fits"
    assert plan.per_core_bytes == pytest.approx(published_plans["retinanet-2560-x8-8way"].per_core_bytes, rel=0.05)


def test_validate_accepts_auto_partition(tmp_path):
    from tpulaunch.checks.validate import validate_job

    path = tmp_path / "job.yaml"
    path.write_text(JOB_YAML.format(size=128, cores=8, batch=1, partition="auto"))
    result = validate_job(str(path), (), static=True)
    assert [p.code for p in result.problems if p.is_error or p.code.startswith("partition")] == []
    path.write_text(JOB_YAML.format(size=128, cores=1, batch=8, partition="auto"))
    result = validate_job(str(path), (), static=True)
    assert [(p.severity, p.code) for p in result.problems if p.code.startswith("partition")] == [
        ("warning", "partition-auto-one-core")]


# ----------------------------------------------------------------------------------- plan --xla
def test_xla_buffer_assignment_agrees_with_the_float32_estimate(tmp_path, monkeypatch):
    job = make_job("unet3d", 32, global_batch=16, optimizer="adam", precision="float32")  # 2 per core
    plan = plan_memory(job)
    tile = memory.Tile(plan.tile[0], tuple(plan.tile[1:]), 1, None)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the child makes XLA's dump directory
    xla = memory.xla_step_bytes(job, tile)
    assert list(tmp_path.iterdir()) == []  # and removes it
    assert xla["input_shape"] == [32, 32, 32, 1]
    # XLA on the CPU has no (8, 128) tiles: compare with the unpadded estimate.
    unpadded = plan.per_core_bytes - plan.breakdown["padding"]
    assert xla["total_bytes"] == pytest.approx(unpadded, rel=0.15)


def broken_builder(input_shape=(8, 8, 3)):
    raise RuntimeError("the builder's own bug")


def test_builder_failure_is_reported_not_raised():
    job = make_job("unet3d", 32)
    job = job.model_copy(update={"model": job.model.model_copy(update={"builder": "test_memory:broken_builder",
                                                                       "params": {}})})
    assert plan_memory(job).to_dict() == memory.MemoryPlan(
        "unknown", None, None,
        reason="building the model failed: model.builder: building the train graph: RuntimeError: the builder's own bug"
    ).to_dict()


# ------------------------------------------------------- XLA's usable HBM (tpu/types.py) changes verdicts
# The table used to hold estimates below what XLA lets a v5e, v6e and v5p device use (16 GB, 32 GB and 95 GiB less
# a 1.25 GiB reserve); jobs whose estimate lies between the two were refused. (slice, model, examples per core,
# the old figure in GiB, the verdict it gave.)
OLD_ESTIMATES = [
    ("v5litepod-8", "retinanet", 9, 16e9 / GiB - 1.25, "does-not-fit"),
    ("v6e-8", "retinanet", 18, 32e9 / GiB - 1.25, "may-fit"),
    ("v5p-8", "retinanet", 57, 95 - 1.25, "may-fit"),
]


@pytest.mark.parametrize("tpu_type, model, per_core, old_gib, old_verdict", OLD_ESTIMATES)
def test_xlas_usable_hbm_turns_refused_jobs_into_fitting_ones(tpu_type, model, per_core, old_gib, old_verdict):
    from tpulaunch.tpu.types import parse_tpu_type

    devices = parse_tpu_type(tpu_type).devices
    plan = plan_memory(make_job(model, 1280, tpu_type, 1, per_core * devices))
    assert plan.verdict == "fits"
    assert plan.usable_bytes == parse_tpu_type(tpu_type).usable_bytes_per_device
    assert int(old_gib * GiB) < plan.per_core_bytes <= plan.usable_bytes
    assert memory.verdict(plan.per_core_bytes, plan.lower_bound_bytes, int(old_gib * GiB)) == old_verdict
