"""`--consumable-shares` through the real plugin process and its gRPC API: several claims on one whole GPU,
each enforced with its consumed memory, unprepared one at a time; the flag off keeps the GPU exclusive; a bad
value stops the plugin with a message naming the flag."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from dra_gpu.sharing.mps import process_start_time
from tests.plugin.kubelet_client import ClaimId, KubeletClient
from tests.plugin.plugin_harness import ClaimFactory, PluginProcess, Result, SimNode, opaque, time_slicing

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


def test_two_memory_shares_of_one_gpu_prepare_and_unprepare_independently(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    start_plugin(env={"CONSUMABLE_SHARES": "memory"})  # the chart's value arrives as this env var
    kubelet = KubeletClient(node.registration_socket)
    a = made(
        "team-a",
        claims.make("team-a", [Result("gpu", "gpu-0", share_id=SHARE_A, consumed={"memory": "4Gi"})]),
    )
    b = made(
        "team-b",
        claims.make("team-b", [Result("gpu", "gpu-0", share_id=SHARE_B, consumed={"memory": "8Gi"})]),
    )
    answer = kubelet.prepare([a, b])
    for claim, share in ((a, SHARE_A), (b, SHARE_B)):
        assert answer.claims[claim.uid].error == "", answer.claims[claim.uid].error
        (device,) = answer.claims[claim.uid].devices
        assert device.device_name == "gpu-0" and device.share_id == share
    checkpointed = node.checkpoint()["claims"]
    assert set(checkpointed) == {a.uid, b.uid}
    running = daemons(node)
    assert len(running) == 2
    limits = [
        node.mps_records()[record["pipeDir"]]["default_pinned_mem_limits"] for record in running.values()
    ]
    uuid = next(iter(limits[0]))
    assert sorted(limit[uuid] for limit in limits) == ["4096M", "8192M"]

    assert kubelet.unprepare([a]).claims[a.uid].error == ""
    assert set(node.checkpoint()["claims"]) == {b.uid}
    (left,) = daemons(node).values()
    assert node.mps_records()[left["pipeDir"]]["default_pinned_mem_limits"] == {uuid: "8192M"}
    assert process_start_time(left["pid"]) == left["startTime"]  # untouched by the other's unprepare
    assert kubelet.unprepare([b]).claims[b.uid].error == ""
    assert node.checkpoint()["claims"] == {} and daemons(node) == {}
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
