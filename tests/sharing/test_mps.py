"""MPS on the simulator: a real daemon process per group, limits through the control pipe, complete undo."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
from sim_node import SimNode, pid_alive

from dra_gpu.config.api import decode_opaque_config
from dra_gpu.hardware.sim_tools.mps_records import pipe_dir_key
from dra_gpu.hardware.types import ComputeMode
from dra_gpu.sharing import mps as mps_module
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

    # Limits live on the daemon only: a client env could only lower them, and the user's pod env may. The
    # container mounts the daemon's clients/ directory; its pipe is clients/pipe (placed once limited).
    assert result.edits.env == ("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps/pipe",)
    assert [(m.host_path, m.container_path) for m in result.edits.mounts] == [
        (daemon["clientsDir"], "/tmp/nvidia-mps"),
        (daemon["shmDir"], "/dev/shm"),
    ]
    assert result.state["edits"]["env"] == list(result.edits.env)

    key = pipe_dir_key(daemon["pipeDir"])  # the directory goes with the daemon: its record stays by key
    manager.unprepare_group("claim-1", result.state)
    record = node.mps_records()[key]
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
    assert result.edits.env == ("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps/pipe",)
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


def _environ(pid: int) -> dict[str, str]:
    items = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    return dict(item.split("=", 1) for item in items if "=" in item)


def test_the_daemon_starts_with_its_thread_limit_in_its_own_environment(
    make_node: Callable[[str], SimNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread limit is the daemon's from its first moment (MPS docs 4.2.5, control daemon level), also
    when it is started again without the plugin; the pinned limit goes by command (a real daemon ignores it in
    its environment). What the plugin process itself inherited never reaches a daemon."""
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "5")
    monkeypatch.setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=1M")
    node = make_node("dgx-h100")
    manager = node.manager()
    config = mps_config(
        defaultActiveThreadPercentage=40,
        defaultPinnedDeviceMemoryLimit="4Gi",
        defaultPerDevicePinnedMemoryLimit={"1": "8Gi"},
    )
    limited = manager.prepare_group("claim-1", config, [node.alloc(f"gpu-{m}") for m in (0, 1)])
    daemon = limited.state["mpsDaemon"]
    environ = _environ(daemon["pid"])
    assert environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in environ
    assert sorted(manager._mps.limits_in_force(daemon)["pinnedLimits"].values()) == ["4096M", "8192M"]

    plain = manager.prepare_group("claim-2", mps_config(), [node.alloc("gpu-2")])
    environ = _environ(plain.state["mpsDaemon"]["pid"])
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in environ
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in environ
    held = manager._mps.limits_in_force(plain.state["mpsDaemon"])
    assert held["threadPercentage"] == 100 and set(held["pinnedLimits"].values()) == {""}
    manager.unprepare_group("claim-1", limited.state)
    manager.unprepare_group("claim-2", plain.state)
    assert node.leftovers() == []


def test_limits_are_read_in_the_real_tools_notation() -> None:
    """The real control binary answers `25.0` and e.g. `4G`; the record holds `4096M`."""
    from dra_gpu.sharing.mps import _memory_mib

    assert _memory_mib("4G") == _memory_mib("4096M") == _memory_mib("4.0G") == 4096
    assert _memory_mib("0") is None and _memory_mib("") is None


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
    [  # (a limit larger than the device is clamped, not refused: see the MIG clamp test below)
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
    assert result.edits.env == ("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps/pipe",)
    manager.unprepare_group("claim-1", result.state)
    assert node.leftovers() == []
    assert node.state().gpus[0].gpu_instances == []
    assert node.state().gpus[0].mig_current is False  # switched on for the claim, off again afterwards


def test_a_mig_device_whose_daemon_was_killed_with_its_server_is_destroyed_at_unprepare(
    node: SimNode,
) -> None:
    """Found by the soak (issue 36): a MIG + MPS claim's daemon SIGKILLed while its server ran (a client had
    spawned it), then unprepared: the MIG device stayed for good ("still in use", by a server that died with
    its daemon), its placement lost. An MPS server does not outlive its control daemon, so NVML no longer
    counts it."""
    from tests.support.container_view import sim_client

    mig = next(d for d in node.model().devices if d.kind.value == "mig-dynamic")
    manager = node.manager()
    config = mps_config("MigDeviceConfig", defaultActiveThreadPercentage=50)
    result = manager.prepare_group("claim-1", config, [node.alloc(mig.name)])
    assert sim_client(result.edits, node.root)["mps"]  # spawns the server: a context on the MIG device
    os.kill(daemon_record(node, result)["pid"], signal.SIGKILL)
    manager.unprepare_group("claim-1", result.state)
    assert node.state().gpus[0].gpu_instances == []
    assert node.leftovers() == []


def test_mig_mps_limit_larger_than_the_mig_device_is_clamped_and_logged(node: SimNode) -> None:
    # NVIDIA's driver accepts any limit of at least 1 MiB (api/.../sharing.go, limit.Megabyte); MPS cannot pin
    # more than the device has, so the limit becomes the MIG device's memory and a warning says so.
    mig = next(
        d
        for d in node.model().devices
        if d.kind.value == "mig-dynamic" and d.mig and d.mig.profile == "1g.10gb"
    )
    config = mps_config("MigDeviceConfig", defaultPinnedDeviceMemoryLimit="20Gi")
    manager = node.manager()
    with structlog.testing.capture_logs() as logs:
        result = manager.prepare_group("claim-1", config, [node.alloc(mig.name)])
    instance = result.mig_instances[mig.name]
    memory_mib = mig.capacity["memory"].value // 2**20
    assert daemon_record(node, result)["default_pinned_mem_limits"] == {instance.uuid: f"{memory_mib}M"}
    warning = next(e for e in logs if e["event"] == "MPS pinned memory limit clamped")
    assert warning["log_level"] == "warning" and warning["claim_uid"] == "claim-1"
    assert "defaultPinnedDeviceMemoryLimit: limit 20Gi is larger than device MIG-" in warning["detail"]
    manager.unprepare_group("claim-1", result.state)
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
    shares_daemon = manager.describe()["sharedMps"][node.uuid()]["daemon"]
    old = [group.state["mpsDaemon"]["pid"], shares_daemon["pid"]]
    for pid in old:  # what a container restart does to the plugin's children
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.1)
    shm = group.state["mpsDaemon"]["shmDir"]
    restarted = node.manager()
    revived = restarted.revive_mps([group.state, share.state])
    assert sorted(revived) == sorted([group.state["mpsDaemon"]["id"], shares_daemon["id"]])
    assert restarted.revive_mps([group.state, share.state]) == []  # they answer now
    record = daemon_record(node, group)
    assert record["running"] and record["pid"] not in old
    assert record["default_active_thread_percentage"] == 40
    assert record["default_pinned_mem_limits"] == {node.uuid(): "2048M"}
    assert os.path.realpath(shm) in node.mounts_under_plugin_dir()  # the same tmpfs the containers see
    # the checkpoint still has the old pid: the record next to the daemon (new pid + start time) wins
    restarted.unprepare_group("claim-1", group.state)
    restarted.unprepare_group("claim-2", share.state)
    assert node.leftovers() == []


def test_a_reused_pid_in_the_record_is_never_signalled(node: SimNode) -> None:
    """Claim A's daemon died and its pid now belongs to claim B's daemon (an MPS control process too):
    A's unprepare must not touch it. The pid in A's record and pid file is B's; the start time is A's."""
    manager = node.manager()
    a = manager.prepare_group("claim-a", mps_config(), [node.alloc("gpu-0")])
    b = manager.prepare_group(
        "claim-b",
        None,
        [node.alloc("gpu-0-shared", share_id="s", consumed_capacity={"compute": "5", "memory": "1Gi"})],
    )
    b_daemon = manager.describe()["sharedMps"][node.uuid()]["daemon"]  # the GPU's shares daemon
    a_daemon, b_pid = a.state["mpsDaemon"], b_daemon["pid"]
    os.kill(a_daemon["pid"], signal.SIGKILL)
    time.sleep(0.1)
    saved = json.loads((Path(a_daemon["dir"]) / "record.json").read_text())
    saved["pid"] = b_pid  # what a reused pid looks like from A's side
    (Path(a_daemon["dir"]) / "record.json").write_text(json.dumps(saved))
    (Path(a_daemon["pipeDir"]) / "nvidia-cuda-mps-control.pid").write_text(f"{b_pid}\n")
    reused = {**a_daemon, "pid": b_pid}
    manager.unprepare_group("claim-a", {**a.state, "mpsDaemon": reused})
    assert pid_alive(b_pid)
    assert manager._mps.alive(b_daemon)
    manager.unprepare_group("claim-b", b.state)
    assert node.leftovers() == []


def test_a_daemon_killed_by_hand_is_back_with_the_same_limits(node: SimNode) -> None:
    manager = node.manager()
    config = mps_config(
        defaultActiveThreadPercentage=40, defaultPinnedDeviceMemoryLimit="2Gi", multiUser=True
    )
    result = manager.prepare_group("claim-1", config, [node.alloc("gpu-0")])
    daemon = result.state["mpsDaemon"]
    assert daemon["multiUser"] is True and daemon_record(node, result)["multi_user"] is True
    os.kill(daemon["pid"], signal.SIGKILL)
    time.sleep(0.05)
    started = time.monotonic()
    report = manager.reconcile_mps([result.state])
    assert report.restarted == [daemon["id"]] and time.monotonic() - started < 10
    latest = manager._mps.latest(daemon)
    assert latest["pid"] != daemon["pid"] and latest["pipeDir"] == daemon["pipeDir"]
    assert manager._mps.limits_in_force(latest) == {
        "threadPercentage": 40,
        "pinnedLimits": {node.uuid(): "2048M"},  # the tool answers "2G": read back in the record's notation
    }
    assert daemon_record(node, result)["multi_user"] is True
    assert node.gpu_state(node.uuid()).compute_mode == int(ComputeMode.EXCLUSIVE_PROCESS)
    manager.unprepare_group("claim-1", result.state)
    assert node.leftovers() == []


def test_a_daemon_that_cannot_be_restarted_is_reported(node: SimNode) -> None:
    manager = node.manager(mps_ready_timeout_s=0.3)
    result = manager.prepare_group("claim-1", mps_config(), [node.alloc("gpu-0")])
    os.kill(result.state["mpsDaemon"]["pid"], signal.SIGKILL)
    time.sleep(0.05)
    original = (node.root / "usr" / "bin" / "nvidia-cuda-mps-control").read_text()
    _replace_control_binary(node, 'echo "broken driver" >&2; exit 1')
    report = manager.reconcile_mps([result.state])
    assert list(report.failed) == [result.state["mpsDaemon"]["id"]]
    gpus, error = report.failed[result.state["mpsDaemon"]["id"]]
    assert gpus == [node.uuid()] and "broken driver" in error
    _replace_control_binary(node, original.removeprefix("#!/bin/sh\n"))
    manager.unprepare_group("claim-1", result.state)
    assert node.leftovers() == []


def test_a_restart_that_fails_after_the_daemon_started_leaves_no_daemon_running(
    node: SimNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the soak (tests/soak): a killed daemon restarted on a full disk started, then saving its
    record failed; the new daemon was left running in `stage/`, the next pass cleared `stage/` and started
    another, and so on: one orphaned daemon per reconcile pass. A failed restart now stops what it started."""
    manager = node.manager()
    result = manager.prepare_group("claim-1", mps_config(), [node.alloc("gpu-0")])
    os.kill(result.state["mpsDaemon"]["pid"], signal.SIGKILL)
    time.sleep(0.05)
    save = mps_module._save_record

    def disk_full(record: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mps_module, "_save_record", disk_full)
    report = manager.reconcile_mps([result.state])
    assert list(report.failed) == [result.state["mpsDaemon"]["id"]]
    assert node.running_daemons() == []  # the daemon it started is stopped, not orphaned
    monkeypatch.setattr(mps_module, "_save_record", save)
    assert manager.reconcile_mps([result.state]).restarted == [result.state["mpsDaemon"]["id"]]
    assert len(node.running_daemons()) == 1
    manager.unprepare_group("claim-1", result.state)
    assert node.leftovers() == []


class _Killed(BaseException):
    """The plugin process dies here (nothing after it runs, no handler catches it)."""


def test_a_restart_killed_after_launching_leaves_no_daemon_behind(
    node: SimNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the soak (tests/soak): the plugin killed while the reconcile pass restarted a daemon (after
    launching it, before it was put in place) left that daemon running in `stage/`; the next plugin's pass
    cleared `stage/` and started another: the first one ran on, orphaned. It is stopped first now."""
    manager = node.manager()
    result = manager.prepare_group("claim-1", mps_config(), [node.alloc("gpu-0")])
    os.kill(result.state["mpsDaemon"]["pid"], signal.SIGKILL)
    time.sleep(0.05)

    def killed(*args: object, **kwargs: object) -> None:
        raise _Killed

    monkeypatch.setattr(manager._mps, "_wait_ready", killed)
    with pytest.raises(_Killed):
        manager.reconcile_mps([result.state])
    monkeypatch.undo()
    assert len(node.running_daemons()) == 1  # launched in stage/, never placed

    restarted = node.manager()  # the plugin again
    assert restarted.reconcile_mps([result.state]).restarted == [result.state["mpsDaemon"]["id"]]
    assert len(node.running_daemons()) == 1  # the new one only
    restarted.unprepare_group("claim-1", result.state)
    assert node.leftovers() == []


def test_a_server_whose_gpu_fell_off_the_bus_is_gone_and_a_process_outside_mps_stays_refused(
    node: SimNode,
) -> None:
    """Found by the soak: after a GPU fell off the bus and came back, its MPS server's context was gone, yet
    the simulated daemon kept handing that server to new clients, so nothing held the GPU and a process
    outside MPS got it in EXCLUSIVE_PROCESS. A server does not outlive its device: the next client gets a new
    server, which holds the GPU again."""
    from tests.support.container_view import sim_client

    uuid = node.uuid()
    manager = node.manager()
    result = manager.prepare_group(
        "claim-1", mps_config(defaultActiveThreadPercentage=30), [node.alloc("gpu-0")]
    )
    first = sim_client(result.edits, node.root)
    nvml = node.hardware.nvml_module()
    nvml.lose_gpu(0)
    nvml.recover_gpu(0)
    again = sim_client(result.edits, node.root)
    assert again["mps"] and again["activeThreadPercentage"] == 30 and again["serverPid"] != first["serverPid"]
    bare = sim_client(result.edits, node.root, "--gpu", uuid, env={"CUDA_MPS_PIPE_DIRECTORY": "/tmp/none"})
    assert "busy or unavailable" in bare.get("error", ""), bare
    manager.unprepare_group("claim-1", result.state)
    assert node.leftovers() == []


def test_unprepare_on_a_vanished_gpu_finishes_and_is_cleaned_when_it_returns(node: SimNode) -> None:
    uuid = node.uuid()
    node.hardware.set_compute_mode(uuid, ComputeMode.PROHIBITED)
    manager = node.manager()
    result = manager.prepare_group("claim-1", mps_config(), [node.alloc("gpu-0")])
    nvml = node.hardware.nvml_module()
    nvml.lose_gpu(0)
    started = time.monotonic()
    manager.unprepare_group("claim-1", result.state)  # no exception: the kubelet can finish the pod
    assert time.monotonic() - started < 10
    assert node.leftovers() == []
    assert manager.pending_cleanup() == {uuid: ["compute mode PROHIBITED to restore"]}
    assert manager.reconcile_mps([]).restored_modes == []  # still gone
    nvml.recover_gpu(0)
    # back on the bus with the mode the claim set: only the driver's pending restore puts PROHIBITED back
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.EXCLUSIVE_PROCESS)
    assert manager.reconcile_mps([]).restored_modes == [uuid]
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.PROHIBITED)
    assert manager.pending_cleanup() == {}


MPS_PREPARE_STEPS = [
    "mps-record-written",
    "mps-shm-mounted",
    "mps-compute-mode-set",
    "mps-daemon-started",
    "mps-limits-set",
]
MPS_UNPREPARE_STEPS = ["mps-quit-sent", "mps-shm-unmounted", "mps-modes-restored"]

_CRASH_SCRIPT = """
import json, os, signal, sys
from sim_node import SimNode
from dra_gpu.config.api import decode_opaque_config
from pathlib import Path
hardware, root, plugin_dir, step, action, state = sys.argv[1:7]
node = SimNode(hardware, root=Path(root), plugin_dir=Path(plugin_dir))
def crash(at):
    if at == step:
        os.kill(os.getpid(), signal.SIGKILL)
manager = node.manager(faults=crash)
if action == "prepare":
    config = decode_opaque_config({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}})
    manager.prepare_group("claim-1", config, [node.alloc("gpu-0")])
else:
    manager.unprepare_group("claim-1", json.loads(state))
"""


def _crash_at(node: SimNode, step: str, action: str, state: str = "{}") -> None:
    env = {
        **os.environ,
        "PYTHONPATH": f"{Path(__file__).parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _CRASH_SCRIPT,
            node.hardware_name,
            str(node.root),
            str(node.plugin_dir),
            step,
            action,
            state,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr


@pytest.mark.parametrize("step", MPS_PREPARE_STEPS)
def test_a_crash_at_each_prepare_step_leaves_nothing_after_restart(node: SimNode, step: str) -> None:
    uuid = node.uuid()
    node.hardware.set_compute_mode(uuid, ComputeMode.PROHIBITED)
    _crash_at(node, step, "prepare")
    assert node.leftovers() != []  # something was begun (at least the record)
    restarted = node.manager()  # the plugin's start-up: no checkpoint names the daemon
    restarted.stop_unowned_mps([])
    assert node.leftovers() == []
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.PROHIBITED)
    result = restarted.prepare_group("claim-2", mps_config(), [node.alloc("gpu-0")])  # and it works again
    restarted.unprepare_group("claim-2", result.state)
    assert node.leftovers() == []


@pytest.mark.parametrize("step", MPS_UNPREPARE_STEPS)
def test_a_crash_at_each_unprepare_step_is_finished_by_the_retry(node: SimNode, step: str) -> None:
    uuid = node.uuid()
    node.hardware.set_compute_mode(uuid, ComputeMode.PROHIBITED)
    result = node.manager().prepare_group("claim-1", mps_config(), [node.alloc("gpu-0")])
    _crash_at(node, step, "unprepare", json.dumps(result.state))
    node.manager().unprepare_group("claim-1", result.state)  # the kubelet retries after the restart
    assert node.leftovers() == []
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.PROHIBITED)


def test_the_hardware_state_reports_a_killed_daemon_as_not_running(node: SimNode) -> None:
    """`dra-gpu hardware state` (what the e2e checks read) says what a `ps` would: a SIGKILLed daemon, which
    could not mark its own record stopped, does not run."""
    from dra_gpu.hardware.sim_driver_root import state_report

    manager = node.manager()
    result = manager.prepare_group("claim-1", mps_config(), [node.alloc("gpu-0")])
    key = pipe_dir_key(result.state["mpsDaemon"]["pipeDir"])
    assert state_report(node.root)["mps"][key]["running"] is True
    os.kill(result.state["mpsDaemon"]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pid_alive(result.state["mpsDaemon"]["pid"]):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    record = state_report(node.root)["mps"][key]
    assert record["running"] is False and record["killed"] is True
    manager.unprepare_group("claim-1", result.state)
    assert node.leftovers() == []
