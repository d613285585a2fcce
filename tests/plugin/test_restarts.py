"""What a restart of the plugin's container does to prepared claims: MPS daemons that died with it come back
in place with their limits, and a CDI spec deleted by hand is written again from the checkpoint."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_gpu.hardware.types import ComputeMode
from tests.plugin.claim_view import workload
from tests.plugin.kubelet_client import ClaimId, KubeletClient, devices_of
from tests.plugin.plugin_harness import (
    ClaimFactory,
    PluginProcess,
    Result,
    SimNode,
    mps,
    opaque,
)
from tests.support.mps_view import RecordsByPipeDir

pytestmark = pytest.mark.apiserver

MIG_DEVICE = "gpu-1-mig-1g10gb-19-0"


def hardware_state(node: SimNode) -> dict[str, Any]:
    """What `dra-gpu hardware state -o json` reports: the same view an operator gets (its MPS records, keyed
    by pipe-directory identity, also found by a host path of the pipe directory)."""
    state: dict[str, Any] = json.loads(node.hardware_cli("state", "-o", "json"))
    state["mps"] = RecordsByPipeDir(state["mps"])
    return state


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} still alive"
        time.sleep(0.02)


def test_mps_daemon_killed_with_the_plugin_is_revived_on_restart(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    first = start_plugin()
    kubelet = KubeletClient(node.registration_socket)
    name, uid = claims.make("mps", [Result("gpu", "gpu-0")], [opaque(mps(40, "2Gi"), ["gpu"])])
    claim = ClaimId("mps", uid, name)
    answer = kubelet.prepare([claim])
    assert answer.claims[uid].error == ""
    kubelet.close()
    (group,) = node.checkpoint()["claims"][uid]["groups"]
    daemon = group["state"]["mpsDaemon"]
    gpu0 = node.sim_state().gpus[0].uuid
    before = hardware_state(node)["mps"][daemon["pipeDir"]]
    assert before["running"] is True and before["pid"] == daemon["pid"]
    assert before["default_active_thread_percentage"] == 40
    spec_before = json.loads((node.cdi_root / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())

    # A container restart: the plugin and the daemon it started die together.
    first.stop(signal.SIGKILL)
    os.kill(daemon["pid"], signal.SIGKILL)
    wait_gone(daemon["pid"])

    start_plugin()  # start-up runs before the sockets appear: the daemon is back once it answers
    after = hardware_state(node)["mps"][daemon["pipeDir"]]  # the same pipe path: containers keep their mount
    assert after["running"] is True and after["pid"] != daemon["pid"] and pid_alive(after["pid"])
    assert after["key"] != before["key"]  # a fresh directory, put in place once the daemon held its limits
    assert after["visible_devices"] == [gpu0]
    assert after["default_active_thread_percentage"] == 40
    assert after["default_pinned_mem_limits"] == {gpu0: "2048M"}
    commands = [c["command"] for c in after["commands"]]
    assert commands[:3] == [  # sent to the new daemon before it took the pipe's place
        "get_server_list",
        "set_default_active_thread_percentage 40",
        f"set_default_device_pinned_mem_limit {gpu0} 2048M",
    ], commands
    assert (Path(daemon["pipeDir"]) / "control").is_socket()
    assert node.gpu_compute_mode(gpu0) == int(ComputeMode.EXCLUSIVE_PROCESS)
    view = workload(node, uid)  # the claim's workload, through the spec written before the restart
    assert view["mps"] and view["gpus"] == [gpu0] and view["activeThreadPercentage"] == 40
    assert view["pinnedDeviceMemoryLimits"] == {gpu0: "2048M"}

    kubelet = KubeletClient(node.registration_socket)
    again = kubelet.prepare([claim])  # the kubelet repeats Prepare after a restart: answer and spec unchanged
    assert devices_of(again, uid) == devices_of(answer, uid)
    assert json.loads((node.cdi_root / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text()) == spec_before

    assert kubelet.unprepare([claim]).claims[uid].error == ""
    kubelet.close()
    wait_gone(after["pid"])
    final = hardware_state(node)["mps"][after["key"]]  # its directory is gone: found by its identity
    assert final["running"] is False
    assert not Path(daemon["dir"]).exists()
    assert node.gpu_compute_mode(gpu0) == int(ComputeMode.DEFAULT)
    assert node.checkpoint()["claims"] == {} and node.cdi_files() == []


def test_unowned_mps_daemon_is_stopped_at_start(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """Killed after starting the daemon but before checkpointing its group: the restart stops the daemon."""
    name, uid = claims.make("mps", [Result("gpu", "gpu-0")], [opaque(mps(), ["gpu"])])
    claim = ClaimId("mps", uid, name)
    doomed = start_plugin(env={"DRA_GPU_FAULT_KILL_AT": "prepare-group-0-applied"})
    kubelet = KubeletClient(node.registration_socket)
    with pytest.raises(grpc.RpcError):  # UNAVAILABLE: the plugin died mid-call
        kubelet.prepare([claim])
    kubelet.close()
    doomed.wait_dead()
    running = [(k, v["pid"]) for k, v in node.mps_records().items() if v.get("running")]
    assert len(running) == 1 and pid_alive(running[0][1])

    start_plugin()
    wait_gone(running[0][1])
    assert not node.mps_records()[running[0][0]]["running"]
    assert not (node.plugin_dir / "mps").exists() or list((node.plugin_dir / "mps").iterdir()) == []
    claims.delete("mps", name)


def test_deleted_cdi_spec_of_a_prepared_claim_is_rewritten(
    kubelet: KubeletClient, node: SimNode, claims: ClaimFactory
) -> None:
    name, uid = claims.make(
        "repair",
        [Result("gpu", "gpu-0"), Result("mig", MIG_DEVICE)],
        [opaque(mps(30, "1Gi"), ["gpu"])],
    )
    claim = ClaimId("repair", uid, name)
    answer = kubelet.prepare([claim])
    assert answer.claims[uid].error == ""
    path = node.cdi_root / f"k8s.gpu.nvidia.com-claim_{uid}.json"
    original = json.loads(path.read_text())
    mig_instances = node.mig_instances()

    path.unlink()  # by hand
    again = kubelet.prepare([claim])
    assert again.claims[uid].error == ""
    assert devices_of(again, uid) == devices_of(answer, uid)
    assert json.loads(path.read_text()) == original  # MPS mounts and env, MIG capability nodes included
    assert node.mig_instances() == mig_instances  # a repair, not a second prepare
    assert oct(path.stat().st_mode & 0o777) == "0o644"

    assert kubelet.unprepare([claim]).claims[uid].error == ""
    assert node.cdi_files() == [] and node.mig_instances() == []


def test_spec_of_a_device_the_node_lost_is_not_rebuilt_and_the_error_says_why(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    plugin = start_plugin()
    kubelet = KubeletClient(node.registration_socket)
    name, uid = claims.make("lost", [Result("gpu", "gpu-2")])
    claim = ClaimId("lost", uid, name)
    assert kubelet.prepare([claim]).claims[uid].error == ""

    node.hardware_cli("fault", "-i", "2")
    plugin.proc.send_signal(signal.SIGHUP)  # re-discover: GPU 2 is gone from the device model
    deadline = time.monotonic() + 20
    while "device inventory changed" not in plugin.log_path.read_text():
        assert time.monotonic() < deadline, plugin.log_tail()
        time.sleep(0.05)

    (node.cdi_root / f"k8s.gpu.nvidia.com-claim_{uid}.json").unlink()
    error = kubelet.prepare([claim]).claims[uid].error
    assert "CDI spec" in error and "no longer has device(s) gpu-2" in error
    assert node.cdi_files() == []
    assert kubelet.unprepare([claim]).claims[uid].error == ""
    assert node.checkpoint()["claims"] == {}
    kubelet.close()
