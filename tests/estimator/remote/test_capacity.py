"""Capacity fallback (tpulaunch/tpu/lifecycle.Fallback): tpu.zones and tpu.tiers tried in order when the Cloud TPU
API refuses a create for capacity. The local Cloud TPU API server refuses creates in a stocked-out zone as the
real one does (the create's operation fails with RESOURCE_EXHAUSTED; a queued resource waits for resources);
google-cloud-tpu and tpulaunch's Lifecycle talk to it. No TensorFlow here.
"""

from __future__ import annotations

import pytest

from tpu_api_server import DEFAULT_PROJECT
from tpulaunch.errors import ExitCode
from tpulaunch.job.schema import Tpu
from tpulaunch.tpu import api
from tpulaunch.tpu.lifecycle import Fallback, Lifecycle, placements, spec_for
from tpulaunch.tpu.node import resolve_node

A, B = "us-central1-a", "us-central1-b"


def _fallback(tpu_api, said, try_wait_s: float = 30.0, **tpu):
    """The job's zones and tiers as `run` tries them. A stockout is refused at once, so each try's wait only bounds a
    slow machine; the test of a try that waits out its time passes a short one."""
    job_tpu = Tpu(name="cap-tpu", project=DEFAULT_PROJECT, runtime_version="tpu-vm-tf-2.15.1-se", **tpu)
    spec = spec_for(job_tpu, "estimator")

    def make(ref, node_spec):
        return Lifecycle(ref, node_spec, api_endpoint=tpu_api.endpoint, poll_s=0.05)
    return Fallback(resolve_node(job_tpu), spec, placements(job_tpu, spec), make=make, try_wait_s=try_wait_s,
                    on_progress=said.append)


def _tier(created: dict) -> str:
    scheduling = created["node"].get("schedulingConfig") or {}
    return "spot" if scheduling.get("spot") else "on-demand"


def test_spot_everywhere_before_on_demand_and_each_refusal_said(tpu_api):
    tpu_api.stockout(A, ["spot"])
    tpu_api.stockout(B, ["spot"])
    said = []
    fallback = _fallback(tpu_api, said, type="v3-8", zones=[A, B], tiers=["spot", "on-demand"])
    assert [str(p) for p in fallback.tries] == [f"{A} (spot)", f"{B} (spot)", f"{A} (on-demand)", f"{B} (on-demand)"]
    life, outcome = fallback.create(wait_s=30, metadata=(("greeting", "hi"),))
    assert (life.ref.zone, life.spec.tier, outcome.status.state) == (A, "on-demand", "READY")
    assert [(c["node"]["metadata"]["greeting"], _tier(c)) for c in tpu_api.created] == [
        ("hi", "spot"), ("hi", "spot"), ("hi", "on-demand")]
    assert any(f"no TPU in {A} (spot): " in line and "no more capacity" in line and f"trying {B} (spot)" in line
               for line in said), said
    assert list(tpu_api.nodes) == [f"projects/{DEFAULT_PROJECT}/locations/{A}/nodes/cap-tpu"]  # nothing else left


def test_no_capacity_anywhere_lists_what_was_tried_and_leaves_nothing(tpu_api):
    tpu_api.stockout(A)
    tpu_api.stockout(B)
    with pytest.raises(api.NoCapacity) as refused:
        _fallback(tpu_api, [], type="v3-8", zones=[A, B]).create(wait_s=30)
    assert refused.value.exit_code == ExitCode.NO_CAPACITY
    message = refused.value.message
    assert "in any of the 2 zone/tier tried" in message and f"{A} (on-demand): " in message and f"{B} (on-demand): " in message
    assert "tpu.zones" in refused.value.hint
    assert tpu_api.nodes == {}


def test_a_queued_resource_waiting_for_capacity_is_deleted_after_its_wait_and_the_next_zone_tried(tpu_api):
    tpu_api.stockout(A)
    said = []
    life, _ = _fallback(tpu_api, said, try_wait_s=1.0, type="v5litepod-8", zones=[A, B], spot=True).create(wait_s=30)
    assert (life.ref.zone, life.spec.queued) == (B, True)
    assert tpu_api.queued_resource("cap-tpu", zone=A) is None  # the waiting one was removed, not leaked
    assert tpu_api.queued_resource("cap-tpu", zone=B)["state"]["state"] == "ACTIVE"
    assert any("not READY within 1 s" in line for line in said), said


def test_zones_and_tiers_in_the_job_file():
    tpu = Tpu(name="n", type="v3-8", zones=[A, B], tiers=["spot", "on-demand"])
    assert tpu.zone == A  # what `up`, `down` and `status` use
    assert spec_for(Tpu(name="n", type="v3-8", zones=[A], tiers=["spot", "on-demand"],
                        runtime_version="tpu-vm-tf-2.15.1-se"), "estimator").tier == "spot"  # `up`: the first tier
    for wrong, said in ((dict(zone=B, zones=[A, B]), "is not the first of tpu.zones"),
                        (dict(zones=[A, A]), "lists us-central1-a twice"),
                        (dict(spot=True, tiers=["spot", "on-demand"]), "tpu.tiers and tpu.spot exclude each other")):
        with pytest.raises(ValueError, match=said):
            Tpu(name="n", type="v3-8", **wrong)


def test_a_recovery_starts_at_the_lost_zone_or_the_one_after_it_each_tier_everywhere_first(tpu_api):
    C = "us-central1-c"
    fallback = _fallback(tpu_api, [], type="v3-8", zones=[A, B, C], tiers=["spot", "on-demand"])
    assert [str(p) for p in fallback.starting_at(B)] == [
        f"{B} (spot)", f"{C} (spot)", f"{A} (spot)", f"{B} (on-demand)", f"{C} (on-demand)", f"{A} (on-demand)"]
    assert [str(p) for p in fallback.starting_at(C, after=True)] == [
        f"{A} (spot)", f"{B} (spot)", f"{C} (spot)", f"{A} (on-demand)", f"{B} (on-demand)", f"{C} (on-demand)"]
    life, _ = fallback.create(wait_s=30, tries=fallback.starting_at(A, after=True))
    assert (life.ref.zone, life.spec.tier) == (B, "spot")
