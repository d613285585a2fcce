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

from dra_gpu.hardware.sim_tools.mps_control import sms_for_percentage
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


# A tenant that drops its env limits (or raises them) gets its server's caps: what a greedy client gets.
GREEDY = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}
CAP_COMMANDS = (
    "set_default_active_thread_percentage",
    "set_active_thread_percentage",
    "set_default_device_pinned_mem_limit",
    "set_device_pinned_mem_limit",
)


def caps_sent(node: SimNode, pipe_dir: str) -> list[tuple[str, float]]:
    """Every cap the daemon was sent, in order: (command, percent or MiB)."""
    sent: list[tuple[str, float]] = []
    for entry in node.mps_records()[pipe_dir].get("commands") or ():
        words = entry["command"].split()
        if entry["ok"] and words and words[0] in CAP_COMMANDS:
            value = words[-1]
            number = float(value[:-1]) * (1024 if value.endswith("G") else 1) if value[-1] in "MG" else value
            sent.append((words[0], float(number)))
    return sent


@pytest.mark.parametrize(
    "failure", ["shares-client-added", "mps-limits-recorded", "after-the-caps-were-sent"]
)
def test_no_client_gets_more_than_the_largest_share_in_a_failed_join_or_the_reconcile_after_it(
    node: SimNode, failure: str
) -> None:
    """Issue 36: a 25 % / 10Gi share's join fails beside a running 10 % / 1Gi share. A tenant of the small
    share that drops its env limits connects at every point: at each step of the join and of the reconcile
    pass after it, and after each control session the plugin ran. While the join is under way the largest
    share on the GPU is the joining one; once it has failed it is 10 % / 1Gi again, and no client, no server
    and no default the daemon is sent may exceed that (a client keeps what it got for as long as it stays
    connected). The plugin used to save the larger caps beside the daemon, and the next pass sent them."""
    uuid = node.uuid()
    ceilings = {"joining": (25, 10240), "failed": (10, 1024)}
    phase = "setup"
    seen: list[tuple[str, str, dict[str, object]]] = []

    def probe(where: str) -> None:
        if phase in ceilings:
            seen.append((phase, where, sim_client(small.edits, node.root, env=GREEDY, uid=NONROOT)))

    failed = False

    def fault(step: str) -> None:
        nonlocal failed
        probe(f"step {step}")
        if phase == "joining" and step == failure and not failed:
            failed = True
            raise OSError(f"injected failure at {step}")

    manager = node.manager(faults=fault)
    (small,) = prepare_shares(node, manager, [("10", "1Gi")])
    mps = manager._mps
    commands = mps.commands

    def session(record: object, lines: object, timeout_s: float = 30) -> str:
        nonlocal failed
        answer = commands(record, lines, timeout_s)  # type: ignore[arg-type]
        probe(f"after {list(lines)}")  # type: ignore[call-overload]
        joined = " ".join(lines)  # type: ignore[arg-type]
        if phase == "joining" and failure == "after-the-caps-were-sent" and "25" in joined and not failed:
            failed = True
            raise SharingError("injected failure after the caps were sent")
        return answer

    mps.commands = session  # type: ignore[method-assign]
    holder = start_sim_client(small.edits, node.root, "--hold", "60")  # a server runs, with a client
    try:
        pipe_dir = manager.describe()["sharedMps"][uuid]["daemon"]["pipeDir"]
        deadline = time.monotonic() + 10
        while not node.mps_records()[pipe_dir].get("servers"):
            assert time.monotonic() < deadline, "the holding client did not reach the server"
            time.sleep(0.05)
        before = len(caps_sent(node, pipe_dir))
        phase = "joining"
        with pytest.raises(SharingError):
            manager.prepare_group("claim-9", None, [share(node, "25", "10Gi", 9)])
        assert failed, f"the join never reached {failure}"
        phase = "failed"
        probe("after the join failed")
        during_join = caps_sent(node, pipe_dir)[before:]
        after_join = len(caps_sent(node, pipe_dir))
        manager.reconcile_mps([small.state])
        probe("after the reconcile pass")
        assert all(value <= (25 if "thread" in name else 10240) for name, value in during_join), during_join
        late = caps_sent(node, pipe_dir)[after_join:]
        assert all(value <= (10 if "thread" in name else 1024) for name, value in late), late
        assert [p for p, _, _ in seen].count("failed") >= 2
        for where_phase, where, view in seen:
            percent, mib = ceilings[where_phase]
            assert view.get("mps"), (where, view)
            assert view["smCount"] <= sms_for_percentage(132, percent), (where_phase, where, view)
            pinned = int(str(view["pinnedDeviceMemoryLimits"][uuid]).rstrip("M"))
            assert pinned <= mib, (where_phase, where, view)
        assert server_of_caps(manager, node) == (10, "1024M")
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.communicate(timeout=30)
        mps.commands = commands  # type: ignore[method-assign]
        phase = "done"
        manager.unprepare_group("claim-0", small.state)
    assert node.leftovers() == []


def test_a_tenant_outside_mps_before_any_server_ran_takes_the_gpu_and_keeps_the_shares_out(
    node: SimNode,
) -> None:
    """What the README says a tenant can do: one that leaves its pipe directory before any share's workload
    started the GPU's MPS server gets the GPU (EXCLUSIVE_PROCESS admits one process), and until it exits no
    share's workload starts; once it is gone they do. (Use MIG against such tenants.)"""
    uuid = node.uuid()
    manager = node.manager()
    (result,) = prepare_shares(node, manager, [("25", "10Gi")])
    bare = start_sim_client(
        result.edits,
        node.root,
        "--gpu",
        uuid,
        "--hold",
        "30",
        env={"CUDA_MPS_PIPE_DIRECTORY": "/tmp/elsewhere"},
    )
    try:
        deadline = time.monotonic() + 10
        while not any(c.kind == "compute" for c in node.state().contexts):
            assert time.monotonic() < deadline, "the tenant outside MPS did not get the GPU"
            time.sleep(0.05)
        shut_out = sim_client(result.edits, node.root)
        assert "busy or unavailable" in shut_out.get("error", ""), shut_out
    finally:
        bare.send_signal(signal.SIGTERM)
        report, _ = bare.communicate(timeout=30)
    assert json.loads(report)["mps"] is False and json.loads(report)["smCount"] == 132
    assert sim_client(result.edits, node.root)["activeThreadPercentage"] == 25
    manager.unprepare_group("claim-0", result.state)
    assert node.leftovers() == []
