"""The keras engine's memory plan is read from the training step it traces (GradientTape's backward pass):
how the model is written does not matter, and the published facts hold as on the estimator engine."""

from __future__ import annotations

import json

import pytest

import memory_cases
from tpulaunch.job.schema import Job


def test_the_same_network_written_every_way_gets_the_same_estimate_on_the_keras_engine(tmp_path):
    (tmp_path / "networks.py").write_text(memory_cases.NETWORKS)
    base = {"name": "ways", "model": {"optimizer": {"name": "adam"}},
            "data": {"features": {"image": {"shape": [64, 64, 3]}}, "labels": {"label": {"shape": [], "dtype": "int64"}}},
            "tpu": {"type": "v3-8"}, "train": {"batch_size": 64, "steps": 10},
            "run": {"model_dir": "gs://bucket/run", "engine": "keras"}}
    estimates = {}
    for way in ("functional", "sequential", "subclassed", "custom_layer"):
        document = json.loads(json.dumps(base))
        document["model"]["builder"] = f"networks:{way}"
        plan = memory_cases.plan_memory(Job.model_validate(document).located_at(str(tmp_path)))
        assert plan.verdict == "fits", (way, plan.reason)
        estimates[way] = plan
    reference = estimates["functional"]
    assert reference.params == 3 * 3 * 3 * 16 + 16 + 3 * 3 * 16 * 32 + 32 + 32 * 10 + 10
    assert reference.breakdown["activations"] > 0
    for way, plan in estimates.items():
        assert plan.params == reference.params, way
        assert abs(plan.per_core_bytes - reference.per_core_bytes) <= 0.1 * reference.per_core_bytes, (way, plan.breakdown)


# The UNet3D facts: the RetinaNet ones build a 1280-2560 px step, a minute each; the estimator suite has them.
@pytest.mark.parametrize("name", [n for n in memory_cases.PUBLISHED if n.startswith("unet3d")])
def test_published_unet_facts_hold_on_the_keras_engine(name):
    args, verdict, gib = memory_cases.PUBLISHED[name]
    job = memory_cases.make_job(*args, optimizer="adam")
    document = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    document["run"]["engine"] = "keras"
    plan = memory_cases.plan_memory(Job.model_validate(document))
    assert plan.verdict == verdict, plan.reason
    if gib is not None:
        assert plan.per_core_bytes / 2**30 == pytest.approx(gib, rel=0.15), plan.breakdown  # as on the estimator engine
