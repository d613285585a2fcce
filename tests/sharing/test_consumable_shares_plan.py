"""Whole GPUs shared by `--consumable-shares`: what prepare does with each claim's consumed capacity."""

from __future__ import annotations

import json

import pytest
from sim_node import SimNode

from dra_gpu.config.api import decode_opaque_config
from dra_gpu.hardware.types import ComputeMode, GpuInfo
from dra_gpu.inventory.consumable_shares import parse_consumable_shares
from dra_gpu.inventory.device_model import ModelOptions, build_device_model
from dra_gpu.sharing.interface import AllocatedDevice
from dra_gpu.sharing.plan import build_plan
from tests.support.container_view import sim_client

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


def test_memory_shares_are_clients_of_the_gpus_server_each_limited_to_its_consumed_memory(
    node: SimNode,
) -> None:
    shared_node(node, "memory")
    uuid = node.uuid()
    manager = node.manager()
    a = manager.prepare_group("claim-a", None, [gpu_share(node, SHARE_A, memory="4Gi")])
    b = manager.prepare_group("claim-b", None, [gpu_share(node, SHARE_B, memory="8Gi")])
    assert len(node.running_daemons()) == 1  # one server for the GPU's shares: they run at the same time
    seen = [sim_client(r.edits, node.root) for r in (a, b)]
    assert [v["pinnedDeviceMemoryLimits"] for v in seen] == [{uuid: "4096M"}, {uuid: "8192M"}]
    assert [v["activeThreadPercentage"] for v in seen] == [100, 100]  # no compute capacity: every SM
    assert seen[0]["serverPid"] == seen[1]["serverPid"]
    assert a.state["sharedMps"]["clients"] == [f"claim-a/gpu-0/{SHARE_A}"]
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.EXCLUSIVE_PROCESS)

    manager.unprepare_group("claim-a", a.state)  # one share gone, the other still served
    assert sim_client(b.edits, node.root)["pinnedDeviceMemoryLimits"] == {uuid: "8192M"}
    manager.unprepare_group("claim-b", b.state)
    assert node.leftovers() == [] and node.gpu_state(uuid).compute_mode == int(ComputeMode.DEFAULT)


def test_an_mps_config_on_a_consumable_share_joins_the_gpus_server(node: SimNode) -> None:
    """NVIDIA's consumable shares with an MPS config: each claim a client of one server, held to its config
    (NVIDIA refuses MPS under consumable shares; here the clients of one server run at the same time)."""
    shared_node(node, "4")
    config = mps(
        '{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS",'
        '"mpsConfig":{"defaultActiveThreadPercentage":25}}}'
    )
    manager = node.manager()
    results = [
        manager.prepare_group(f"claim-{n}", config, [gpu_share(node, share, memory="0", shares="1")])
        for n, share in enumerate((SHARE_A, SHARE_B))
    ]
    seen = [sim_client(r.edits, node.root) for r in results]
    assert [v["activeThreadPercentage"] for v in seen] == [25, 25] and len(node.running_daemons()) == 1
    for n, result in enumerate(results):
        manager.unprepare_group(f"claim-{n}", result.state)
    assert node.leftovers() == []


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
    # with an MPS config the same share joins the GPU's shares server, the whole GPU's memory its limit
    config = mps(
        '{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS"}}'
    )
    plan = build_plan(config, devices, gpus(node))
    assert plan.shares is not None and plan.shares.memory_bytes == gpus(node)[node.uuid()].memory_bytes


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
