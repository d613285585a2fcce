"""`--consumable-shares` through the real plugin and its gRPC API: claims that share one whole GPU either all
reach it through the GPU's MPS shares server (they consumed part of its memory) or all get the plain device
(they consumed none). A claim that would mix the two on one GPU is refused at prepare, naming the device, the
other claim and the fix, and leaves nothing behind; the kubelet's retry succeeds once the other claim is
gone, and the rule holds across a plugin restart (the checkpoint).

Why the rule (what a user saw before it, on the simulator's model of compute mode EXCLUSIVE_PROCESS): both
claims prepared, and one workload failed with CUDA's "all CUDA-capable devices are busy or unavailable": a
plain process while the server runs, or the server while a plain process holds the GPU. The first test shows
that a plain process is still refused next to the server, so the refusal guards a real failure."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from dra_gpu.hardware.types import ComputeMode
from dra_gpu.sharing.interface import CdiEdits
from dra_gpu.sharing.manager import shared_daemon_id
from tests.plugin.claim_view import start_workload, workload
from tests.plugin.kubelet_client import ClaimId, KubeletClient
from tests.plugin.plugin_harness import V1B1, ClaimFactory, PluginProcess, Result, SimNode, opaque
from tests.support.container_view import sim_client

pytestmark = pytest.mark.apiserver

FIX = "Request part of the GPU's memory (capacity.requests.memory) in every claim that shares gpu-0"


class Shares:
    """Claims of one consumable share each, every one with a share ID of its own."""

    def __init__(self, claims: ClaimFactory) -> None:
        self.claims = claims
        self.count = 0

    def make(self, namespace: str, device: str, consumed: Mapping[str, str]) -> ClaimId:
        self.count += 1
        share_id = f"55555555-0000-0000-0000-{self.count:012d}"
        name, uid = self.claims.make(namespace, [Result("gpu", device, share_id=share_id, consumed=consumed)])
        return ClaimId(namespace=namespace, uid=uid, name=name)


def daemon_ids(node: SimNode) -> list[str]:
    mps_dir = node.plugin_dir / "mps"
    if not mps_dir.exists():
        return []
    return sorted(json.loads((d / "record.json").read_text())["id"] for d in mps_dir.iterdir())


def shares_clients(node: SimNode, gpu_uuid: str) -> list[str]:
    doc: dict[str, Any] = json.loads((node.plugin_dir / "sharing-registry.json").read_text())
    return sorted((doc["sharedMps"].get(gpu_uuid) or {}).get("clients") or {})


def spec_file(claim: ClaimId) -> str:
    return f"k8s.gpu.nvidia.com-claim_{claim.uid}.json"


def plain_process(node: SimNode, gpu_uuid: str) -> dict[str, Any]:
    """A CUDA process outside MPS on the GPU (what a plain share's container runs)."""
    return sim_client(CdiEdits(), node.driver_root, "--gpu", gpu_uuid)


def wait_for_context(node: SimNode, gpu_uuid: str, kind: str, timeout_s: float = 20) -> None:
    """Until a process holds a context of `kind` on the GPU (a workload started in the background got it)."""
    deadline = time.monotonic() + timeout_s
    while not any(c.device_uuid == gpu_uuid and c.kind == kind for c in node.sim_state().contexts):
        assert time.monotonic() < deadline, f"no {kind} context on {gpu_uuid} after {timeout_s}s"
        time.sleep(0.05)


def assert_nothing_left(node: SimNode, gpu_uuid: str) -> None:
    assert node.checkpoint()["claims"] == {}
    assert node.cdi_files() == []
    assert daemon_ids(node) == [] and shares_clients(node, gpu_uuid) == []
    assert node.gpu_compute_mode(gpu_uuid) == int(ComputeMode.DEFAULT)


def test_a_plain_share_is_refused_a_gpu_whose_shares_server_serves_another_claim(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    start_plugin(extra_args=["--consumable-shares", "unlimited"])
    kubelet = KubeletClient(node.registration_socket)
    gpu0 = node.sim_state().gpus[0].uuid
    shares = Shares(claims)
    limited = shares.make("team-a", "gpu-0", {"memory": "4Gi"})
    plain = shares.make("team-b", "gpu-0", {"memory": "0"})

    answer = kubelet.prepare([limited, plain])  # one batch: each claim gets its own answer
    assert answer.claims[limited.uid].error == ""
    error = answer.claims[plain.uid].error
    assert error.startswith(
        f"claim team-b/{plain.name} ({plain.uid}): requested device gpu-0 would be the plain"
    )
    assert f"already prepared claim team-a/{limited.name} ({limited.uid}) has it as a client of" in error
    assert "EXCLUSIVE_PROCESS" in error and FIX in error, error
    assert answer.claims[plain.uid].devices == []
    # refused before anything was done: no entry, no spec, the server serves the other claim alone
    assert list(node.checkpoint()["claims"]) == [limited.uid]
    assert node.cdi_files() == [spec_file(limited)]
    assert daemon_ids(node) == [shared_daemon_id(gpu0)]
    assert shares_clients(node, gpu0) == [f"{limited.uid}/gpu-0/55555555-0000-0000-0000-000000000001"]

    # what the refusal spares the plain claim: next to the served workload, a process outside MPS gets no GPU
    held = start_workload(node, limited.uid, "--hold", "30")
    try:
        wait_for_context(node, gpu0, "mps-server")
        refused = plain_process(node, gpu0)
        assert "all CUDA-capable devices are busy or unavailable" in refused.get("error", ""), refused
    finally:
        held.send_signal(signal.SIGTERM)
        out, _ = held.communicate(timeout=30)
    served = json.loads(out)
    assert served["mps"] and served["pinnedDeviceMemoryLimits"] == {gpu0: "4096M"}

    # the kubelet retries: refused again, the same way; unpreparing the refused claim is a no-op
    assert kubelet.prepare([plain]).claims[plain.uid].error == error
    assert kubelet.unprepare([plain]).claims[plain.uid].error == ""
    assert list(node.checkpoint()["claims"]) == [limited.uid] and daemon_ids(node) == [shared_daemon_id(gpu0)]

    assert kubelet.unprepare([limited]).claims[limited.uid].error == ""
    assert_nothing_left(node, gpu0)
    assert kubelet.prepare([plain]).claims[plain.uid].error == ""  # the other claim gone: the retry succeeds
    got = workload(node, plain.uid, "--gpu", gpu0)
    assert got.get("mps") is False and got["gpus"] == [gpu0], got
    assert daemon_ids(node) == [] and node.gpu_compute_mode(gpu0) == int(ComputeMode.DEFAULT)
    assert kubelet.unprepare([plain]).claims[plain.uid].error == ""
    assert_nothing_left(node, gpu0)
    kubelet.close()


def test_a_memory_share_is_refused_a_gpu_a_plain_share_holds_and_the_gpu_is_left_alone(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """The other order: a plain share's workload runs on the GPU; a memory share's server would not get the
    GPU (and its EXCLUSIVE_PROCESS would turn away the plain claim's next process). It is refused before the
    GPU is touched, and the running workload keeps the GPU as it was."""
    start_plugin(extra_args=["--consumable-shares", "unlimited"])
    kubelet = KubeletClient(node.registration_socket)
    gpu0 = node.sim_state().gpus[0].uuid
    shares = Shares(claims)
    plain = shares.make("team-b", "gpu-0", {"memory": "0"})
    plain_too = shares.make("team-c", "gpu-0", {"memory": "0"})
    limited = shares.make("team-a", "gpu-0", {"memory": "4Gi"})

    assert kubelet.prepare([plain]).claims[plain.uid].error == ""
    running = start_workload(node, plain.uid, "--gpu", gpu0, "--hold", "30")
    try:
        wait_for_context(node, gpu0, "compute")
        error = kubelet.prepare([limited]).claims[limited.uid].error
        assert "requested device gpu-0 would be a client of the GPU's MPS server" in error, error
        assert f"already prepared claim team-b/{plain.name} ({plain.uid}) has it as the plain device" in error
        assert FIX in error
        assert daemon_ids(node) == [] and node.gpu_compute_mode(gpu0) == int(ComputeMode.DEFAULT)
        assert list(node.checkpoint()["claims"]) == [plain.uid]
        assert node.cdi_files() == [spec_file(plain)]
        # the same kind of share is fine, and its process runs beside the first (compute mode Default)
        assert kubelet.prepare([plain_too]).claims[plain_too.uid].error == ""
        assert workload(node, plain_too.uid, "--gpu", gpu0).get("mps") is False
    finally:
        running.send_signal(signal.SIGTERM)
        out, _ = running.communicate(timeout=30)
    assert json.loads(out)["mps"] is False

    # unprepared in the other order than the first test: the later plain claim first
    assert kubelet.unprepare([plain_too]).claims[plain_too.uid].error == ""
    assert kubelet.prepare([limited]).claims[limited.uid].error != ""  # one plain share is still there
    assert kubelet.unprepare([plain]).claims[plain.uid].error == ""
    assert_nothing_left(node, gpu0)
    assert kubelet.prepare([limited]).claims[limited.uid].error == ""
    assert workload(node, limited.uid)["pinnedDeviceMemoryLimits"] == {gpu0: "4096M"}
    assert kubelet.unprepare([limited]).claims[limited.uid].error == ""
    assert_nothing_left(node, gpu0)
    kubelet.close()


def test_the_rule_holds_after_the_plugin_is_killed_and_restarted(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """With N shares per GPU (N without a memory request is the plain device): after a kill and a restart the
    plugin reads from its checkpoint how each prepared claim holds its GPU, so it refuses the other kind on
    both GPUs and still takes the same kind."""
    first = start_plugin(extra_args=["--consumable-shares", "4"])
    kubelet = KubeletClient(node.registration_socket)
    gpu0, gpu1 = (g.uuid for g in node.sim_state().gpus[:2])
    shares = Shares(claims)
    served_0 = shares.make("n", "gpu-0", {"shares": "1", "memory": "8Gi"})
    plain_1 = shares.make("n", "gpu-1", {"shares": "1", "memory": "0"})
    answer = kubelet.prepare([served_0, plain_1])
    assert [answer.claims[c.uid].error for c in (served_0, plain_1)] == ["", ""]
    kubelet.close()
    first.stop(signal.SIGKILL)

    start_plugin(extra_args=["--consumable-shares", "4"])
    kubelet = KubeletClient(node.registration_socket)
    plain_0 = shares.make("n", "gpu-0", {"shares": "1", "memory": "0"})
    served_1 = shares.make("n", "gpu-1", {"shares": "1", "memory": "2Gi"})
    answer = kubelet.prepare([plain_0, served_1])
    assert f"already prepared claim n/{served_0.name} ({served_0.uid}) has it as a client" in (
        answer.claims[plain_0.uid].error
    )
    assert (
        "requested device gpu-1 would be a client of the GPU's MPS server"
        in answer.claims[served_1.uid].error
    )
    assert f"claim n/{plain_1.name} ({plain_1.uid}) has it as the plain device" in (
        answer.claims[served_1.uid].error
    )
    assert set(node.checkpoint()["claims"]) == {served_0.uid, plain_1.uid}
    assert daemon_ids(node) == [shared_daemon_id(gpu0)]  # the server of gpu-0 (revived), none for gpu-1
    assert node.gpu_compute_mode(gpu1) == int(ComputeMode.DEFAULT)

    again_0 = shares.make("n", "gpu-0", {"shares": "1", "memory": "4Gi"})
    again_1 = shares.make("n", "gpu-1", {"shares": "1", "memory": "0"})
    answer = kubelet.prepare([again_0, again_1])
    assert [answer.claims[c.uid].error for c in (again_0, again_1)] == ["", ""]
    assert workload(node, again_0.uid)["pinnedDeviceMemoryLimits"] == {gpu0: "4096M"}

    everyone = [served_0, plain_1, again_0, again_1, plain_0, served_1]
    assert all(e.error == "" for e in kubelet.unprepare(everyone).claims.values())
    assert node.checkpoint()["claims"] == {} and node.cdi_files() == [] and daemon_ids(node) == []
    assert [node.gpu_compute_mode(u) for u in (gpu0, gpu1)] == [int(ComputeMode.DEFAULT)] * 2
    kubelet.close()


def test_one_claim_taking_a_gpu_both_ways_is_refused_naming_its_requests(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """Two requests of one claim on gpu-0, each with a config entry of its own: one with a memory share (a
    client of the server), one without (the plain device). Refused before anything is done."""
    start_plugin(extra_args=["--consumable-shares", "unlimited"])
    kubelet = KubeletClient(node.registration_socket)
    gpu0 = node.sim_state().gpus[0].uuid
    results = [
        Result("a", "gpu-0", share_id="55555555-0000-0000-0000-0000000000a1", consumed={"memory": "4Gi"}),
        Result("b", "gpu-0", share_id="55555555-0000-0000-0000-0000000000b1", consumed={"memory": "0"}),
    ]
    name, uid = claims.make("both", results, [opaque({"apiVersion": V1B1, "kind": "GpuConfig"}, ["a"])])
    claim = ClaimId(namespace="both", uid=uid, name=name)
    error = kubelet.prepare([claim]).claims[uid].error
    assert error.startswith(f"claim both/{name} ({uid}): requests a and b share device gpu-0 as a client"), (
        error
    )
    assert "capacity.requests.memory" in error
    assert_nothing_left(node, gpu0)
    assert kubelet.unprepare([claim]).claims[uid].error == ""
    kubelet.close()
