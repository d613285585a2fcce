"""`--consumable-shares` through the real plugin process and its gRPC API: several claims on one whole GPU,
clients of the GPU's one MPS server, each held to its consumed memory as its workload sees it (the claim's
CDI spec run as a container), unprepared one at a time; the flag off keeps the GPU exclusive; a bad
value stops the plugin with a message naming the flag."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from dra_gpu.hardware.types import ComputeMode
from dra_gpu.sharing.manager import shared_daemon_id
from dra_gpu.sharing.mps import process_start_time
from tests.plugin.claim_view import mps_host_dir, workload
from tests.plugin.kubelet_client import ClaimId, KubeletClient
from tests.plugin.plugin_harness import (
    ClaimFactory,
    PluginProcess,
    Result,
    SimNode,
    mps,
    opaque,
    time_slicing,
)

pytestmark = pytest.mark.apiserver

SHARE_A = "33333333-0000-0000-0000-00000000000a"
SHARE_B = "33333333-0000-0000-0000-00000000000b"


def daemons(node: SimNode) -> dict[str, dict[str, Any]]:
    found = {}
    mps_dir = node.plugin_dir / "mps"
    for directory in sorted(mps_dir.iterdir()) if mps_dir.exists() else []:
        record = json.loads((directory / "record.json").read_text())
        found[record["id"]] = record
    return found


def made(namespace: str, pair: tuple[str, str]) -> ClaimId:
    name, uid = pair
    return ClaimId(namespace=namespace, uid=uid, name=name)


def registry(node: SimNode) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((node.plugin_dir / "sharing-registry.json").read_text())
    return doc


def test_two_memory_shares_of_one_gpu_prepare_and_unprepare_independently(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """Each claim's workload (its CDI spec's mounts and env, run as a container would) reaches its GPU's one
    shares server held to its own consumed memory: a claim wired to another GPU's pipe, or to the right pipe
    without its limit, fails here. Unpreparing one leaves the other served as it was."""
    start_plugin(env={"CONSUMABLE_SHARES": "memory"})  # the chart's value arrives as this env var
    kubelet = KubeletClient(node.registration_socket)
    gpu0, gpu1 = (g.uuid for g in node.sim_state().gpus[:2])
    a = made(
        "team-a",
        claims.make("team-a", [Result("gpu", "gpu-0", share_id=SHARE_A, consumed={"memory": "4Gi"})]),
    )
    b = made(
        "team-b",
        claims.make("team-b", [Result("gpu", "gpu-0", share_id=SHARE_B, consumed={"memory": "8Gi"})]),
    )
    c = made(  # a share of another GPU: its own server
        "team-c",
        claims.make("team-c", [Result("gpu", "gpu-1", share_id=SHARE_A, consumed={"memory": "2Gi"})]),
    )
    answer = kubelet.prepare([a, b, c])
    for claim, device_name, share in ((a, "gpu-0", SHARE_A), (b, "gpu-0", SHARE_B), (c, "gpu-1", SHARE_A)):
        assert answer.claims[claim.uid].error == "", answer.claims[claim.uid].error
        (device,) = answer.claims[claim.uid].devices
        assert device.device_name == device_name and device.share_id == share
    checkpointed = node.checkpoint()["claims"]
    assert set(checkpointed) == {a.uid, b.uid, c.uid}
    running = daemons(node)
    assert sorted(running) == sorted([shared_daemon_id(gpu0), shared_daemon_id(gpu1)])
    server0 = running[shared_daemon_id(gpu0)]
    assert server0["pinnedLimits"] == {gpu0: "8192M"}  # the largest share of gpu-0
    assert sorted(registry(node)["sharedMps"][gpu0]["clients"]) == sorted(
        f"{claim.uid}/gpu-0/{share}" for claim, share in ((a, SHARE_A), (b, SHARE_B))
    )
    # the spec mounts the GPU's server for every share of it, and each claim's limit is in its own env
    assert mps_host_dir(node, a.uid) == mps_host_dir(node, b.uid) == server0["clientsDir"]
    assert mps_host_dir(node, c.uid) == running[shared_daemon_id(gpu1)]["clientsDir"]
    views = {claim.uid: workload(node, claim.uid) for claim in (a, b, c)}
    assert all(view.get("mps") for view in views.values()), views
    assert [views[claim.uid]["gpus"] for claim in (a, b, c)] == [[gpu0], [gpu0], [gpu1]]
    assert views[a.uid]["serverPid"] == views[b.uid]["serverPid"] != views[c.uid]["serverPid"]
    assert views[a.uid]["pinnedDeviceMemoryLimits"] == {gpu0: "4096M"}
    assert views[b.uid]["pinnedDeviceMemoryLimits"] == {gpu0: "8192M"}
    assert views[c.uid]["pinnedDeviceMemoryLimits"] == {gpu1: "2048M"}
    assert {view["activeThreadPercentage"] for view in views.values()} == {100}  # memory only: every SM
    for uuid in (gpu0, gpu1):  # only the server may open a GPU it serves
        assert node.gpu_compute_mode(uuid) == int(ComputeMode.EXCLUSIVE_PROCESS)

    assert kubelet.unprepare([a]).claims[a.uid].error == ""
    assert set(node.checkpoint()["claims"]) == {b.uid, c.uid}
    left = daemons(node)[shared_daemon_id(gpu0)]
    assert (left["pid"], left["startTime"]) == (server0["pid"], server0["startTime"])  # the same server
    assert process_start_time(left["pid"]) == left["startTime"]
    assert list(registry(node)["sharedMps"][gpu0]["clients"]) == [f"{b.uid}/gpu-0/{SHARE_B}"]
    again = workload(node, b.uid)
    assert again["mps"] and again["pinnedDeviceMemoryLimits"] == {gpu0: "8192M"}
    assert node.gpu_compute_mode(gpu0) == int(ComputeMode.EXCLUSIVE_PROCESS)

    assert kubelet.unprepare([b, c]).claims[b.uid].error == ""
    assert node.checkpoint()["claims"] == {} and daemons(node) == {}
    assert registry(node)["sharedMps"] == {}
    for uuid in (gpu0, gpu1):  # the last share left: the GPU is as it was
        assert node.gpu_compute_mode(uuid) == int(ComputeMode.DEFAULT)
    kubelet.close()


def test_unlimited_shares_get_the_gpu_without_a_daemon(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    start_plugin(extra_args=["--consumable-shares", "unlimited"])
    kubelet = KubeletClient(node.registration_socket)
    a = made("u", claims.make("u", [Result("gpu", "gpu-1", share_id=SHARE_A, consumed={"memory": "0"})]))
    b = made("u", claims.make("u", [Result("gpu", "gpu-1", share_id=SHARE_B, consumed={"memory": "0"})]))
    answer = kubelet.prepare([a, b])
    assert [answer.claims[c.uid].error for c in (a, b)] == ["", ""]
    assert daemons(node) == {}
    assert kubelet.unprepare([a, b]).claims[a.uid].error == ""
    kubelet.close()


def test_shares_with_an_mps_config_are_clients_of_one_server_each_held_to_its_share_and_config(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """NVIDIA's MPS sharing on consumable shares: the claims' workloads run as clients of the GPU's one server
    (a server each would time-slice), each held to its consumed memory and the (common) config, whichever is
    tighter; one that took no memory gets the config's limit."""
    start_plugin(env={"CONSUMABLE_SHARES": "memory"})
    kubelet = KubeletClient(node.registration_socket)
    gpu3 = node.sim_state().gpus[3].uuid
    share_ids = iter(f"66666666-0000-0000-0000-00000000000{i}" for i in range(3))

    def share(memory: str) -> ClaimId:
        result = Result("gpu", "gpu-3", share_id=next(share_ids), consumed={"memory": memory})
        return made("mps", claims.make("mps", [result], [opaque(mps(30, "12Gi"))]))

    small, large, unmetered = share("8Gi"), share("16Gi"), share("0")
    answer = kubelet.prepare([small, large, unmetered])
    assert [answer.claims[c.uid].error for c in (small, large, unmetered)] == ["", "", ""]
    assert list(daemons(node)) == [shared_daemon_id(gpu3)]
    views = [workload(node, c.uid) for c in (small, large, unmetered)]
    assert all(v.get("mps") for v in views), views
    assert len({v["serverPid"] for v in views}) == 1
    assert [(v["activeThreadPercentage"], v["pinnedDeviceMemoryLimits"]) for v in views] == [
        (30, {gpu3: "8192M"}),
        (30, {gpu3: "12288M"}),
        (30, {gpu3: "12288M"}),
    ]
    assert node.gpu_compute_mode(gpu3) == int(ComputeMode.EXCLUSIVE_PROCESS)
    assert all(e.error == "" for e in kubelet.unprepare([small, large, unmetered]).claims.values())
    assert daemons(node) == {} and node.gpu_compute_mode(gpu3) == int(ComputeMode.DEFAULT)
    kubelet.close()


def test_a_share_with_another_config_than_the_gpus_other_claims_is_refused(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """A time-slice interval is set on the whole GPU: a second claim asking another one of a GPU that a
    prepared claim shares would change the first claim's. It is refused, naming both configs; a claim with
    the same config is not, and once the GPU's claims are gone another config is fine."""
    start_plugin(extra_args=["--consumable-shares", "unlimited"])
    kubelet = KubeletClient(node.registration_socket)
    share_ids = iter(f"44444444-0000-0000-0000-00000000000{i}" for i in range(8))

    def share(interval: str) -> ClaimId:
        result = Result("gpu", "gpu-3", share_id=next(share_ids), consumed={"memory": "0"})
        return made("cfg", claims.make("cfg", [result], [opaque(time_slicing(interval))]))

    long_a, long_b, short = share("Long"), share("Long"), share("Short")
    assert kubelet.prepare([long_a]).claims[long_a.uid].error == ""
    error = kubelet.prepare([short]).claims[short.uid].error
    assert "requested device gpu-3 has conflicting configuration with already prepared claim" in error, error
    assert '"interval": "Long"' in error and '"interval": "Short"' in error, error
    assert short.uid not in node.checkpoint()["claims"]  # refused before anything was done
    assert list(node.timeslices().values()) == [3]  # gpu-3's interval is still Long's
    assert kubelet.prepare([long_b]).claims[long_b.uid].error == ""
    assert kubelet.unprepare([long_a, long_b]).claims[long_a.uid].error == ""
    assert kubelet.prepare([short]).claims[short.uid].error == ""
    assert kubelet.unprepare([short]).claims[short.uid].error == ""
    kubelet.close()


def test_without_the_flag_a_whole_gpu_stays_one_claims(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    start_plugin()
    kubelet = KubeletClient(node.registration_socket)
    a = made("x", claims.make("x", [Result("gpu", "gpu-2")]))
    b = made("x", claims.make("x", [Result("gpu", "gpu-2")]))
    assert kubelet.prepare([a]).claims[a.uid].error == ""
    error = kubelet.prepare([b]).claims[b.uid].error
    assert "gpu-2" in error and error != ""
    kubelet.unprepare([a])
    kubelet.close()


def test_a_bad_value_stops_the_plugin_naming_the_flag(
    start_plugin: Callable[..., PluginProcess],
) -> None:
    plugin = start_plugin(wait=False, env={"CONSUMABLE_SHARES": "half"})
    assert plugin.wait_dead() == 2
    plugin.stop()
    assert (
        "--consumable-shares (CONSUMABLE_SHARES) 'half': must be 'disabled', 'memory'"
        in plugin.log_path.read_text()
    )
