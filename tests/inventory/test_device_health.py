"""GPU health -> device taints and health status (pure mapping, NVIDIA's taint table)."""

from __future__ import annotations

import json

import pytest

from dra_gpu.hardware.types import ALL_INSTANCES, GpuProbe, XidEvent
from dra_gpu.inventory.device_health import (
    GPU_LOST_TAINT_KEY,
    UNMONITORED_TAINT_KEY,
    XID_TAINT_KEY,
    GpuHealth,
    HealthPolicy,
    after_probe,
    apply_health,
    device_taints,
    format_time,
    health_from_json,
    health_status,
    health_to_json,
    parse_xid_list,
    record_xid,
)
from dra_gpu.inventory.model import Device, DeviceKind, DeviceModel, MigSpec

GPU0, GPU1 = "GPU-0000", "GPU-1111"
T0 = 1_800_000_000.0


def _mig(name: str, kind: DeviceKind, start: int, gi_id: int | None = None) -> Device:
    return Device(
        name=name,
        kind=kind,
        parent_uuid=GPU0,
        parent_minor=0,
        attributes={},
        capacity={},
        mig=MigSpec("1g.10gb", 19, start, 1, gi_id=gi_id, ci_id=0 if gi_id is not None else None),
    )


MODEL = DeviceModel(
    devices=(
        Device("gpu-0", DeviceKind.GPU, GPU0, 0, {}, {}),
        _mig("gpu-0-mig-1g10gb-19-0", DeviceKind.MIG_DYNAMIC, 0),
        _mig("gpu-0-mig-1g10gb-19-1", DeviceKind.MIG_DYNAMIC, 1),
        _mig("gpu-0-mig-1g10gb-19-4", DeviceKind.MIG_STATIC, 4, gi_id=9),
        Device("gpu-0-shared", DeviceKind.GPU_SHARE, GPU0, 0, {}, {}),
        Device("gpu-1", DeviceKind.GPU, GPU1, 1, {}, {}),
    )
)
ON_GPU0 = {d.name for d in MODEL.devices if d.parent_uuid == GPU0}


def _xid(
    xid: int, gi: int = ALL_INSTANCES, ci: int = ALL_INSTANCES, gi_placement: tuple[int, int] | None = None
) -> XidEvent:
    return XidEvent(GPU0, xid, gi, ci, gi_placement=gi_placement, time=T0)


def test_whole_gpu_xid_taints_every_device_of_that_gpu_only() -> None:
    health = {GPU0: record_xid(None, _xid(79))}
    taints = device_taints(MODEL, health, HealthPolicy())
    assert set(taints) == ON_GPU0
    for name in ON_GPU0:
        (taint,) = taints[name]
        assert (taint.key, taint.value, taint.effect) == (XID_TAINT_KEY, "79", "NoSchedule")
        assert taint.time_added == format_time(T0) == "2027-01-15T08:00:00Z"


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_ignorable_xids_get_effect_none(xid: int) -> None:
    taints = device_taints(MODEL, {GPU0: record_xid(None, _xid(xid))}, HealthPolicy())
    assert {t.effect for ts in taints.values() for t in ts} == {"None"}


def test_additional_xids_to_ignore() -> None:
    policy = HealthPolicy(additional_ignored_xids=parse_xid_list(" 48, 74,"))
    assert policy.xid_effect(48) == "None" and policy.xid_effect(79) == "NoSchedule"
    with pytest.raises(ValueError, match=r"additional-xids-to-ignore.*'x'"):
        parse_xid_list("48,x")
    with pytest.raises(ValueError, match="'0'"):
        parse_xid_list("0")


def test_mig_xid_maps_by_placement_then_by_instance_ids() -> None:
    by_placement = device_taints(
        MODEL, {GPU0: record_xid(None, _xid(94, 3, 0, gi_placement=(1, 1)))}, HealthPolicy()
    )
    assert set(by_placement) == {"gpu-0-mig-1g10gb-19-1"}
    by_ids = device_taints(MODEL, {GPU0: record_xid(None, _xid(94, 9, 0))}, HealthPolicy())
    assert set(by_ids) == {"gpu-0-mig-1g10gb-19-4"}
    unknown = device_taints(MODEL, {GPU0: record_xid(None, _xid(94, 2, 0))}, HealthPolicy())
    assert unknown == {}


def test_lost_and_unmonitored_gpus() -> None:
    health = {GPU0: GpuHealth(GPU0, lost_since=T0), GPU1: GpuHealth(GPU1, unmonitored="registration failed")}
    taints = device_taints(MODEL, health, HealthPolicy())
    assert {n for n, ts in taints.items() if ts[0].key == GPU_LOST_TAINT_KEY} == ON_GPU0
    assert taints["gpu-0"][0].effect == "NoSchedule" and taints["gpu-0"][0].value == ""
    assert [(t.key, t.effect) for t in taints["gpu-1"]] == [(UNMONITORED_TAINT_KEY, "None")]


def test_taints_are_deduplicated_and_ordered_most_severe_first() -> None:
    health = record_xid(None, _xid(13))
    health = record_xid(health, XidEvent(GPU0, 13, time=T0 + 50))  # same XID again: first time kept
    health = record_xid(health, XidEvent(GPU0, 48, time=T0 + 100))
    assert len(health.xids) == 2 and health.last_xid_time == T0 + 100
    taints = device_taints(MODEL, {GPU0: health}, HealthPolicy())["gpu-0"]
    assert [(t.value, t.effect) for t in taints] == [("48", "NoSchedule"), ("13", "None")]
    assert taints[1].time_added == format_time(T0)


def test_recovery_needs_answers_no_reset_and_a_quiet_period() -> None:
    policy = HealthPolicy(recovery_quiet_s=60)
    health = record_xid(None, _xid(79))
    answering = GpuProbe(GPU0, answering=True, reset_required=False, recovery_known=True)
    needs_reset = GpuProbe(GPU0, True, reset_required=True, recovery_known=True)
    assert after_probe(health, needs_reset, T0 + 600, policy).xids
    assert after_probe(health, answering, T0 + 30, policy).xids  # too soon after the XID
    assert after_probe(health, answering, T0 + 60, policy).clean
    assert after_probe(health, answering, T0 + 10**6, HealthPolicy(recovery_quiet_s=-1)).xids  # never


def test_without_recovery_action_the_clock_alone_never_clears_a_taint() -> None:
    """A driver that cannot report the recovery action: the taint waits for a reset to be seen."""
    policy = HealthPolicy(recovery_quiet_s=60)
    health = record_xid(None, _xid(48))
    unknown = GpuProbe(GPU0, answering=True, reset_required=False)  # field not supported
    assert after_probe(health, unknown, T0 + 10**6, policy).xids
    # The GPU drops off (being reset) and comes back: that is the proof.
    during = after_probe(health, GpuProbe(GPU0, False, True, "GPU is lost"), T0 + 100, policy)
    assert during.reset_seen and during.xids
    assert after_probe(during, unknown, T0 + 200, policy).clean
    # A new XID after the reset needs its own proof.
    again = record_xid(during, XidEvent(GPU0, 79, time=T0 + 150))
    assert not again.reset_seen and after_probe(again, unknown, T0 + 10**6, policy).xids
    # The reset-seen mark survives a plugin restart.
    assert health_from_json(health_to_json({GPU0: during}))[GPU0].reset_seen


def test_fatal_effect_noexecute() -> None:
    policy = HealthPolicy(fatal_effect="NoExecute")
    lost = after_probe(record_xid(None, _xid(48)), GpuProbe(GPU0, False, True), T0, policy)
    lost = record_xid(lost, _xid(13))
    effects = {(t.key, t.effect) for t in device_taints(MODEL, {GPU0: lost}, policy)["gpu-0"]}
    assert effects == {
        ("gpu.nvidia.com/xid", "NoExecute"),
        ("gpu.nvidia.com/gpu-lost", "NoExecute"),
        ("gpu.nvidia.com/xid", "None"),  # an ignorable XID stays informational
    }
    with pytest.raises(ValueError, match="NoSchedule, NoExecute"):
        HealthPolicy(fatal_effect="PreferNoSchedule")  # type: ignore[arg-type]


def test_lost_gpu_comes_back_when_nvml_answers() -> None:
    lost = after_probe(GpuHealth(GPU0), GpuProbe(GPU0, False, True, "GPU is lost"), T0, HealthPolicy())
    assert lost.lost_since == T0
    still = after_probe(lost, GpuProbe(GPU0, False, True), T0 + 5, HealthPolicy())
    assert still.lost_since == T0  # the taint keeps its first time
    assert after_probe(still, GpuProbe(GPU0, True, False), T0 + 6, HealthPolicy()).clean


def test_apply_health_and_health_status() -> None:
    assert apply_health(MODEL, {}, HealthPolicy()) is MODEL
    tainted = apply_health(MODEL, {GPU0: record_xid(None, _xid(79))}, HealthPolicy())
    by_name = tainted.by_name()
    status = health_status(by_name["gpu-0-shared"])
    assert not status.healthy and "gpu.nvidia.com/xid=79 (NoSchedule" in status.message
    assert health_status(by_name["gpu-1"]).healthy and health_status(by_name["gpu-1"]).message == ""
    ignorable = apply_health(MODEL, {GPU0: record_xid(None, _xid(13))}, HealthPolicy()).by_name()["gpu-0"]
    assert health_status(ignorable).healthy and "xid=13 (None" in health_status(ignorable).message
    cleared = apply_health(tainted, {}, HealthPolicy())
    assert all(not d.taints for d in cleared.devices)


def test_health_state_round_trips_and_rejects_bad_files() -> None:
    health = {
        GPU0: record_xid(None, _xid(94, 3, 0, gi_placement=(1, 1))),
        GPU1: GpuHealth(GPU1, lost_since=T0, unmonitored="not saved"),
    }
    restored = health_from_json(json.loads(json.dumps(health_to_json(health))))
    assert restored[GPU0] == health[GPU0]
    assert restored[GPU1] == GpuHealth(GPU1, lost_since=T0)  # registration is retried at start instead
    assert health_to_json({GPU1: GpuHealth(GPU1, unmonitored="x")})["gpus"] == {}
    with pytest.raises(ValueError, match="format"):
        health_from_json({"format": 99, "gpus": {}})
    with pytest.raises(ValueError, match="malformed GPU entry"):
        health_from_json({"format": 1, "gpus": {GPU0: {"xids": [{"xid": "x"}]}}})
