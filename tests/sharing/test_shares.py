"""Fractional GPUs: one MPS daemon per GPU shared by its shares, per-share limits from consumedCapacity."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sim_node import SimNode, pid_alive

from dra_gpu.config.api import decode_opaque_config
from dra_gpu.hardware.types import ComputeMode
from dra_gpu.sharing.interface import AllocatedDevice, SharingError

GIB = 2**30


def share(node: SimNode, compute: str, memory: str, share_id: str, minor: int = 0) -> AllocatedDevice:
    return node.alloc(
        f"gpu-{minor}-shared", share_id=share_id, consumed_capacity={"compute": compute, "memory": memory}
    )


def test_shares_of_one_gpu_share_one_daemon_until_the_last_leaves(node: SimNode) -> None:
    uuid = node.uuid()
    manager = node.manager()
    a = manager.prepare_group(
        "claim-a", None, [share(node, "30", "20Gi", "11111111-0000-0000-0000-000000000001")]
    )
    daemon = manager.describe()["sharedMps"][uuid]["daemon"]
    assert pid_alive(daemon["pid"])
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.EXCLUSIVE_PROCESS)
    assert a.edits.env == (
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
        f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={uuid}=20480M",
    )
    assert a.edits.mounts[0].host_path == daemon["pipeDir"]

    restarted = node.manager()  # the second share arrives after a plugin restart
    b = restarted.prepare_group(
        "claim-b", None, [share(node, "50", "40Gi", "11111111-0000-0000-0000-000000000002")]
    )
    assert restarted.describe()["sharedMps"][uuid]["daemon"]["pid"] == daemon["pid"]  # same daemon
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in b.edits.env
    assert b.edits.mounts == a.edits.mounts
    assert len(node.running_daemons()) == 1

    restarted.unprepare_group("claim-a", a.state)
    assert pid_alive(daemon["pid"])  # claim-b still uses it
    restarted.unprepare_group("claim-b", b.state)
    assert not pid_alive(daemon["pid"])
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.DEFAULT)
    assert restarted.describe()["sharedMps"] == {}
    assert node.leftovers() == []


def test_two_shares_of_one_gpu_in_one_claim_are_summed(node: SimNode) -> None:
    manager = node.manager()
    devices = [share(node, "10", "1Gi", "s1"), share(node, "15", "2Gi", "s2")]
    result = manager.prepare_group("claim-a", None, devices)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in result.edits.env
    assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={node.uuid()}=3072M" in result.edits.env
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
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20" in result.edits.env
    assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={node.uuid()}=4096M" in result.edits.env
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


def test_a_dead_shared_daemon_is_restarted_for_the_next_share(node: SimNode) -> None:
    import os
    import signal

    manager = node.manager()
    a = manager.prepare_group("a", None, [share(node, "10", "1Gi", "s1")])
    old_pid: int = manager.describe()["sharedMps"][node.uuid()]["daemon"]["pid"]
    os.kill(old_pid, signal.SIGKILL)
    b = manager.prepare_group("b", None, [share(node, "10", "1Gi", "s2")])
    new_pid = manager.describe()["sharedMps"][node.uuid()]["daemon"]["pid"]
    assert new_pid != old_pid and pid_alive(new_pid)
    manager.unprepare_group("a", a.state)
    manager.unprepare_group("b", b.state)
    assert node.leftovers() == []
