"""The device mesh the jax engine trains over, from the Plan (`plan/mesh.py`): on a TPU target the slice's replicas,
on this machine the devices the run finds, refused there when they cannot take whole replicas or a batch."""

import pytest

from tpulaunch.errors import TpuLaunchError
from tpulaunch.job.schema import Job
from tpulaunch.plan.build import build_plan
from tpulaunch.plan.mesh import DevicesRefused


def _job(batch_size: int = 8, **sections) -> Job:
    return Job.model_validate({
        "name": "mesh", "model": {"builder": "m:build", "loss": "sparse_categorical_crossentropy"},
        "data": {"train": "gs://bucket/train-*", "features": {"image": {"shape": [16, 16, 1]}},
                 "labels": {"mask": {"shape": [16, 16, 1], "dtype": "int64"}}},
        "partition": {"features": {"image": [1, 2, 2, 1]}, "labels": {"mask": [1, 2, 2, 1]}},
        "train": {"batch_size": batch_size, "steps": 10}, "run": {"model_dir": "gs://bucket/run", "engine": "jax"},
        **sections})


def test_on_a_tpu_the_mesh_is_the_slices_replicas_by_the_split_axes():
    tpu = {"name": "t", "zone": "us-central1-a", "project": "p", "type": "v3-8", "cores_per_replica": 4}
    plan = build_plan(_job(tpu=tpu))
    mesh = plan.device_mesh(plan.slice.devices, "tpu")
    assert (mesh.shape, mesh.axis_names) == ((2, 2, 2), ["batch", "image_axis1", "image_axis2"])
    assert mesh.batch_shards() == plan.replicas == 2


def test_on_this_machine_the_devices_found_make_the_replicas_and_must_take_them_and_the_batch():
    plan = build_plan(_job(), local=True)
    mesh = plan.device_mesh(8, "cpu")
    assert (mesh.shape, mesh.batch_shards()) == ((2, 2, 2), 2)
    with pytest.raises(DevicesRefused) as refused:
        plan.device_mesh(6, "cpu")
    assert refused.value.key == ("partition",) and refused.value.code == "partition-devices"
    assert refused.value.message == ("a replica spans 4 devices (the product of the dims of 'image'), which do not "
                                     "divide this machine's 6 cpu devices")
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=4" in refused.value.hint
    odd = build_plan(_job(batch_size=9), local=True)
    with pytest.raises(TpuLaunchError) as batch:
        odd.device_mesh(8, "cpu")
    assert batch.value.message == ("train.batch_size 9 does not divide over 2 batch shards (2 replicas of 4 devices "
                                   "each, of this machine's 8)")
