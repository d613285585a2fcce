"""The plugin killed (SIGKILL) while the shares of one GPU join or leave its one MPS server, then restarted
(issue 28): the shares that remain are served, as their workloads see them (each claim's CDI spec run as a
container), with their own limits; the server's caps are the largest share it serves; the GPU is
EXCLUSIVE_PROCESS while shares remain and DEFAULT after the last leaves; nothing is left once all are
unprepared."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_gpu.hardware.types import ComputeMode
from dra_gpu.sharing.manager import shared_daemon_id
from tests.plugin.claim_view import start_workload, workload
from tests.plugin.kubelet_client import ClaimId, KubeletClient
from tests.plugin.plugin_harness import ClaimFactory, PluginProcess, Result, SimNode

pytestmark = pytest.mark.apiserver

NS = "shares"
SMALL = (20, "8Gi", "8192M")
LARGE = (40, "16Gi", "16384M")

# Steps of the second share's prepare, in order: the GPU's server already runs for the first share.
JOIN_STEPS: list[Any] = [
    "prepare-started",
    "shares-client-added",  # counted in the registry (not yet saved)
    "mps-limits-recorded",  # caps grow: saved in the daemon's record, not yet sent (reconcile sends them)
    "prepare-group-0-applied",  # joined, not yet checkpointed
    "prepare-group-0",
    "prepare-cdi-written",
]
# Steps of the larger share's unprepare while the smaller one runs a workload.
LEAVE_STEPS: list[Any] = [
    "shares-client-removed",  # dropped from the registry (not yet saved)
    "mps-limits-recorded",  # caps shrink: saved, not yet sent (the reconcile pass sends them)
    "unprepare-group-0",
    "unprepare-cdi-removed",
]


def make_share(claims: ClaimFactory, index: int, size: tuple[int, str, str]) -> ClaimId:
    compute, memory, _ = size
    share_id = f"55555555-0000-0000-0000-{index:012d}"
    result = Result(
        "gpu", "gpu-2-shared", share_id=share_id, consumed={"compute": str(compute), "memory": memory}
    )
    name, uid = claims.make(NS, [result])
    return ClaimId(NS, uid, name)


def gpu2(node: SimNode) -> str:
    return node.sim_state().gpus[2].uuid


def crash(process: PluginProcess, call: Callable[[], object]) -> None:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert process.wait_dead() == -signal.SIGKILL


def registry(node: SimNode) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((node.plugin_dir / "sharing-registry.json").read_text())
    return doc


def assert_served(node: SimNode, claim: ClaimId, size: tuple[int, str, str]) -> int:
    """The claim's workload reaches the GPU's server held to its own share; returns the server's pid."""
    compute, _, mib = size
    view = workload(node, claim.uid)
    assert view.get("mps"), view
    assert view["gpus"] == [gpu2(node)]
    assert view["activeThreadPercentage"] == compute
    assert view["pinnedDeviceMemoryLimits"] == {gpu2(node): mib}
    pid: int = view["serverPid"]
    return pid


def assert_caps(node: SimNode, size: tuple[int, str, str]) -> None:
    """The GPU's one server daemon, and every MPS server it runs, are capped at `size` (the largest share)."""
    compute, _, mib = size
    uuid = gpu2(node)
    daemon = registry(node)["sharedMps"][uuid]["daemon"]
    assert daemon["id"] == shared_daemon_id(uuid)
    record = node.mps_records()[daemon["pipeDir"]]
    assert record["running"]
    assert (record["default_active_thread_percentage"], record["default_pinned_mem_limits"]) == (
        compute,
        {uuid: mib},
    )
    for server in record.get("servers") or ():
        assert (server["active_thread_percentage"], server["pinned_mem_limits"]) == (compute, {uuid: mib})
    assert [r for r in node.mps_records().values() if r.get("running")] == [record]


def assert_nothing_left(node: SimNode) -> None:
    assert node.checkpoint()["claims"] == {} and node.cdi_files() == []
    assert registry(node)["sharedMps"] == {}
    assert not [r for r in node.mps_records().values() if r.get("running")]
    mps_dir = node.plugin_dir / "mps"
    assert not mps_dir.exists() or list(mps_dir.iterdir()) == []
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    assert not [m for m in mounts if m.startswith(f"{node.plugin_dir}/")]
    assert node.gpu_compute_mode(gpu2(node)) == int(ComputeMode.DEFAULT)


def finish(holder: subprocess.Popen[str]) -> dict[str, Any]:
    holder.send_signal(signal.SIGTERM)
    out, err = holder.communicate(timeout=30)
    assert holder.returncode == 0, err
    report: dict[str, Any] = json.loads(out)
    return report


@pytest.mark.parametrize("step", JOIN_STEPS)
def test_killed_while_a_second_share_joins(
    step: str, start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    a, b = make_share(claims, 1, SMALL), make_share(claims, 2, LARGE)
    first = start_plugin()
    kubelet = KubeletClient(node.registration_socket)
    assert kubelet.prepare([a]).claims[a.uid].error == ""
    kubelet.close()
    first.stop()
    holder = start_workload(node, a.uid, "--hold", "120")  # A's workload runs through the crash
    try:
        doomed = start_plugin(env={"DRA_GPU_FAULT_KILL_AT": step})
        kubelet = KubeletClient(node.registration_socket)
        crash(doomed, lambda: kubelet.prepare([b]))
        kubelet.close()

        start_plugin()
        kubelet = KubeletClient(node.registration_socket)
        assert_served(node, a, SMALL)
        assert node.gpu_compute_mode(gpu2(node)) == int(ComputeMode.EXCLUSIVE_PROCESS)

        answer = kubelet.prepare([b])  # the kubelet retries
        assert answer.claims[b.uid].error == "", answer.claims[b.uid].error
        assert sorted(node.checkpoint()["claims"]) == sorted([a.uid, b.uid])
        clients = registry(node)["sharedMps"][gpu2(node)]["clients"]
        assert sorted(key.split("/")[0] for key in clients) == sorted([a.uid, b.uid])  # each once
        server = assert_served(node, a, SMALL)
        assert assert_served(node, b, LARGE) == server  # one server for both
        assert_caps(node, LARGE)
        assert node.gpu_compute_mode(gpu2(node)) == int(ComputeMode.EXCLUSIVE_PROCESS)
    finally:
        held = finish(holder)
    assert held["mps"] and held["activeThreadPercentage"] == SMALL[0], held

    assert kubelet.unprepare([a]).claims[a.uid].error == ""
    assert_caps(node, LARGE)
    assert_served(node, b, LARGE)
    assert kubelet.unprepare([b]).claims[b.uid].error == ""
    assert_nothing_left(node)
    kubelet.close()


@pytest.mark.parametrize("step", LEAVE_STEPS)
def test_killed_while_a_share_leaves_and_another_runs(
    step: str, start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    a, b = make_share(claims, 1, LARGE), make_share(claims, 2, SMALL)
    # A first, so B's join changes no caps: the armed steps are reached only by A's unprepare
    doomed = start_plugin(env={"DRA_GPU_FAULT_KILL_AT": step})
    kubelet = KubeletClient(node.registration_socket)
    assert kubelet.prepare([a]).claims[a.uid].error == ""
    assert kubelet.prepare([b]).claims[b.uid].error == ""
    assert_caps(node, LARGE)
    holder = start_workload(node, b.uid, "--hold", "120")  # B's workload runs through the crash
    try:
        crash(doomed, lambda: kubelet.unprepare([a]))
        kubelet.close()

        start_plugin()
        kubelet = KubeletClient(node.registration_socket)
        server = assert_served(node, b, SMALL)
        assert node.gpu_compute_mode(gpu2(node)) == int(ComputeMode.EXCLUSIVE_PROCESS)

        assert kubelet.unprepare([a]).claims[a.uid].error == ""  # the kubelet retries
        assert list(node.checkpoint()["claims"]) == [b.uid]
        assert [key.split("/")[0] for key in registry(node)["sharedMps"][gpu2(node)]["clients"]] == [b.uid]
        assert_caps(node, SMALL)  # the running server too: A's larger caps are gone
        assert assert_served(node, b, SMALL) == server
        # a tenant of B that drops its own limits gets no more than the largest share left: B's
        greedy = workload(
            node,
            b.uid,
            env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"},
        )
        assert greedy["activeThreadPercentage"] == SMALL[0], greedy
        assert greedy["pinnedDeviceMemoryLimits"] == {gpu2(node): SMALL[2]}, greedy
        assert node.gpu_compute_mode(gpu2(node)) == int(ComputeMode.EXCLUSIVE_PROCESS)
    finally:
        held = finish(holder)
    assert held["mps"] and held["serverPid"] == server, held

    assert kubelet.unprepare([b]).claims[b.uid].error == ""
    assert_nothing_left(node)
    kubelet.close()


@pytest.mark.parametrize("step", ["mps-daemon-started", "mps-limits-set", "mps-daemon-placed"])
def test_killed_while_the_first_share_starts_the_server(
    step: str, start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """Killed while the GPU's server starts for its first share, before the registry knows it: the restart
    stops that daemon and puts the compute mode back; the retried prepare starts a server that serves."""
    a = make_share(claims, 1, SMALL)
    doomed = start_plugin(env={"DRA_GPU_FAULT_KILL_AT": step})
    kubelet = KubeletClient(node.registration_socket)
    crash(doomed, lambda: kubelet.prepare([a]))
    kubelet.close()
    assert node.gpu_compute_mode(gpu2(node)) == int(ComputeMode.EXCLUSIVE_PROCESS)

    start_plugin()
    assert not [r for r in node.mps_records().values() if r.get("running")]
    assert node.gpu_compute_mode(gpu2(node)) == int(ComputeMode.DEFAULT)
    kubelet = KubeletClient(node.registration_socket)
    assert kubelet.prepare([a]).claims[a.uid].error == ""
    assert_served(node, a, SMALL)
    assert_caps(node, SMALL)
    assert kubelet.unprepare([a]).claims[a.uid].error == ""
    assert_nothing_left(node)
    kubelet.close()
