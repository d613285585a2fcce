"""The shares of one GPU are clients of ONE MPS server, checked from where a workload looks: a simulated CUDA
client run in each claim's container view (its CDI mounts and env in a private mount namespace)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable

import pytest
from sim_node import SimNode, pid_alive

from dra_gpu.hardware.types import ComputeMode
from dra_gpu.sharing.interface import AllocatedDevice, GroupResult, SharingError
from dra_gpu.sharing.manager import HardwareSharingManager, shared_daemon_id
from dra_gpu.sharing.mps_namespace import CONTAINER_PIPE_DIR
from tests.support.container_view import sim_client, start_sim_client

NONROOT = 1000


def share(node: SimNode, compute: str, memory: str, n: int, minor: int = 0) -> AllocatedDevice:
    return node.alloc(
        f"gpu-{minor}-shared",
        share_id=f"11111111-0000-0000-0000-{n:012d}",
        consumed_capacity={"compute": compute, "memory": memory},
    )


def prepare_shares(
    node: SimNode, manager: HardwareSharingManager, sizes: list[tuple[str, str]]
) -> list[GroupResult]:
    return [
        manager.prepare_group(f"claim-{n}", None, [share(node, compute, memory, n)])
        for n, (compute, memory) in enumerate(sizes)
    ]


def server_of(node: SimNode, result: GroupResult) -> dict[str, object]:
    daemon = node.manager().describe()["sharedMps"][node.uuid()]["daemon"]
    record = node.mps_records()[daemon["pipeDir"]]
    servers = record.get("servers") or []
    assert len(servers) == 1, servers
    return dict(servers[0])


def test_shares_of_a_gpu_are_clients_of_one_server_each_held_to_its_own_share(node: SimNode) -> None:
    uuid = node.uuid()
    manager = node.manager()
    quarter = prepare_shares(node, manager, [("25", "10Gi")] * 4)
    half = manager.prepare_group("claim-half", None, [share(node, "50", "20Gi", 9)])
    results = [*quarter, half]

    assert len(node.running_daemons()) == 1  # one control daemon, one server, for every share of the GPU
    entry = manager.describe()["sharedMps"][uuid]
    assert entry["daemon"]["id"] == shared_daemon_id(uuid) and len(entry["clients"]) == 5
    # the server's caps are the largest share; the GPU is EXCLUSIVE_PROCESS while the server runs
    assert entry["daemon"]["threadPercentage"] == 50
    assert entry["daemon"]["pinnedLimits"] == {uuid: "20480M"}
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.EXCLUSIVE_PROCESS)

    # one server, but nothing shared between the tenants through /dev/shm: each claim has its own tmpfs
    shms = [next(m.host_path for m in r.edits.mounts if m.container_path == "/dev/shm") for r in results]
    assert len(set(shms)) == 5 and all(os.path.ismount(p) for p in shms), shms

    views = [sim_client(r.edits, node.root, uid=NONROOT) for r in results]
    assert all(v.get("mps") for v in views), views
    assert len({v["serverPid"] for v in views}) == 1  # every share reached the same server
    assert [v["activeThreadPercentage"] for v in views] == [25, 25, 25, 25, 50]
    assert [v["pinnedDeviceMemoryLimits"][uuid] for v in views] == ["10240M"] * 4 + ["20480M"]
    # of an H100's 132 SMs: 32 for 25 % (as a real H200 gave a 25 % client: whole TPCs), 66 for 50 %
    assert [v["smCount"] for v in views] == [32, 32, 32, 32, 66]

    for n, result in enumerate(quarter):
        manager.unprepare_group(f"claim-{n}", result.state)
    manager.unprepare_group("claim-half", half.state)
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.DEFAULT)
    assert manager.describe()["sharedMps"] == {}
    assert node.leftovers() == []


def test_four_shares_run_at_the_same_time_not_time_sliced(node: SimNode) -> None:
    """The seed study's promise: 4 jobs in 4 shares of 25 % take about the time of one alone (separate
    servers time-slice: 4 jobs in 4 servers took 4.25x on an H200)."""
    manager = node.manager()
    results = prepare_shares(node, manager, [("25", "10Gi")] * 4)
    job_s = 0.6
    clients = [start_sim_client(r.edits, node.root, "--job-seconds", str(job_s)) for r in results]
    reports = []
    for client in clients:
        out, err = client.communicate(timeout=60)
        assert client.returncode == 0, err
        reports.append(json.loads(out))
    assert all(r["mps"] for r in reports)
    slowest = max(r["elapsedSeconds"] for r in reports)
    assert slowest < job_s * 1.5, reports  # 4 servers would have taken ~4x
    for n, result in enumerate(results):
        manager.unprepare_group(f"claim-{n}", result.state)


def test_a_tenant_that_leaves_its_pipe_is_refused_and_one_that_drops_its_limits_gets_the_largest_share(
    node: SimNode,
) -> None:
    uuid = node.uuid()
    manager = node.manager()
    small, large = prepare_shares(node, manager, [("25", "10Gi"), ("50", "20Gi")])
    holder = start_sim_client(small.edits, node.root, "--hold", "30")  # the server runs, with a client
    try:
        deadline = time.monotonic() + 10
        while not node.mps_records()[manager.describe()["sharedMps"][uuid]["daemon"]["pipeDir"]].get(
            "servers"
        ):
            assert time.monotonic() < deadline, "the holding client did not reach the server"
            time.sleep(0.05)
        away = sim_client(
            small.edits,
            node.root,
            "--gpu",
            uuid,
            env={"CUDA_MPS_PIPE_DIRECTORY": "/tmp/elsewhere"},
            uid=NONROOT,
        )
        assert "busy or unavailable" in away.get("error", ""), away
        # raising its own limits in the pod spec gets a tenant no more than the largest share on the GPU
        greedy = sim_client(
            small.edits,
            node.root,
            env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"},
            uid=NONROOT,
        )
        assert greedy["activeThreadPercentage"] == 50
        assert greedy["pinnedDeviceMemoryLimits"][uuid] == "20480M"
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.communicate(timeout=30)
    manager.unprepare_group("claim-1", large.state)  # the largest share leaves: the caps shrink, live too
    assert server_of(node, small)["active_thread_percentage"] == 25
    manager.unprepare_group("claim-0", small.state)
    assert node.leftovers() == []


def test_reconcile_holds_running_servers_to_their_caps(node: SimNode) -> None:
    """A root tenant (or a server spawned before its limits) can leave a server with other caps; the
    reconcile pass reads each running server's own limits and sets them back."""
    manager = node.manager()
    (result,) = prepare_shares(node, manager, [("25", "10Gi")])
    assert sim_client(result.edits, node.root)["mps"]  # spawns the server
    record = manager.describe()["sharedMps"][node.uuid()]["daemon"]
    pid = server_of(node, result)["pid"]
    mps = manager._mps  # the tenant's own control client, as root could bring one
    mps.command(record, f"set_active_thread_percentage {pid} 100")
    assert server_of(node, result)["active_thread_percentage"] == 100
    report = manager.reconcile_mps([result.state])
    assert server_of(node, result)["active_thread_percentage"] == 25
    assert report.limits_restored == [record["id"]]
    manager.unprepare_group("claim-0", result.state)


def test_a_restarted_daemon_is_reached_only_once_it_holds_its_limits(node: SimNode) -> None:
    seen_in_window: list[dict[str, object]] = []

    def fault(step: str) -> None:
        if step == "mps-daemon-started" and seen_in_window == [] and restarting:
            seen_in_window.append(sim_client(result.edits, node.root, "--gpu", node.uuid()))

    restarting = False
    manager = node.manager(faults=fault)
    (result,) = prepare_shares(node, manager, [("25", "10Gi")])
    record = manager.describe()["sharedMps"][node.uuid()]["daemon"]
    os.kill(record["pid"], signal.SIGKILL)
    restarting = True
    report = manager.reconcile_mps([result.state])
    assert report.restarted == [record["id"]]
    # in the window the new daemon was in stage/: the client found no daemon (no unlimited server spawned)
    assert seen_in_window and not seen_in_window[0].get("mps"), seen_in_window
    after = sim_client(result.edits, node.root)
    assert after["mps"] and after["activeThreadPercentage"] == 25
    assert server_of(node, result)["active_thread_percentage"] == 25
    manager.unprepare_group("claim-0", result.state)
    assert node.leftovers() == []


def test_the_lab_option_leaves_the_compute_mode_alone(node: SimNode) -> None:
    manager = node.manager(leave_compute_mode=True)
    (result,) = prepare_shares(node, manager, [("25", "10Gi")])
    assert node.gpu_state(node.uuid()).compute_mode == int(ComputeMode.DEFAULT)
    assert manager.describe()["sharedMps"][node.uuid()]["daemon"]["computeModes"] == {}
    assert sim_client(result.edits, node.root)["activeThreadPercentage"] == 25
    manager.unprepare_group("claim-0", result.state)
    assert node.gpu_state(node.uuid()).compute_mode == int(ComputeMode.DEFAULT)


@pytest.mark.parametrize("kind", ["gpu", "shares"])
def test_mps_starts_under_a_plugins_directory_of_any_length(
    make_node: Callable[[str], SimNode], kind: str, request: pytest.FixtureRequest
) -> None:
    """`nvidia-cuda-mps-control -d` refuses a pipe directory of 88 characters or more: at the kubelet's
    default /var/lib/kubelet/plugins it is already 91. Here the plugins directory alone is over 100."""
    node = make_node("h100-80gb")
    top = node.plugin_dir
    request.addfinalizer(lambda: shutil.rmtree(top, ignore_errors=True))
    long_dir = top / ("k" * 60) / "plugins" / "gpu.nvidia.com"
    long_dir.mkdir(parents=True)
    assert len(str(long_dir)) > 100
    node.plugin_dir = long_dir
    manager = node.manager()
    if kind == "gpu":
        from dra_gpu.config.api import decode_opaque_config

        config = decode_opaque_config(
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40}},
            }
        )
        result = manager.prepare_group("claim-0", config, [node.alloc("gpu-0")])
        expected = 40
    else:
        (result,) = prepare_shares(node, manager, [("25", "10Gi")])
        expected = 25
    view = sim_client(result.edits, node.root)
    assert view["mps"] and view["activeThreadPercentage"] == expected
    assert dict(e.split("=", 1) for e in result.edits.env)["CUDA_MPS_PIPE_DIRECTORY"] == CONTAINER_PIPE_DIR
    manager.unprepare_group("claim-0", result.state)
    assert not any(pid_alive(r.get("pid")) for r in node.running_daemons())


@pytest.mark.parametrize("step", ["mps-daemon-placed", "shares-client-added", "mps-limits-recorded"])
def test_a_join_that_fails_leaves_nothing(node: SimNode, step: str) -> None:
    """A join refused midway (here by a failing step) undoes what it made, though the registry never named
    it: the server it started (and the compute mode), the claim's /dev/shm. A server that others use stays."""

    def fail(at: str) -> None:
        if at == step and failing:
            raise OSError(f"injected failure at {at}")

    failing = False
    manager = node.manager(faults=fail)
    if step == "mps-limits-recorded":  # a larger share joining a running server changes its caps
        (first,) = prepare_shares(node, manager, [("10", "1Gi")])
    failing = True
    with pytest.raises(SharingError):
        manager.prepare_group("claim-9", None, [share(node, "25", "10Gi", 9)])
    failing = False
    if step == "mps-limits-recorded":
        assert manager.describe()["sharedMps"][node.uuid()]["clients"].keys() == set(
            first.state["sharedMps"]["clients"]
        )
        assert sim_client(first.edits, node.root)["activeThreadPercentage"] == 10
        manager.reconcile_mps([first.state])  # the caps go back to the shares the registry holds
        assert server_of_caps(manager, node) == (10, "1024M")
        manager.unprepare_group("claim-0", first.state)
    assert manager.describe()["sharedMps"] == {}
    assert node.gpu_state(node.uuid()).compute_mode == int(ComputeMode.DEFAULT)
    assert node.leftovers() == []


def server_of_caps(manager: HardwareSharingManager, node: SimNode) -> tuple[object, object]:
    daemon = manager._mps.latest(manager.describe()["sharedMps"][node.uuid()]["daemon"])
    held = manager._mps.limits_in_force(daemon)
    return held["threadPercentage"], held["pinnedLimits"][node.uuid()]
