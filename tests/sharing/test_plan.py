"""The pure plan: which combinations are refused, with hand-built GPUs (pre-Volta, Ampere) where needed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_node import SimNode

from dra_gpu.config.api import decode_opaque_config
from dra_gpu.hardware.types import ComputeMode, GpuInfo
from dra_gpu.inventory.model import Capacity, Device, DeviceKind, DeviceModel, MigSpec
from dra_gpu.sharing.interface import AllocatedDevice, SharingError
from dra_gpu.sharing.plan import build_plan

P4 = GpuInfo(
    index=0,
    minor=0,
    uuid="GPU-p4000000-0000-0000-0000-000000000000",
    product_name="Tesla P4",
    brand="Tesla",
    architecture="Pascal",
    cuda_compute_capability=(6, 1),
    memory_bytes=8 * 2**30,
    multiprocessors=20,
    pci_bus_id="0000:3b:00.0",
    pcie_root=None,
    numa_node=None,
    interconnect=None,
    mig_capable=False,
    mig_enabled=False,
    mig_pending=False,
    mig_toggle_without_reset=False,
    compute_mode=ComputeMode.DEFAULT,
)
V100 = replace(
    P4,
    uuid="GPU-v1000000-0000-0000-0000-000000000000",
    product_name="Tesla V100",
    architecture="Volta",
    cuda_compute_capability=(7, 0),
)


def gpu_device(info: GpuInfo, kind: DeviceKind = DeviceKind.GPU) -> AllocatedDevice:
    name = f"gpu-{info.minor}" + ("-shared" if kind is DeviceKind.GPU_SHARE else "")
    device = Device(
        name=name,
        kind=kind,
        parent_uuid=info.uuid,
        parent_minor=info.minor,
        attributes={},
        capacity={"memory": Capacity(info.memory_bytes)},
    )
    consumed = {"compute": "10", "memory": "1Gi"} if kind is DeviceKind.GPU_SHARE else {}
    return AllocatedDevice(
        request="r", pool="p", device=device, share_id="s" if consumed else None, consumed_capacity=consumed
    )


def config(kind: str = "GpuConfig", **sharing: object) -> object:
    body: dict[str, object] = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind}
    if sharing:
        body["sharing"] = sharing
    return decode_opaque_config(body)


def test_mps_on_pre_volta_is_refused() -> None:
    with pytest.raises(SharingError, match=r"Tesla P4\) has compute capability 6.1.*7.0 \(Volta\)"):
        build_plan(config(strategy="MPS"), [gpu_device(P4)], {P4.uuid: P4})


def test_shares_on_pre_volta_are_refused() -> None:
    with pytest.raises(SharingError, match=r"compute capability 6\.1"):
        build_plan(None, [gpu_device(P4, DeviceKind.GPU_SHARE)], {P4.uuid: P4})


def test_mps_on_volta_is_planned() -> None:
    plan = build_plan(config(strategy="MPS"), [gpu_device(V100)], {V100.uuid: V100})
    assert plan.mps is not None and plan.mps.full_gpu_uuids == (V100.uuid,)


def test_time_slicing_plan_names_the_full_gpus_only() -> None:
    plan = build_plan(
        config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Medium"}),
        [gpu_device(P4), gpu_device(V100)],
        {P4.uuid: P4, V100.uuid: V100},
    )
    assert plan.time_slice_interval == 2
    assert plan.time_slice_gpus == tuple(sorted([P4.uuid, V100.uuid]))
    assert plan.mps is None


def test_no_config_plans_nothing() -> None:
    plan = build_plan(None, [gpu_device(V100)], {V100.uuid: V100})
    assert (
        plan.strategy is None
        and plan.time_slice_interval is None
        and plan.mps is None
        and plan.shares is None
    )


def test_mig_device_without_instance_cannot_run_mps() -> None:
    device = Device(
        name="gpu-0-mig-1g5gb-19-0",
        kind=DeviceKind.MIG_STATIC,
        parent_uuid=V100.uuid,
        parent_minor=0,
        attributes={},
        capacity={},
        mig=MigSpec(profile="1g.5gb", gi_profile_id=19, placement_start=0, placement_size=1),
    )
    with pytest.raises(SharingError, match="has no UUID"):
        build_plan(
            config("MigDeviceConfig", strategy="MPS"), [AllocatedDevice("r", "p", device)], {V100.uuid: V100}
        )


def test_unknown_config_object_is_refused() -> None:
    with pytest.raises(SharingError, match="unsupported config object dict"):
        build_plan({"strategy": "MPS"}, [gpu_device(V100)], {V100.uuid: V100})


def test_device_on_a_missing_gpu_is_refused() -> None:
    with pytest.raises(SharingError, match="not present on this node"):
        build_plan(config(strategy="MPS"), [gpu_device(V100)], {})


# ---- property: any mix of devices and configs either plans or says why, never crashes ----------------------


@pytest.fixture(scope="module")
def dgx() -> Iterator[tuple[DeviceModel, dict[str, GpuInfo]]]:
    node = SimNode("dgx-h100")
    try:
        discovery = node.hardware.discover()
        yield node.model(), {g.uuid: g for g in discovery.gpus}
    finally:
        node.cleanup()


CONFIGS = [
    None,
    {"kind": "GpuConfig"},
    {"kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}},
    {"kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 30}}},
    {"kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}},
    {
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1Gi"}},
    },
]


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_combination_plans_or_refuses_clearly(
    dgx: tuple[DeviceModel, dict[str, GpuInfo]], data: st.DataObject
) -> None:
    model, gpus = dgx
    chosen = data.draw(
        st.lists(st.sampled_from(model.devices), min_size=1, max_size=4, unique_by=lambda d: d.name)
    )
    raw = data.draw(st.sampled_from(CONFIGS))
    cfg = decode_opaque_config({"apiVersion": "resource.nvidia.com/v1beta1", **raw}) if raw else None
    allocs = [
        AllocatedDevice(
            request=f"r{i}",
            pool="p",
            device=d,
            share_id="s" if d.kind is DeviceKind.GPU_SHARE else None,
            consumed_capacity={"compute": "10", "memory": "1Gi"} if d.kind is DeviceKind.GPU_SHARE else {},
        )
        for i, d in enumerate(chosen)
    ]
    try:
        plan = build_plan(cfg, allocs, gpus)
    except SharingError as err:
        assert any(d.name in str(err) for d in chosen) or "shares of one GPU" in str(err)
        return
    assert {d.device.name for d in plan.create_mig} == {
        d.name for d in chosen if d.kind is DeviceKind.MIG_DYNAMIC
    }
    if plan.shares is not None:
        assert all(d.kind is DeviceKind.GPU_SHARE for d in chosen)
