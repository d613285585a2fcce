"""Fractional GPUs: one MPS daemon per claim, its limits (from consumedCapacity) set on that daemon."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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


def test_each_tenant_has_its_own_daemon_pipe_and_shm_with_limits_on_the_daemon(node: SimNode) -> None:
    uuid = node.uuid()
    manager = node.manager()
    a = manager.prepare_group(
        "claim-a", None, [share(node, "30", "20Gi", "11111111-0000-0000-0000-000000000001")]
    )
    restarted = node.manager()  # the second share arrives after a plugin restart
    b = restarted.prepare_group(
        "claim-b", None, [share(node, "50", "40Gi", "11111111-0000-0000-0000-000000000002")]
    )
    da, db = a.state["mpsDaemon"], b.state["mpsDaemon"]
    assert da["id"] != db["id"] and pid_alive(da["pid"]) and pid_alive(db["pid"])
    assert len(node.running_daemons()) == 2
    # nothing shared between the tenants: not the pipe, not the /dev/shm tmpfs
    assert {m.host_path for m in a.edits.mounts}.isdisjoint({m.host_path for m in b.edits.mounts})
    assert da["shmDir"] != db["shmDir"] and da["shmMounted"] and db["shmMounted"]
    # the limits are the daemons' (a ceiling); the containers get only the pipe directory
    assert a.edits.env == b.edits.env == ("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",)
    records = node.mps_records()
    assert records[da["pipeDir"]]["default_active_thread_percentage"] == 30
    assert records[da["pipeDir"]]["default_pinned_mem_limits"] == {uuid: "20480M"}
    assert records[db["pipeDir"]]["default_active_thread_percentage"] == 50
    assert records[db["pipeDir"]]["default_pinned_mem_limits"] == {uuid: "40960M"}
    # several claims' daemons serve this GPU: it stays in DEFAULT compute mode
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.DEFAULT)
    assert a.state["sharedMps"]["ownDaemon"] is True

    restarted.unprepare_group("claim-a", a.state)
    assert not pid_alive(da["pid"]) and pid_alive(db["pid"])
    restarted.unprepare_group("claim-b", b.state)
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.DEFAULT)
    assert restarted.describe()["sharedMps"] == {}
    assert node.leftovers() == []


@pytest.mark.parametrize(
    ("tenant_env", "expected_threads", "expected_memory"),
    [
        ({}, 30, "20480M"),
        ({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}, 30, "20480M"),  # raising is ignored
        ({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}, 30, "20480M"),
        (
            {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1G"},
            10,
            "1024M",
        ),
    ],
)
def test_a_tenant_cannot_raise_its_share_from_its_container(
    node: SimNode, tenant_env: dict[str, str], expected_threads: int, expected_memory: str
) -> None:
    manager = node.manager()
    a = manager.prepare_group("claim-a", None, [share(node, "30", "20Gi", "s1")])
    b = manager.prepare_group("claim-b", None, [share(node, "50", "40Gi", "s2")])
    pipe = a.state["mpsDaemon"]["pipeDir"]  # what the container's /tmp/nvidia-mps is
    env = {**os.environ, **tenant_env, "CUDA_MPS_PIPE_DIRECTORY": pipe, "DRA_GPU_SIM_ROOT": str(node.root)}
    done = subprocess.run(
        [sys.executable, "-m", "dra_gpu.hardware.sim_tools.mps_client"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got == {
        "activeThreadPercentage": expected_threads,
        "pinnedDeviceMemoryLimits": {node.uuid(): expected_memory},
    }
    manager.unprepare_group("claim-a", a.state)
    manager.unprepare_group("claim-b", b.state)
    assert node.leftovers() == []


def test_two_shares_of_one_gpu_in_one_claim_are_summed(node: SimNode) -> None:
    manager = node.manager()
    devices = [share(node, "10", "1Gi", "s1"), share(node, "15", "2Gi", "s2")]
    result = manager.prepare_group("claim-a", None, devices)
    record = node.mps_records()[result.state["mpsDaemon"]["pipeDir"]]
    assert record["default_active_thread_percentage"] == 25
    assert record["default_pinned_mem_limits"] == {node.uuid(): "3072M"}
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
    record = node.mps_records()[result.state["mpsDaemon"]["pipeDir"]]
    assert record["default_active_thread_percentage"] == 20
    assert record["default_pinned_mem_limits"] == {node.uuid(): "4096M"}
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


def test_a_dead_tenant_daemon_is_restarted_by_reconcile_with_its_limits(node: SimNode) -> None:
    manager = node.manager()
    a = manager.prepare_group("a", None, [share(node, "10", "1Gi", "s1")])
    b = manager.prepare_group("b", None, [share(node, "20", "2Gi", "s2")])
    old_pid: int = a.state["mpsDaemon"]["pid"]
    os.kill(old_pid, signal.SIGKILL)
    report = manager.reconcile_mps([a.state, b.state])
    assert report.restarted == [a.state["mpsDaemon"]["id"]] and report.failed == {}
    latest = manager._mps.latest(a.state["mpsDaemon"])
    assert latest["pid"] != old_pid and pid_alive(latest["pid"])
    assert latest["pipeDir"] == a.state["mpsDaemon"]["pipeDir"]
    assert manager._mps.limits_in_force(latest) == {
        "threadPercentage": 10,
        "pinnedLimits": {node.uuid(): "1024M"},
    }
    assert manager.reconcile_mps([a.state, b.state]).restarted == []
    manager.unprepare_group("a", a.state)
    manager.unprepare_group("b", b.state)
    assert node.leftovers() == []
