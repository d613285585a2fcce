"""Fractional GPUs: clients of their GPU's one MPS server, each held to its share (seen from inside)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest
from sim_node import SimNode, pid_alive

from dra_gpu.config.api import decode_opaque_config
from dra_gpu.sharing.interface import AllocatedDevice, SharingError
from tests.support.container_view import sim_client

GIB = 2**30


def share(node: SimNode, compute: str, memory: str, share_id: str, minor: int = 0) -> AllocatedDevice:
    return node.alloc(
        f"gpu-{minor}-shared", share_id=share_id, consumed_capacity={"compute": compute, "memory": memory}
    )


@pytest.mark.parametrize(
    ("tenant_env", "expected_threads", "expected_memory"),
    [
        ({}, 30, "20480M"),
        ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}, 50, "20480M"),  # up to the server's caps only
        ({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}, 30, "40960M"),
        (
            {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1G"},
            10,
            "1024M",
        ),
    ],
)
def test_a_tenant_cannot_raise_its_share_beyond_the_largest_share_on_its_gpu(
    node: SimNode, tenant_env: dict[str, str], expected_threads: int, expected_memory: str
) -> None:
    """Seen from the tenant's container: its own share by default; its env lowers it; raising it in the pod
    spec reaches no more than the server's caps, the largest share on the GPU (claim-b's 50 % / 40Gi)."""
    manager = node.manager()
    a = manager.prepare_group("claim-a", None, [share(node, "30", "20Gi", "s1")])
    b = manager.prepare_group("claim-b", None, [share(node, "50", "40Gi", "s2")])
    got = sim_client(a.edits, node.root, env=tenant_env, uid=1000)
    assert got["mps"], got
    assert got["activeThreadPercentage"] == expected_threads
    assert got["pinnedDeviceMemoryLimits"] == {node.uuid(): expected_memory}
    manager.unprepare_group("claim-a", a.state)
    manager.unprepare_group("claim-b", b.state)
    assert node.leftovers() == []


def test_two_shares_of_one_gpu_in_one_claim_are_summed(node: SimNode) -> None:
    manager = node.manager()
    devices = [share(node, "10", "1Gi", "s1"), share(node, "15", "2Gi", "s2")]
    result = manager.prepare_group("claim-a", None, devices)
    got = sim_client(result.edits, node.root)
    assert (got["activeThreadPercentage"], got["pinnedDeviceMemoryLimits"]) == (25, {node.uuid(): "3072M"})
    assert sorted(result.state["sharedMps"]["clients"]) == [
        "claim-a/gpu-0-shared/s1",
        "claim-a/gpu-0-shared/s2",
    ]
    manager.unprepare_group("claim-a", result.state)
    assert node.leftovers() == []


def test_explicit_mps_config_only_tightens_a_share(node: SimNode) -> None:
    config = decode_opaque_config(
        {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {
                "strategy": "MPS",
                "mpsConfig": {"defaultActiveThreadPercentage": 20, "defaultPinnedDeviceMemoryLimit": "4Gi"},
            },
        }
    )
    manager = node.manager()
    result = manager.prepare_group("c", config, [share(node, "50", "8Gi", "s1")])
    got = sim_client(result.edits, node.root)
    assert (got["activeThreadPercentage"], got["pinnedDeviceMemoryLimits"]) == (20, {node.uuid(): "4096M"})
    manager.unprepare_group("c", result.state)


@pytest.mark.parametrize(
    ("consumed", "words"),
    [
        ({"compute": "10"}, ["no consumedCapacity 'memory'", "DRAConsumableCapacity"]),
        ({"compute": "lots", "memory": "1Gi"}, ["consumedCapacity compute", "quantity"]),
        ({"compute": "0", "memory": "1Gi"}, ["must be > 0"]),
    ],
)
def test_bad_consumed_capacity_is_refused(node: SimNode, consumed: dict[str, str], words: list[str]) -> None:
    device = node.alloc("gpu-0-shared", share_id="s1", consumed_capacity=consumed)
    with pytest.raises(SharingError) as info:
        node.manager().prepare_group("c", None, [device])
    for word in words:
        assert word in str(info.value)
    assert node.leftovers() == []


def test_time_slicing_on_a_share_is_refused(node: SimNode) -> None:
    config = decode_opaque_config(
        {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing"},
        }
    )
    with pytest.raises(SharingError, match=r"gpu-0-shared .*enforced with MPS"):
        node.manager().prepare_group("c", config, [share(node, "10", "1Gi", "s1")])
    assert node.leftovers() == []


def test_shares_of_two_gpus_in_one_group_are_refused(make_node: Callable[[str], SimNode]) -> None:
    node = make_node("dgx-h100")
    devices = [share(node, "10", "1Gi", "s1", minor=0), share(node, "10", "1Gi", "s2", minor=1)]
    with pytest.raises(SharingError, match="shares of one GPU only"):
        node.manager().prepare_group("c", None, devices)
    with pytest.raises(SharingError, match="shares of one GPU only"):
        node.manager().prepare_group("c", None, [devices[0], node.alloc("gpu-2")])
    assert node.leftovers() == []


def test_a_dead_shares_daemon_is_restarted_by_reconcile_with_its_limits(node: SimNode) -> None:
    manager = node.manager()
    a = manager.prepare_group("a", None, [share(node, "10", "1Gi", "s1")])
    b = manager.prepare_group("b", None, [share(node, "20", "2Gi", "s2")])
    daemon = manager.describe()["sharedMps"][node.uuid()]["daemon"]
    os.kill(daemon["pid"], signal.SIGKILL)
    report = manager.reconcile_mps([a.state, b.state])
    assert report.restarted == [daemon["id"]] and report.failed == {}
    latest = manager._mps.latest(daemon)
    assert latest["pid"] != daemon["pid"] and pid_alive(latest["pid"])
    assert latest["clientsDir"] == daemon["clientsDir"]  # what the containers mounted
    assert manager._mps.limits_in_force(latest) == {
        "threadPercentage": 20,
        "pinnedLimits": {node.uuid(): "2048M"},
    }
    for result, threads in ((a, 10), (b, 20)):
        assert sim_client(result.edits, node.root)["activeThreadPercentage"] == threads
    assert manager.reconcile_mps([a.state, b.state]).restarted == []
    manager.unprepare_group("a", a.state)
    manager.unprepare_group("b", b.state)
    assert node.leftovers() == []
