"""Whole GPUs shared by `--consumable-shares`: what prepare does with each claim's consumed capacity."""

from __future__ import annotations

import json

import pytest
from sim_node import SimNode, pid_alive

from dra_gpu.config.api import decode_opaque_config
from dra_gpu.hardware.types import ComputeMode, GpuInfo
from dra_gpu.inventory.consumable_shares import parse_consumable_shares
from dra_gpu.inventory.device_model import ModelOptions, build_device_model
from dra_gpu.sharing.interface import AllocatedDevice, SharingError
from dra_gpu.sharing.plan import build_plan

SHARE_A = "22222222-0000-0000-0000-000000000001"
SHARE_B = "22222222-0000-0000-0000-000000000002"


def shared_node(node: SimNode, flag: str) -> SimNode:
    options = ModelOptions(consumable_shares=parse_consumable_shares(flag))
    node._model = build_device_model(node.hardware.discover(), options)
    return node


def gpu_share(node: SimNode, share_id: str, request: str = "gpu", **consumed: str) -> AllocatedDevice:
    return node.alloc("gpu-0", request=request, share_id=share_id, consumed_capacity=consumed)


def gpus(node: SimNode) -> dict[str, GpuInfo]:
    return {g.uuid: g for g in node.hardware.discover().gpus}


def mps(text: str) -> object:
    return decode_opaque_config(json.loads(text))


def test_memory_shares_get_their_own_daemon_limited_to_the_consumed_memory(node: SimNode) -> None:
    shared_node(node, "memory")
    uuid = node.uuid()
    manager = node.manager()
    a = manager.prepare_group("claim-a", None, [gpu_share(node, SHARE_A, memory="4Gi")])
    b = manager.prepare_group("claim-b", None, [gpu_share(node, SHARE_B, memory="8Gi")])
    da, db = a.state["mpsDaemon"], b.state["mpsDaemon"]
    assert da["id"] != db["id"] and len(node.running_daemons()) == 2
    records = node.mps_records()
    assert records[da["pipeDir"]]["default_pinned_mem_limits"] == {uuid: "4096M"}
    assert records[db["pipeDir"]]["default_pinned_mem_limits"] == {uuid: "8192M"}
    assert records[da["pipeDir"]]["default_active_thread_percentage"] == 100  # no compute capacity: every SM
    assert a.state["sharedMps"]["clients"] == [f"claim-a/gpu-0/{SHARE_A}"]
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.DEFAULT)  # the other claims keep the GPU

    manager.unprepare_group("claim-a", a.state)  # one share gone, the other untouched
    assert not pid_alive(da["pid"]) and pid_alive(db["pid"])
    assert node.mps_records()[db["pipeDir"]]["default_pinned_mem_limits"] == {uuid: "8192M"}
    manager.unprepare_group("claim-b", b.state)
    assert node.leftovers() == [] and node.gpu_state(uuid).compute_mode == int(ComputeMode.DEFAULT)


def test_an_mps_config_only_tightens_a_memory_share(node: SimNode) -> None:
    shared_node(node, "memory")
    config = mps(
        '{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS",'
        '"mpsConfig":{"defaultActiveThreadPercentage":30,"defaultPinnedDeviceMemoryLimit":"2Gi"}}}'
    )
    plan = build_plan(config, [gpu_share(node, SHARE_A, memory="4Gi")], gpus(node))
    assert plan.shares is not None
    assert (plan.shares.compute_percent, plan.shares.memory_bytes) == (30, 2 * 2**30)


@pytest.mark.parametrize(
    ("flag", "consumed"),
    [
        ("unlimited", {"memory": "0"}),  # no request: nothing consumed, nothing to enforce
        ("memory", {"memory": "81559Mi"}),  # the default: the whole GPU
        ("4", {"memory": "0", "shares": "1"}),
    ],
)
def test_shares_without_a_memory_fraction_get_the_gpu_as_nvidia_gives_it(
    node: SimNode, flag: str, consumed: dict[str, str]
) -> None:
    shared_node(node, flag)
    devices = [gpu_share(node, SHARE_A, **consumed)]
    plan = build_plan(None, devices, gpus(node))
    assert plan.shares is None and plan.mps is None and plan.strategy is None
    manager = node.manager()
    result = manager.prepare_group("claim-a", None, devices)
    assert result.state["mpsDaemon"] is None and node.running_daemons() == []
    manager.unprepare_group("claim-a", result.state)
    # MPS would set EXCLUSIVE_PROCESS on a GPU other claims hold: refused, as NVIDIA's driver does
    config = mps(
        '{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS"}}'
    )
    with pytest.raises(SharingError, match=r"cannot apply strategy MPS to gpu-0: .*--consumable-shares"):
        build_plan(config, devices, gpus(node))


def test_time_slicing_on_a_memory_share_sets_the_interval_without_limits(node: SimNode) -> None:
    shared_node(node, "memory")
    config = mps(
        '{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing",'
        '"timeSlicingConfig":{"interval":"Long"}}}'
    )
    plan = build_plan(config, [gpu_share(node, SHARE_A, memory="4Gi")], gpus(node))
    assert plan.shares is None and plan.time_slice_gpus == (node.uuid(),)


def test_two_requests_of_one_claim_on_the_same_gpu_add_up(node: SimNode) -> None:
    shared_node(node, "memory")
    devices = [
        gpu_share(node, SHARE_A, request="a", memory="4Gi"),
        gpu_share(node, SHARE_B, request="b", memory="6Gi"),
    ]
    plan = build_plan(None, devices, gpus(node))
    assert plan.shares is not None and plan.shares.memory_bytes == 10 * 2**30
    assert plan.shares.client_keys == (f"gpu-0/{SHARE_A}", f"gpu-0/{SHARE_B}")
