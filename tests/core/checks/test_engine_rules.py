"""The keras engine's static rules (checks/engine_rules.py), its TPU layout (plan/tpu_layout.py) and the
slice topologies (tpu/topology.py): no TensorFlow. Jobs pin `run.engine`, so the verdicts do not depend on the
installed TensorFlow; the same job on the estimator engine keeps TPUEstimator's behaviour."""

import json
import os
import subprocess
import sys

import pytest

from tpulaunch.checks.validate import validate_job
from tpulaunch.plan.tpu_layout import StrategyLayout, computation_shape, layout_for_type
from tpulaunch.plan.build import build_plan
from tpulaunch.tpu.topology import slice_topology
from tpulaunch.tpu.types import parse_tpu_type

JOB = """\
name: ct
model:
  builder: tpulaunch.models.unet3d:build
  params: {num_classes: 3}
data:
  train: gs://bucket/ct/train-*.tfrecord
  features:
    image: {shape: [IMAGE], dtype: float32, encoding: raw}
  labels:
    mask: {shape: [128, 128, 128], dtype: uint8, encoding: raw}
tpu: {name: my-tpu, type: TYPE, cores_per_replica: CORES}
partition:
  features: {image: DIMS}
  labels: {mask: null}
train: {batch_size: BATCH, steps: 1000}
run: {model_dir: gs://bucket/runs/ct, engine: ENGINE}
"""


def write_job(tmp_path, engine="keras", image="128, 128, 128, 1", tpu_type="v3-8", cores=8, dims="[1, 2, 2, 2, 1]",
              batch=4, extra=""):
    text = (JOB.replace("IMAGE", image).replace("TYPE", tpu_type).replace("CORES", str(cores))
            .replace("DIMS", dims).replace("BATCH", str(batch)).replace("ENGINE", engine)) + extra
    path = tmp_path / f"{engine}.yaml"
    path.write_text(text)
    return str(path)


def found(path, *overrides):
    result = validate_job(path, overrides, static=True)
    return [(p.severity, p.code, p.path, p.line, p.column) for p in result.problems]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "tpulaunch", *args], capture_output=True, text=True,
                          env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"})


# ------------------------------------------------------------------------------------- uneven splits

def test_uneven_split_is_an_error_on_keras_and_a_warning_on_estimator(tmp_path):
    keras = write_job(tmp_path, image="3, 128, 128, 1", dims="[1, 4, 2, 1, 1]")
    assert found(keras) == [("error", "partition-uneven-split", "partition.features.image[1]", 13, 25)]
    estimator = write_job(tmp_path, engine="estimator", image="3, 128, 128, 1", dims="[1, 4, 2, 1, 1]")
    assert found(estimator) == [("warning", "partition-empty-pieces", "partition.features.image[1]", 13, 25)]


def test_uneven_split_cli_output_located_with_fix(tmp_path):
    path = write_job(tmp_path, image="12, 128, 128, 1", dims="[1, 8, 1, 1, 1]")
    proc = run_cli("validate", "--static", path)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == (f"{path}:13:25: partition.features.image[1]: axis 1 of 'image' has size 12, which 8 does not "
                        "divide: the keras engine's TPUStrategy.experimental_split_to_logical_devices splits an axis "
                        "only into equal pieces (TPUEstimator pads uneven pieces; TPUStrategy refuses them) "
                        "[partition-uneven-split]")
    assert "    hint: use a size divisible by 8 (e.g. 8 or 16), or dims that divide every axis: [1, 1, 4, 2, 1]" in lines
    # TPUEstimator cuts 12 into [2, 2, 2, 2, 2, 2, 0, 0]: a warning, exit 0
    estimator = run_cli("validate", "--static", write_job(tmp_path, engine="estimator", image="12, 128, 128, 1",
                                                          dims="[1, 8, 1, 1, 1]"))
    assert estimator.returncode == 0, estimator.stdout
    assert "2 of every 8 cores get an empty tile on that axis [partition-empty-pieces]" in estimator.stdout


def test_batch_axis_split_per_replica(tmp_path):
    # v3-32 with 8 logical devices: 4 replicas; global 12 -> 3 per replica, which a batch split of 2 does not divide
    path = write_job(tmp_path, tpu_type="v3-32", dims="[2, 2, 2, 1, 1]", batch=12)
    proc = run_cli("validate", "--static", "--format", "json", path)
    assert proc.returncode == 1
    [problem] = json.loads(proc.stdout)["problems"]
    assert (problem["path"], problem["code"], problem["line"], problem["column"]) == (
        "partition.features.image[0]", "partition-uneven-split", 13, 22)
    assert problem["message"].startswith("the per-replica batch of 'image' is 3, which 2 does not divide")
    assert problem["hint"].startswith("set train.batch_size to 8 or 16 (a per-replica batch divisible by 2 over 4 replica(s))")
    assert found(path, "train.batch_size=16") == []


def auto_job(tmp_path, image):
    path = write_job(tmp_path, image=image)
    text = open(path).read().replace("partition:\n  features: {image: [1, 2, 2, 2, 1]}\n  labels: {mask: null}\n",
                                     "partition: auto\n")
    with open(path, "w") as handle:
        handle.write(text)
    return path


def test_auto_partition_splits_evenly_for_keras(tmp_path):
    # 99 is odd: the estimator's auto splits it in two (padded), the keras engine's splits only the even axes
    path = auto_job(tmp_path, "99, 128, 128, 1")
    keras = validate_job(path, static=True)
    assert keras.ok, keras.problems
    assert build_plan(keras.loaded.job).feed_partition.features["image"] == [1, 1, 4, 2, 1]
    estimator = validate_job(path, ["run.engine=estimator"], static=True)
    assert build_plan(estimator.loaded.job).feed_partition.features["image"] == [1, 2, 2, 2, 1]


def test_auto_partition_without_even_axes_is_an_error(tmp_path):
    path = auto_job(tmp_path, "7, 5, 3, 1")
    assert found(path) == [("error", "partition-auto-impossible", "partition", 12, 12)]
    assert [p[0] for p in found(path, "run.engine=estimator")] == ["warning", "warning"]  # padded, not refused


# ------------------------------------------------------------------------- keys the keras engine refuses

def test_estimator_only_and_unsupported_keys(tmp_path):
    path = write_job(tmp_path, extra="")
    text = open(path).read()
    text = text.replace("  builder: tpulaunch.models.unet3d:build\n", "  model_fn: mymod:model_fn\n")
    text = text.replace("  train: gs://bucket/ct/train-*.tfrecord\n",
                        "  input_fn: mymod:input_fn\n  skip_corrupt: true\n")
    text = text.replace("engine: keras}", "engine: keras, warm_start: {from: gs://bucket/runs/old}}")
    with open(path, "w") as handle:
        handle.write(text)
    errors = [(code, where) for severity, code, where, _, _ in found(path) if severity == "error"]
    assert errors == [("estimator-only-key", "model.model_fn"), ("estimator-only-key", "data.input_fn"),
                      ("keras-engine-unsupported", "data.skip_corrupt"), ("keras-engine-unsupported", "run.warm_start")]
    proc = run_cli("validate", "--static", path)
    assert proc.returncode == 1
    assert ("hint: set run.engine: estimator, or migrate the model to model.builder (a function returning a Keras "
            "model), with model.loss and model.metrics" in proc.stdout)
    # The estimator engine takes all four.
    assert [p for p in found(path, "run.engine=estimator") if p[0] == "error"] == []


def test_packed_small_features_is_estimator_only(tmp_path):
    scalars = "".join(f"    f{i}: {{shape: [1]}}\n" for i in range(5))
    path = write_job(tmp_path)
    text = open(path).read().replace("  labels:\n", scalars + "  labels:\n")
    with open(path, "w") as handle:
        handle.write(text)
    assert found(path) == []
    assert [p[1] for p in found(path, "run.engine=estimator")] == ["partition-packed-small-features"]


# ---------------------------------------------------------------------------------------- the slice

@pytest.mark.parametrize("name, mesh", [
    ("v2-8", (2, 2, 1, 2)), ("v3-8", (2, 2, 1, 2)), ("v3-32", (4, 4, 1, 2)), ("v3-64", (8, 4, 1, 2)),
    ("v4-8", (2, 2, 1, 1)), ("v4-16", (2, 2, 2, 1)), ("v4-32", (2, 2, 4, 1)), ("v4-128", (4, 4, 4, 1)),
    ("v5litepod-8", (2, 4, 1, 1)), ("v5litepod-16", (4, 4, 1, 1)), ("v5p-8", (2, 2, 1, 1)), ("v6e-8", (2, 4, 1, 1)),
])
def test_slice_topology_mesh_and_devices(name, mesh):
    tpu_type = parse_tpu_type(name)
    topology = slice_topology(tpu_type)
    assert topology.mesh_shape == mesh
    assert len(topology.device_coordinates) == tpu_type.hosts
    flat = [c for host in topology.device_coordinates for c in host]
    assert len(flat) == len(set(flat)) == tpu_type.devices
    assert all(0 <= c[i] < mesh[i] for c in flat for i in range(4))


def test_model_garden_computation_shapes_on_two_core_chips():
    mesh = slice_topology(parse_tpu_type("v3-32")).mesh_shape
    assert {n: computation_shape(mesh, n) for n in (1, 2, 4, 8, 16)} == {
        1: (1, 1, 1, 1), 2: (1, 1, 1, 2), 4: (1, 2, 1, 2), 8: (2, 2, 1, 2), 16: (4, 2, 1, 2)}


def test_megacore_computation_shapes_grow_over_chips():
    assert computation_shape((2, 2, 2, 1), 2) == (2, 1, 1, 1)
    assert computation_shape((2, 2, 2, 1), 8) == (2, 2, 2, 1)
    assert computation_shape((2, 4, 1, 1), 8) == (2, 4, 1, 1)
    assert computation_shape((2, 2, 1, 1), 3) is None


def test_layout_replicas_fill_the_slice():
    assert layout_for_type(parse_tpu_type("v4-32"), 8) == StrategyLayout(8, (2, 2, 2, 1), 2, (2, 2, 4, 1))
    assert layout_for_type(parse_tpu_type("v3-32"), 16) == StrategyLayout(16, (4, 2, 1, 2), 2, (4, 4, 1, 2))


def test_slice_findings_located_at_cores_per_replica(tmp_path):
    path = write_job(tmp_path, tpu_type="v4-8", cores=8)
    assert found(path)[0][:3] == ("error", "cores-per-replica-too-large", "tpu.cores_per_replica")
    assert found(path, "tpu.cores_per_replica=6")[0][:3] == ("error", "cores-per-replica-invalid", "tpu.cores_per_replica")


def test_plan_for_keras_shows_layout_and_engine(tmp_path):
    path = write_job(tmp_path, tpu_type="v3-32", cores=16, dims="[1, 4, 2, 2, 1]", batch=4)
    proc = run_cli("plan", "--no-memory", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "engine: keras: Keras + tf.distribute.TPUStrategy" in proc.stdout
    assert ("replicas: 2 x 16 logical device(s), computation shape [4, 2, 1, 2]; 2 input pipeline(s) (hosts), "
            "1 replica(s) each") in proc.stdout
    assert "input_fn runs" not in proc.stdout and "params['batch_size']" not in proc.stdout
    doc = json.loads(run_cli("plan", "--no-memory", "--format", "json", path).stdout)
    assert doc["engine"] == "keras"
    assert doc["device_assignment"] == {"logical_devices": 16, "computation_shape": [4, 2, 1, 2], "replicas": 2,
                            "topology_shape": [4, 4, 1, 2], "input_pipelines": 2, "replicas_per_pipeline": 1}
    estimator = run_cli("plan", "--no-memory", "--set", "run.engine=estimator", path)
    assert "engine: estimator" in estimator.stdout and "input_fn runs 1x per feeding host" in estimator.stdout


# ------------------------------------------------------------------------------- the installed engine

def test_the_engine_the_installed_tensorflow_lacks_is_refused_before_anything_is_built(tmp_path):
    """validate locates it at run.engine with the extra to install; train stops before building, naming it too."""
    from tpulaunch.seam.registry import default_name

    other = "keras" if default_name() == "estimator" else "estimator"
    path = write_job(tmp_path, engine=other, image="128, 128, 128, 1", tpu_type="v3-8", cores=1,
                     dims="null", batch=8)
    validated = run_cli("validate", path)
    assert validated.returncode == 1, validated.stdout + validated.stderr
    assert f"run.engine: the job runs on the {other} engine, but " in validated.stdout, validated.stdout
    assert f"tpulaunch[{'keras' if other == 'keras' else 'cpu'}]" in validated.stdout
    assert "validate --static" in validated.stdout
    static = run_cli("validate", "--static", path)
    assert static.returncode == 0 and f"{other} engine" in static.stdout, static.stdout + static.stderr

    trained = run_cli("train", path, "--local")
    assert trained.returncode == 1, trained.stderr
    assert f"error: run.engine is {other}, but " in trained.stderr and "Traceback" not in trained.stderr
