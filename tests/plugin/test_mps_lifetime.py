"""MPS daemons outlive the plugin and are reconciled continuously (issue 12), with the real plugin process:
a SIGKILL of the plugin leaves every daemon running with the same identity, and new claims prepare after
the restart; a daemon killed by hand is back within 10 s with the same limits; unprepare on a GPU that fell
off the bus finishes within 10 s and the GPU's cleanup is done (and its taint gone) when it returns."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra_gpu.hardware.types import ComputeMode
from dra_gpu.sharing.manager import shared_daemon_id
from dra_gpu.sharing.mps import process_start_time
from tests.plugin.claim_view import workload
from tests.plugin.kubelet_client import ClaimId, KubeletClient
from tests.plugin.plugin_harness import (
    V1B1,
    ClaimFactory,
    PluginProcess,
    Result,
    SimNode,
    opaque,
    time_slicing,
)

pytestmark = pytest.mark.apiserver

MIG_DEVICE = "gpu-1-mig-1g10gb-19-0"


def mps(kind: str = "GpuConfig", **config: Any) -> dict[str, Any]:
    return {"apiVersion": V1B1, "kind": kind, "sharing": {"strategy": "MPS", "mpsConfig": config}}


def share(share_id: str, compute: str, memory: str) -> Result:
    return Result("gpu", "gpu-2-shared", share_id=share_id, consumed={"compute": compute, "memory": memory})


def daemons(node: SimNode) -> dict[str, dict[str, Any]]:
    """Daemon id -> its record (pid, start time, pipe directory, limits) as the plugin keeps it on disk."""
    found = {}
    for directory in sorted((node.plugin_dir / "mps").iterdir()):
        record = json.loads((directory / "record.json").read_text())
        found[record["id"]] = record
    return found


def prepare(kubelet: KubeletClient, claim: ClaimId) -> None:
    answer = kubelet.prepare([claim])
    assert answer.claims[claim.uid].error == ""


def test_daemons_survive_a_sigkill_of_the_plugin_and_new_claims_prepare(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    first = start_plugin()
    kubelet = KubeletClient(node.registration_socket)
    made = [
        claims.make(
            "whole", [Result("gpu", "gpu-0")], [opaque(mps(defaultActiveThreadPercentage=40), ["gpu"])]
        ),
        claims.make("mig", [Result("gpu", MIG_DEVICE)], [opaque(mps("MigDeviceConfig"), ["gpu"])]),
        claims.make("team-a", [share("11111111-0000-0000-0000-00000000000a", "30", "20Gi")]),
        claims.make("team-b", [share("11111111-0000-0000-0000-00000000000b", "50", "40Gi")]),
    ]
    ids = [
        ClaimId(ns, uid, name)
        for ns, (name, uid) in zip(["whole", "mig", "team-a", "team-b"], made, strict=True)
    ]
    for claim in ids:
        prepare(kubelet, claim)
    kubelet.close()
    before = daemons(node)
    gpu2 = node.sim_state().gpus[2].uuid
    assert len(before) == 3  # the whole GPU's, the MIG device's, and gpu-2's one server for both shares
    assert before[shared_daemon_id(gpu2)]["threadPercentage"] == 50  # its caps: the largest share
    specs_before = {p: Path(node.cdi_root, p).read_text() for p in node.cdi_files()}
    for record in before.values():
        assert process_start_time(record["pid"]) == record["startTime"]

    first.stop(signal.SIGKILL)  # the plugin dies; its daemons are not its children and must not notice
    time.sleep(0.2)
    for record in before.values():
        assert process_start_time(record["pid"]) == record["startTime"], record["id"]

    start_plugin()
    assert daemons(node) == before  # same identity: nothing was restarted
    assert {p: Path(node.cdi_root, p).read_text() for p in node.cdi_files()} == specs_before
    kubelet = KubeletClient(node.registration_socket)
    name, uid = claims.make("team-c", [share("11111111-0000-0000-0000-00000000000c", "10", "4Gi")])
    late = ClaimId("team-c", uid, name)
    prepare(kubelet, late)
    # every share's workload is served by gpu-2's server (the one from before the restart), with its share
    views = [workload(node, claim.uid) for claim in (ids[2], ids[3], late)]
    assert all(v.get("mps") for v in views), views
    assert len({v["serverPid"] for v in views}) == 1
    assert [v["activeThreadPercentage"] for v in views] == [30, 50, 10]
    assert [v["pinnedDeviceMemoryLimits"][gpu2] for v in views] == ["20480M", "40960M", "4096M"]
    assert daemons(node)[shared_daemon_id(gpu2)]["pid"] == before[shared_daemon_id(gpu2)]["pid"]
    for claim in [*ids, late]:
        assert kubelet.unprepare([claim]).claims[claim.uid].error == ""
    kubelet.close()
    assert not (node.plugin_dir / "mps").exists() or list((node.plugin_dir / "mps").iterdir()) == []
    for record in before.values():
        assert process_start_time(record["pid"]) is None


def test_a_daemon_killed_by_hand_is_back_within_10s_with_the_same_limits(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    start_plugin()
    kubelet = KubeletClient(node.registration_socket)
    name, uid = claims.make("team-a", [share("11111111-0000-0000-0000-00000000000a", "30", "20Gi")])
    claim = ClaimId("team-a", uid, name)
    prepare(kubelet, claim)
    (old,) = daemons(node).values()
    os.kill(old["pid"], signal.SIGKILL)
    killed = time.monotonic()
    while True:
        now = daemons(node)[old["id"]]
        # the daemon at the claim's pipe: the dead one's until the new one holds its limits and replaces it
        revived = node.mps_records().get(old["pipeDir"]) or {}
        if (  # running again with its identity, and put where the clients look (the last step of a restart)
            now["pid"] != old["pid"]
            and process_start_time(now["pid"]) == now["startTime"]
            and revived.get("pid") == now["pid"]
        ):
            break
        assert time.monotonic() - killed < 10, "the daemon was not restarted within 10 s"
        time.sleep(0.1)
    gpu2 = node.sim_state().gpus[2].uuid
    assert revived["running"] and revived["pid"] == now["pid"]
    assert revived["default_active_thread_percentage"] == 30
    assert revived["default_pinned_mem_limits"] == {gpu2: "20480M"}
    view = workload(node, uid)  # what the claim's workload gets from the revived daemon
    assert view["mps"] and view["activeThreadPercentage"] == 30
    assert view["pinnedDeviceMemoryLimits"] == {gpu2: "20480M"}
    assert kubelet.unprepare([claim]).claims[uid].error == ""
    kubelet.close()


def test_unprepare_with_the_gpu_gone_finishes_and_is_cleaned_when_it_returns(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    start_plugin(env={"MPS_RECONCILE_SECONDS": "0.5"})
    kubelet = KubeletClient(node.registration_socket)
    gpu0 = node.sim_state().gpus[0].uuid
    name, uid = claims.make("whole", [Result("gpu", "gpu-0")], [opaque(mps(), ["gpu"])])
    claim = ClaimId("whole", uid, name)
    prepare(kubelet, claim)
    assert node.gpu_compute_mode(gpu0) == int(ComputeMode.EXCLUSIVE_PROCESS)
    node.hardware_cli("gpu-lost", "--gpu", "0")
    started = time.monotonic()
    answer = kubelet.unprepare([claim])
    assert answer.claims[uid].error == ""
    assert time.monotonic() - started < 10
    assert node.checkpoint()["claims"] == {}
    pending = json.loads((node.plugin_dir / "sharing-registry.json").read_text())["pendingComputeModes"]
    assert pending == {gpu0: int(ComputeMode.DEFAULT)}
    node.hardware_cli("recover", "--gpu", "0")
    deadline = time.monotonic() + 10
    while json.loads((node.plugin_dir / "sharing-registry.json").read_text())["pendingComputeModes"]:
        assert time.monotonic() < deadline, "the pending cleanup was not done after the GPU returned"
        time.sleep(0.1)
    kubelet.close()


def test_time_slice_and_mig_on_lost_gpus_unprepare_and_are_cleaned_when_they_return(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    start_plugin(env={"MPS_RECONCILE_SECONDS": "0.5"})
    kubelet = KubeletClient(node.registration_socket)
    gpu0, gpu1 = (g.uuid for g in node.sim_state().gpus[:2])
    name, uid = claims.make("sliced", [Result("gpu", "gpu-0")], [opaque(time_slicing("Long"), ["gpu"])])
    sliced = ClaimId("sliced", uid, name)
    name, uid = claims.make("mig", [Result("mig", MIG_DEVICE)])
    mig = ClaimId("mig", uid, name)
    prepare(kubelet, sliced)
    prepare(kubelet, mig)
    assert node.timeslices() == {gpu0: 3} and len(node.mig_instances()) == 1
    node.hardware_cli("gpu-lost", "--gpu", "0")
    node.hardware_cli("gpu-lost", "--gpu", "1")
    started = time.monotonic()
    answer = kubelet.unprepare([sliced, mig])
    assert {uid: r.error for uid, r in answer.claims.items()} == {sliced.uid: "", mig.uid: ""}
    assert time.monotonic() - started < 10
    assert node.checkpoint()["claims"] == {}
    registry = json.loads((node.plugin_dir / "sharing-registry.json").read_text())
    assert registry["pendingTimeSliceResets"] == [gpu0]
    assert [p["parentUuid"] for p in registry["pendingMigDestroy"]] == [gpu1]
    node.hardware_cli("recover", "--gpu", "0")
    node.hardware_cli("recover", "--gpu", "1")
    deadline = time.monotonic() + 10
    while True:
        registry = json.loads((node.plugin_dir / "sharing-registry.json").read_text())
        if not registry["pendingTimeSliceResets"] and not registry["pendingMigDestroy"]:
            break
        assert time.monotonic() < deadline, f"pending cleanup not done after the GPUs returned: {registry}"
        time.sleep(0.1)
    assert node.timeslices() == {} and node.mig_instances() == []
    assert registry["createdMig"] == []
    kubelet.close()
