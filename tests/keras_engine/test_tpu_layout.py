"""The keras engine's TPU layout against TensorFlow's own code (current TensorFlow): DeviceAssignment.build on
fabricated slice topologies, `validate --tf`'s verdicts, and split_inputs in a real tf.function graph."""

import pytest
import tensorflow as tf
from tensorflow.compiler.xla import xla_data_pb2
from tensorflow.python.compiler.xla.experimental import xla_sharding

from paths import REPO
from tpulaunch.plan.tpu_layout import computation_shape, layout_for_type
from tpulaunch.engine.keras.standalone import annotate_for_logical_devices
from tpulaunch.engine.keras.tpu_setup import device_assignment, topology_for
from tpulaunch.engine.keras.verdict import _StandIn, tf_problems
from tpulaunch.job.load import load_job
from tpulaunch.plan.build import build_plan
from tpulaunch.tpu.topology import slice_topology
from tpulaunch.tpu.types import parse_tpu_type


def verdict(loaded, **kwargs):
    """TensorFlow's verdict on the job's TPU Plan, as `validate --tf` asks for it."""
    return tf_problems(loaded, build_plan(loaded.job) if loaded.job is not None else None, **kwargs)


GRID = [(name, n) for name in ("v2-8", "v3-8", "v3-32", "v3-64", "v4-8", "v4-16", "v4-32", "v5litepod-8",
                               "v5litepod-16", "v5p-16", "v6e-8")
        for n in (1, 2, 4, 8, 16) if n <= parse_tpu_type(name).devices]


@pytest.mark.parametrize("name, logical", GRID)
def test_device_assignment_fills_the_slice(name, logical):
    tpu_type = parse_tpu_type(name)
    layout = layout_for_type(tpu_type, logical)
    topology = topology_for(tpu_type)
    assert list(topology.mesh_shape) == list(layout.topology_shape)
    assignment = device_assignment(topology, layout)
    assert (assignment.num_replicas, assignment.num_cores_per_replica) == (layout.replicas, logical)
    assert layout.replicas * logical == tpu_type.devices
    coordinates = [tuple(assignment.coordinates(r, c)) for r in range(layout.replicas) for c in range(logical)]
    assert len(set(coordinates)) == tpu_type.devices  # every device once: replicas do not overlap
    for r in range(layout.replicas):  # each replica is one computation_shape block of the mesh
        block = [tuple(assignment.coordinates(r, c)) for c in range(logical)]
        extent = tuple(max(c[i] for c in block) - min(c[i] for c in block) + 1 for i in range(4))
        assert extent == tuple(layout.computation_shape)
    # The plan's input pipelines are the hosts TPUStrategy feeds replicas from (their logical device 0).
    job_hosts = {assignment.host_device(r, logical_core=0) for r in range(layout.replicas)}
    assert len(job_hosts) == min(tpu_type.hosts, layout.replicas)


def test_v3_8_core_coordinates_for_two_and_eight():
    tpu_type = parse_tpu_type("v3-8")
    two = device_assignment(topology_for(tpu_type), layout_for_type(tpu_type, 2))
    assert [list(two.coordinates(0, c)) for c in range(2)] == [[0, 0, 0, 0], [0, 0, 0, 1]]  # both cores of a chip
    eight = device_assignment(topology_for(tpu_type), layout_for_type(tpu_type, 8))
    assert sorted(tuple(eight.coordinates(0, c)) for c in range(8)) == sorted(
        c for host in slice_topology(tpu_type).device_coordinates for c in host)


def test_model_garden_shape_does_not_fit_a_megacore_mesh():
    """Model Garden's 2-logical-device shape [1, 1, 1, 2] assumes two devices per chip; TF refuses it on v4."""
    topology = topology_for(parse_tpu_type("v4-8"))
    with pytest.raises(ValueError, match="does not fit in TPU topology shape"):
        tf.tpu.experimental.DeviceAssignment.build(topology, computation_shape=[1, 1, 1, 2], num_replicas=2)
    assert computation_shape(topology.mesh_shape, 2) == (2, 1, 1, 1)


JOB = """\
name: ct
model:
  builder: tpulaunch.models.unet3d:build
  params: {num_classes: 3}
data:
  train: gs://bucket/ct/train-*.tfrecord
  eval: gs://bucket/ct/eval-*.tfrecord
  features:
    image: {shape: [128, 128, 128, 1], dtype: float32, encoding: raw}
  labels:
    mask: {shape: [128, 128, 128], dtype: uint8, encoding: raw}
tpu: {name: my-tpu, type: v3-32, cores_per_replica: 16}
partition:
  features: {image: [1, 4, 2, 2, 1]}
  labels: {mask: [1]}
train: {batch_size: 4, steps: 1000}
eval: {batch_size: 2, steps: 10}
run: {model_dir: gs://bucket/runs/ct, engine: keras}
"""


@pytest.fixture
def job_file(tmp_path):
    path = tmp_path / "ct.yaml"
    path.write_text(JOB)
    return str(path)


def test_validate_tf_accepts_even_splits(job_file):
    problems, built = verdict(load_job(job_file))
    assert problems == []
    train = built["train"]
    assert train["accepted"] and train["engine"] == "keras"
    assert (train["replicas"], train["logical_devices"], train["computation_shape"]) == (2, 16, [4, 2, 1, 2])
    assert (train["core_coordinates"], train["input_pipelines"], train["per_replica_batch"]) == (32, 2, 2)
    assert train["sharding"] == {"image": "tiled", "mask": "core0"}
    assert train["piece_shapes"]["image"] == [[2, 32, 64, 64, 1]] * 16
    assert built["eval"]["piece_shapes"]["image"] == [[1, 32, 64, 64, 1]] * 16


def test_validate_tf_refuses_uneven_split_with_tensorflows_message(job_file):
    loaded = load_job(job_file, ["data.features.image.shape=[126, 128, 128, 1]"])
    problems, built = verdict(loaded)
    [problem] = problems
    assert (problem.severity, problem.path, problem.code) == ("error", "partition.features.image[1]", "tensorflow-rejected")
    assert (problem.line, problem.column) == (14, 25)  # the 4, the dim of axis 1
    assert ("Tensor shape at `partition_dimensions[1]` must be divisible by corresponding value specified by "
            "`partition_dimensions` (4). Received: 126.") in problem.message
    assert not built["train"]["accepted"]


def test_validate_tf_refuses_a_replica_the_topology_cannot_hold(job_file):
    problems, built = verdict(load_job(job_file, ["tpu.type=v3-8"]))
    [problem] = problems
    assert problem.path == "tpu.cores_per_replica"
    assert "computation footprint [4 2 1 2] does not fit in TPU topology shape [2 2 1 2]" in problem.message
    assert not built["train"]["accepted"]


def test_validate_tf_without_tpu_is_informational(job_file):
    problems, built = verdict(load_job(job_file, ["tpu=null", "partition=null"]))
    assert [(p.severity, p.code) for p in problems] == [("info", "tensorflow-not-on-tpu")]
    assert built == {}


def test_inputs_are_annotated_for_the_logical_devices_inside_a_tf_function(job_file):
    job = load_job(job_file).job
    plan = build_plan(job)
    strategy = _StandIn(__import__("numpy").empty((2, 16), dtype=object))
    strategy.experimental_split_to_logical_devices = (
        lambda t, dims: tf.distribute.TPUStrategy.experimental_split_to_logical_devices(strategy, t, dims))
    strategy.experimental_assign_to_logical_device = (
        lambda t, core: tf.distribute.TPUStrategy.experimental_assign_to_logical_device(strategy, t, core))
    seen = {}

    @tf.function(input_signature=[tf.TensorSpec([2, 128, 128, 128, 1]), tf.TensorSpec([2, 128, 128, 128], tf.uint8)])
    def step(image, mask):
        features = annotate_for_logical_devices(strategy, {"image": image}, plan.feed_partition.features)
        labels = annotate_for_logical_devices(strategy, mask, plan.feed_partition.labels)
        for name, tensor in (("image", features["image"]), ("mask", labels)):
            proto = xla_data_pb2.OpSharding()
            proto.ParseFromString(xla_sharding.get_tensor_sharding(tensor))
            seen[name] = proto
        return tf.reduce_sum(features["image"]) + tf.reduce_sum(tf.cast(labels, tf.float32))

    step.get_concrete_function()
    assert seen["image"].type == xla_data_pb2.OpSharding.OTHER
    assert list(seen["image"].tile_assignment_dimensions) == [1, 4, 2, 2, 1]
    assert list(seen["image"].tile_assignment_devices) == list(range(16))
    assert seen["mask"].type == xla_data_pb2.OpSharding.MAXIMAL
    assert list(seen["mask"].tile_assignment_devices) == [0]


def test_split_inputs_leaves_replicated_tensors_alone():
    image = tf.zeros([2, 8, 8, 1])
    assert annotate_for_logical_devices(object(), {"image": image}, {"image": None}) == {"image": image}
    assert annotate_for_logical_devices(object(), None, {"mask": [1, 2]}) is None


def test_validate_tf_on_the_cli_shows_what_tensorflow_built_for_the_keras_engine():
    """`validate --static --tf` of the UNet3D example on a v3-32, pinned to the keras engine: TensorFlow's own
    DeviceAssignment and split annotations, as the user reads them."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "tpulaunch", "validate", "--static", "--tf",
                             str(REPO / "configs" / "unet3d_ct.yaml"), "--set", "run.engine=keras"],
                            capture_output=True, text=True, env={**__import__("os").environ, "COLUMNS": "200"},
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(checked: schema, keras engine," in result.stdout
    assert ("TensorFlow train: accepted  DeviceAssignment: 2 replica(s) x 16 logical device(s), computation shape "
            "[4, 2, 1, 2], 32 TPU devices, 2 input pipeline(s); per-replica batch 1") in result.stdout, result.stdout
    assert "16 x [1, 64, 128, 128, 1]" in result.stdout
