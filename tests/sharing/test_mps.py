"""MPS on the simulator: a real daemon process per group, limits through the control pipe, complete undo."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sim_node import SimNode, pid_alive

from dra_gpu.config.api import decode_opaque_config
from dra_gpu.hardware.types import ComputeMode
from dra_gpu.sharing.interface import GroupResult, SharingError
from dra_gpu.sharing.manager import group_daemon_id

GIB = 2**30


def mps_config(kind: str = "GpuConfig", **mps: Any) -> object:
    sharing: dict[str, Any] = {"strategy": "MPS"}
    if mps:
        sharing["mpsConfig"] = mps
    return decode_opaque_config(
        {"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind, "sharing": sharing}
    )


def daemon_record(node: SimNode, result: GroupResult) -> dict[str, Any]:
    return node.mps_records()[result.state["mpsDaemon"]["pipeDir"]]


def test_daemon_with_limits_and_complete_undo(node: SimNode) -> None:
    uuid = node.uuid()
    node.hardware.set_compute_mode(uuid, ComputeMode.PROHIBITED)
    manager = node.manager()
    config = mps_config(defaultActiveThreadPercentage=50, defaultPinnedDeviceMemoryLimit="10Gi")
    result = manager.prepare_group("claim-1", config, [node.alloc("gpu-0")])

    daemon = result.state["mpsDaemon"]
    assert daemon["id"] == group_daemon_id("claim-1", [uuid])
    assert Path(daemon["dir"]) == node.plugin_dir / "mps" / daemon["id"]
    record = daemon_record(node, result)
    assert record["running"] is True and pid_alive(record["pid"]) and record["pid"] == daemon["pid"]
    assert record["visible_devices"] == [uuid]
    assert record["default_active_thread_percentage"] == 50
    assert record["default_pinned_mem_limits"] == {uuid: "10240M"}
    assert [c["command"] for c in record["commands"]][-2:] == [
        "set_default_active_thread_percentage 50",
        f"set_default_device_pinned_mem_limit {uuid} 10240M",
    ]
    assert (Path(daemon["logDir"]) / "control.log").read_text().count("Starting control daemon") == 1
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.EXCLUSIVE_PROCESS)
    assert daemon["computeModes"] == {uuid: int(ComputeMode.PROHIBITED)}
    assert daemon["shmMounted"] is True
    assert os.path.realpath(daemon["shmDir"]) in node.mounts_under_plugin_dir()

    assert result.edits.env == (
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
        f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={uuid}=10240M",
    )
    assert [(m.host_path, m.container_path) for m in result.edits.mounts] == [
        (daemon["pipeDir"], "/tmp/nvidia-mps"),
        (daemon["shmDir"], "/dev/shm"),
    ]
    assert result.state["edits"]["env"] == list(result.edits.env)

    manager.unprepare_group("claim-1", result.state)
    record = daemon_record(node, result)
    assert record["running"] is False
    assert not pid_alive(record["pid"])
    assert record["commands"][-1]["command"] == "quit"
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.PROHIBITED)
    assert node.leftovers() == []
    manager.unprepare_group("claim-1", result.state)  # idempotent


def test_mps_without_limits_sets_none(node: SimNode) -> None:
    manager = node.manager()
    result = manager.prepare_group("claim-1", mps_config(), [node.alloc("gpu-0")])
    record = daemon_record(node, result)
    assert [c["command"] for c in record["commands"]] == ["get_server_list"]
    assert result.edits.env == ("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",)
    manager.unprepare_group("claim-1", result.state)


def test_per_device_limits_by_index_and_uuid(make_node: Callable[[str], SimNode]) -> None:
    node = make_node("dgx-h100")
    uuids = sorted(node.uuid(m) for m in (0, 1, 2))
    config = mps_config(
        defaultPinnedDeviceMemoryLimit="4Gi",
        defaultPerDevicePinnedMemoryLimit={"1": "8Gi", uuids[2]: "16Gi"},
    )
    manager = node.manager()
    result = manager.prepare_group("c", config, [node.alloc(f"gpu-{m}") for m in (0, 1, 2)])
    record = daemon_record(node, result)
    assert record["default_pinned_mem_limits"] == {uuids[0]: "4096M", uuids[1]: "8192M", uuids[2]: "16384M"}
    assert sorted(record["visible_devices"]) == uuids
    manager.unprepare_group("c", result.state)


def test_daemon_survives_a_plugin_restart(node: SimNode) -> None:
    result = node.manager().prepare_group("claim-1", mps_config(), [node.alloc("gpu-0")])
    pid = result.state["mpsDaemon"]["pid"]
    assert pid_alive(pid)
    restarted = node.manager()
    assert pid_alive(pid)
    restarted.unprepare_group("claim-1", result.state)
    assert not pid_alive(pid)
    assert node.leftovers() == []


def test_daemon_that_died_is_still_cleaned_up(node: SimNode) -> None:
    manager = node.manager()
    result = manager.prepare_group("claim-1", mps_config(), [node.alloc("gpu-0")])
    os.kill(result.state["mpsDaemon"]["pid"], signal.SIGKILL)
    time.sleep(0.1)
    manager.unprepare_group("claim-1", result.state)
    assert node.leftovers() == []
    assert node.gpu_state(node.uuid()).compute_mode == int(ComputeMode.DEFAULT)


def test_daemon_that_ignores_quit_is_killed(node: SimNode) -> None:
    manager = node.manager()
    result = manager.prepare_group("claim-1", mps_config(), [node.alloc("gpu-0")])
    pid = result.state["mpsDaemon"]["pid"]
    os.kill(pid, signal.SIGSTOP)  # a hung daemon: quit is never answered
    try:
        manager._mps._stop_timeout_s = 0.5  # keep the test short
        manager.unprepare_group("claim-1", result.state)
    finally:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert not pid_alive(pid)
    assert node.leftovers() == []


@pytest.mark.parametrize(
    ("mps", "words"),
    [
        (
            {"defaultPinnedDeviceMemoryLimit": "100Gi"},
            ["defaultPinnedDeviceMemoryLimit", "100Gi", "larger than"],
        ),
        ({"defaultPerDevicePinnedMemoryLimit": {"3": "1Gi"}}, ["index 3 is out of range"]),
        (
            {"defaultPerDevicePinnedMemoryLimit": {"GPU-00000000": "1Gi"}},
            ["not one of the allocated devices"],
        ),
    ],
)
def test_bad_limit_is_refused_and_nothing_is_left(
    node: SimNode, mps: dict[str, Any], words: list[str]
) -> None:
    manager = node.manager()
    with pytest.raises(SharingError) as info:
        manager.prepare_group("claim-1", mps_config(**mps), [node.alloc("gpu-0")])
    for word in words:
        assert word in str(info.value)
    assert node.leftovers() == []
    assert node.mps_records() == {}
    assert node.gpu_state(node.uuid()).compute_mode == int(ComputeMode.DEFAULT)


def _replace_control_binary(node: SimNode, script: str) -> None:
    shim = node.root / "usr" / "bin" / "nvidia-cuda-mps-control"
    shim.write_text("#!/bin/sh\n" + script + "\n")
    shim.chmod(0o755)


def test_daemon_that_fails_to_start_is_reported_and_undone(node: SimNode) -> None:
    _replace_control_binary(
        node, 'echo "nvidia-cuda-mps-control: driver/library version mismatch" >&2; exit 1'
    )
    manager = node.manager()
    with pytest.raises(SharingError, match=r"starting the MPS control daemon: .*version mismatch"):
        manager.prepare_group("claim-1", mps_config(), [node.alloc("gpu-0")])
    assert node.leftovers() == []
    assert node.gpu_state(node.uuid()).compute_mode == int(ComputeMode.DEFAULT)


def test_daemon_that_never_answers_times_out(node: SimNode) -> None:
    _replace_control_binary(
        node, 'if [ "$1" = "-d" ]; then exit 0; fi; echo "Cannot find MPS control daemon process" >&2; exit 1'
    )
    manager = node.manager(mps_ready_timeout_s=0.3)
    with pytest.raises(
        SharingError, match=r"did not become ready within 0.3s.*Cannot find MPS control daemon"
    ):
        manager.prepare_group("claim-1", mps_config(), [node.alloc("gpu-0")])
    assert node.leftovers() == []


def test_shm_without_mount_is_a_plain_directory(node: SimNode) -> None:
    manager = node.manager(mount_shm=False)
    result = manager.prepare_group("claim-1", mps_config(), [node.alloc("gpu-0")])
    assert result.state["mpsDaemon"]["shmMounted"] is False
    assert Path(result.state["mpsDaemon"]["shmDir"]).is_dir()
    assert node.mounts_under_plugin_dir() == []
    manager.unprepare_group("claim-1", result.state)


def test_mps_on_an_on_demand_mig_device(node: SimNode) -> None:
    mig = next(d for d in node.model().devices if d.kind.value == "mig-dynamic")
    manager = node.manager()
    config = mps_config(
        "MigDeviceConfig", defaultActiveThreadPercentage=25, defaultPinnedDeviceMemoryLimit="1Gi"
    )
    result = manager.prepare_group("claim-1", config, [node.alloc(mig.name)])
    instance = result.mig_instances[mig.name]
    record = daemon_record(node, result)
    assert record["visible_devices"] == [instance.uuid]
    assert record["default_pinned_mem_limits"] == {instance.uuid: "1024M"}
    assert node.gpu_state(node.uuid()).compute_mode == int(ComputeMode.DEFAULT)  # a MIG parent is left alone
    assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={instance.uuid}=1024M" in result.edits.env
    manager.unprepare_group("claim-1", result.state)
    assert node.leftovers() == []
    assert node.state().gpus[0].gpu_instances == []
    assert node.state().gpus[0].mig_current is False  # switched on for the claim, off again afterwards


def test_mig_mps_limit_larger_than_the_mig_device_rolls_back_the_creation(node: SimNode) -> None:
    mig = next(
        d
        for d in node.model().devices
        if d.kind.value == "mig-dynamic" and d.mig and d.mig.profile == "1g.10gb"
    )
    config = mps_config("MigDeviceConfig", defaultPinnedDeviceMemoryLimit="20Gi")
    with pytest.raises(SharingError, match="larger than device MIG-"):
        node.manager().prepare_group("claim-1", config, [node.alloc(mig.name)])
    assert node.state().gpus[0].gpu_instances == []
    assert node.state().gpus[0].mig_current is False
    assert node.leftovers() == []


def test_daemons_killed_with_the_plugin_container_are_revived_in_place(node: SimNode) -> None:
    config = mps_config(defaultActiveThreadPercentage=40, defaultPinnedDeviceMemoryLimit="2Gi")
    manager = node.manager()
    group = manager.prepare_group("claim-1", config, [node.alloc("gpu-0")])
    share = node.manager().prepare_group(
        "claim-2",
        None,
        [node.alloc("gpu-0-shared", share_id="s", consumed_capacity={"compute": "5", "memory": "1Gi"})],
    )
    old = [group.state["mpsDaemon"]["pid"], manager.describe()["sharedMps"][node.uuid()]["daemon"]["pid"]]
    for pid in old:  # what a container restart does to the plugin's children
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.1)
    shm = group.state["mpsDaemon"]["shmDir"]
    restarted = node.manager()
    revived = restarted.revive_mps([group.state, share.state])
    assert sorted(revived) == sorted([group.state["mpsDaemon"]["id"], "shared-gpu-0"])
    assert restarted.revive_mps([group.state, share.state]) == []  # they answer now
    record = daemon_record(node, group)
    assert record["running"] and record["pid"] not in old
    assert record["default_active_thread_percentage"] == 40
    assert record["default_pinned_mem_limits"] == {node.uuid(): "2048M"}
    assert os.path.realpath(shm) in node.mounts_under_plugin_dir()  # the same tmpfs the containers see
    restarted.unprepare_group(
        "claim-1", group.state
    )  # the checkpoint still has the old pid: the pid file wins
    restarted.unprepare_group("claim-2", share.state)
    assert node.leftovers() == []
