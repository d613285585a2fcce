"""Prepare/Unprepare through the plugin's real sockets, with claims in a real kube-apiserver, as the kubelet
calls them (registration handshake first, then DRA v1 or v1beta1)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from dra_gpu.cdi.spec_validation import validate_spec
from dra_gpu.plugin.protos import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc
from tests.plugin.claim_view import claim_edits, mps_host_dir
from tests.plugin.kubelet_client import ClaimId, KubeletClient, devices_of
from tests.plugin.plugin_harness import (
    ClaimFactory,
    PluginProcess,
    Result,
    SimNode,
    opaque,
    time_slicing,
    wait_for_socket,
)

pytestmark = pytest.mark.apiserver

SERVICES = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]


def claim_id(namespace: str, made: tuple[str, str]) -> ClaimId:
    name, uid = made
    return ClaimId(namespace=namespace, uid=uid, name=name)


def cdi_id(uid: str, device: str) -> str:
    return f"k8s.gpu.nvidia.com/claim={uid}-{device}"


def test_registration_handshake_and_sockets(kubelet: KubeletClient, node: SimNode) -> None:
    info = kubelet.info
    assert info.type == "DRAPlugin" and info.name == "gpu.nvidia.com"
    assert info.endpoint == str(node.plugin_dir / "dra.sock")
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1alpha1.DRAResourceHealth",
    ]
    assert kubelet.service == "v1.DRAPlugin"  # the kubelet takes the first one it knows
    for sock in (node.registration_socket, node.plugin_dir / "dra.sock"):
        assert sock.stat().st_mode & 0o777 == 0o600, sock
    assert node.plugin_dir.stat().st_mode & 0o777 == 0o750
    assert node.registrar_dir.stat().st_mode & 0o777 == 0o750
    empty = kubelet.prepare([])  # the no-op call the liveness probe makes
    assert len(empty.claims) == 0
    with grpc.insecure_channel(f"unix://{node.registration_socket}") as channel:
        stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.NotifyRegistrationStatus(
                pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=False, error="kubelet says no")
            )
    assert "kubelet says no" in str(refused.value.details())


def test_health_stream_lists_every_device(kubelet: KubeletClient, node: SimNode) -> None:
    message = kubelet.first_health_message()
    names = {d.device.device_name for d in message.devices}
    assert {"gpu-0", "gpu-7", "gpu-0-shared"} <= names
    assert all(d.device.pool_name == node.name and d.health == 1 for d in message.devices)


@pytest.mark.parametrize("service", SERVICES)
def test_prepare_unprepare_one_gpu_with_time_slicing(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory, service: str
) -> None:
    start_plugin()
    kubelet = KubeletClient(node.registration_socket, force_service=service)
    claim = claim_id(
        "prep", claims.make("prep", [Result("gpu", "gpu-0")], [opaque(time_slicing("Long"), ["gpu"])])
    )

    answer = kubelet.prepare([claim])
    assert answer.claims[claim.uid].error == ""
    assert devices_of(answer, claim.uid) == [(("gpu",), node.name, "gpu-0", (cdi_id(claim.uid, "gpu-0"),))]
    spec_path = node.cdi_root / f"k8s.gpu.nvidia.com-claim_{claim.uid}.json"
    spec = json.loads(spec_path.read_text())
    validate_spec(spec)
    assert spec["devices"][0]["name"] == f"{claim.uid}-gpu-0"
    assert {"path": "/dev/nvidia0", "hostPath": f"{node.driver_root}/dev/nvidia0"} in (
        spec["devices"][0]["containerEdits"]["deviceNodes"]
    )
    assert f"DRA_GPU_CLAIM=prep/{claim.name}" in spec["containerEdits"]["env"]
    assert list(node.timeslices().values()) == [3]  # Long
    entry = node.checkpoint()["claims"][claim.uid]
    assert entry["checkpointState"] == "PrepareCompleted" and entry["name"] == claim.name

    again = kubelet.prepare([claim])  # the kubelet repeats calls after restarts: same answer
    assert devices_of(again, claim.uid) == devices_of(answer, claim.uid)

    assert kubelet.unprepare([claim]).claims[claim.uid].error == ""
    assert node.cdi_files() == []
    assert node.checkpoint()["claims"] == {}
    assert node.timeslices() == {}
    assert kubelet.unprepare([claim]).claims[claim.uid].error == ""  # unknown claim: success
    kubelet.close()


def test_subrequest_is_stripped_and_other_drivers_ignored(
    kubelet: KubeletClient, claims: ClaimFactory
) -> None:
    name, uid = claims.create("sub", ["big/h100", "other"])
    claims.allocate(
        "sub", name, [Result("big/h100", "gpu-1")], other_driver_results=[Result("other", "nic-0")]
    )
    answer = kubelet.prepare([ClaimId("sub", uid, name)])
    assert answer.claims[uid].error == ""
    assert [(list(d.request_names), d.device_name) for d in answer.claims[uid].devices] == [
        (["big"], "gpu-1")
    ]
    kubelet.unprepare([ClaimId("sub", uid, name)])


def test_bad_claims_fail_one_by_one_in_a_batch(
    kubelet: KubeletClient, node: SimNode, claims: ClaimFactory
) -> None:
    good = claim_id("bad", claims.make("bad", [Result("gpu", "gpu-2")]))
    missing = ClaimId("bad", "00000000-0000-0000-0000-000000000001", "does-not-exist")
    unallocated = claim_id("bad", claims.create("bad", ["gpu"]))
    replaced = ClaimId("bad", "00000000-0000-0000-0000-000000000002", good.name)
    malformed_cfg = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}},
    }
    malformed = claim_id("bad", claims.make("bad", [Result("gpu", "gpu-3")], [opaque(malformed_cfg)]))
    unknown = claim_id("bad", claims.make("bad", [Result("gpu", "gpu-99")]))
    wrong_kind = claim_id(
        "bad", claims.make("bad", [Result("m", "gpu-4-mig-1g10gb-19-0")], [opaque(time_slicing(), ["m"])])
    )

    batch = [good, missing, unallocated, replaced, malformed, unknown, wrong_kind]
    answer = kubelet.prepare(batch)
    assert sorted(answer.claims) == sorted({c.uid for c in batch})  # exactly one entry per claim
    errors = {c.uid: answer.claims[c.uid].error for c in batch}
    assert errors[good.uid] == ""
    expectations = {
        missing.uid: "not found",
        unallocated.uid: "not allocated",
        replaced.uid: "deleted and replaced",
        malformed.uid: "interval",
        unknown.uid: "gpu-99",
        wrong_kind.uid: "use a MigDeviceConfig",
    }
    for uid, fragment in expectations.items():
        claim = next(c for c in batch if c.uid == uid)
        assert claim.name in errors[uid] and uid in errors[uid], errors[uid]
        assert fragment in errors[uid], errors[uid]
    assert set(node.checkpoint()["claims"]) == {good.uid}  # nothing half-written for the bad ones
    assert node.cdi_files() == [f"k8s.gpu.nvidia.com-claim_{good.uid}.json"]
    assert node.mig_instances() == []
    kubelet.unprepare(batch)
    assert node.checkpoint()["claims"] == {} and node.cdi_files() == []


def test_device_of_another_claim_is_refused(
    kubelet: KubeletClient, node: SimNode, claims: ClaimFactory
) -> None:
    first = claim_id("twice", claims.make("twice", [Result("gpu", "gpu-5")]))
    second = claim_id("twice", claims.make("twice", [Result("gpu", "gpu-5")]))
    mig_on_same = claim_id("twice", claims.make("twice", [Result("gpu", "gpu-5-mig-1g10gb-19-0")]))
    assert kubelet.prepare([first]).claims[first.uid].error == ""
    answer = kubelet.prepare([second, mig_on_same])
    for other in (second, mig_on_same):
        error = answer.claims[other.uid].error
        assert "already allocated to different claim" in error and first.name in error, error
    assert set(node.checkpoint()["claims"]) == {first.uid}
    # `second`, a whole GPU as it is, is checked with its completed record after its spec was written: the
    # refusal removes that spec and leaves the first claim's alone
    assert node.cdi_files() == [f"k8s.gpu.nvidia.com-claim_{first.uid}.json"]
    kubelet.unprepare([first])
    assert kubelet.prepare([second]).claims[second.uid].error == ""  # free again
    kubelet.unprepare([second])


def test_dynamic_mig_device_gets_capability_nodes(
    kubelet: KubeletClient, node: SimNode, claims: ClaimFactory
) -> None:
    claim = claim_id("mig", claims.make("mig", [Result("m", "gpu-6-mig-1g10gb-19-2")]))
    answer = kubelet.prepare([claim])
    assert answer.claims[claim.uid].error == ""
    assert len(node.mig_instances()) == 1
    spec = json.loads((node.cdi_root / f"k8s.gpu.nvidia.com-claim_{claim.uid}.json").read_text())
    paths = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert paths[0] == "/dev/nvidia6"
    assert len([p for p in paths if p.startswith("/dev/nvidia-caps/nvidia-cap")]) == 2
    assert any(e.startswith("DRA_GPU_DEVICES=MIG-") for e in spec["containerEdits"]["env"])
    kubelet.unprepare([claim])
    assert node.mig_instances() == []


def _mount_tmpfs(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)


def test_unwritable_cdi_root_fails_the_claim_and_rolls_back(
    kubelet: KubeletClient, node: SimNode, claims: ClaimFactory
) -> None:
    claim = claim_id("cdi", claims.make("cdi", [Result("gpu", "gpu-1")], [opaque(time_slicing("Short"))]))
    _mount_tmpfs(node.cdi_root, "ro,size=1m")
    try:
        error = kubelet.prepare([claim]).claims[claim.uid].error
    finally:
        subprocess.run(["umount", str(node.cdi_root)], check=True)
    assert claim.name in error and str(node.cdi_root) in error and "Read-only" in error, error
    assert node.checkpoint()["claims"] == {}
    assert node.timeslices() == {}  # the time-slice setting was undone
    assert kubelet.prepare([claim]).claims[claim.uid].error == ""  # and it works once writable
    kubelet.unprepare([claim])


def test_disk_full_checkpoint_fails_the_claim_cleanly(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    _mount_tmpfs(node.plugin_dir, "size=256k")
    process: PluginProcess | None = None
    try:
        process = start_plugin()
        kubelet = KubeletClient(node.registration_socket)
        first = claim_id("full", claims.make("full", [Result("gpu", "gpu-0")]))
        assert kubelet.prepare([first]).claims[first.uid].error == ""
        before = (node.plugin_dir / "checkpoint.json").read_bytes()
        filler = node.plugin_dir / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=4k", "count=1000"], capture_output=True)
        second = claim_id("full", claims.make("full", [Result("gpu", "gpu-1")], [opaque(time_slicing())]))
        error = kubelet.prepare([second]).claims[second.uid].error
        assert second.name in error and "disk full" in error, error
        assert (node.plugin_dir / "checkpoint.json").read_bytes() == before
        assert node.cdi_files() == [f"k8s.gpu.nvidia.com-claim_{first.uid}.json"]
        assert node.timeslices() == {}
        filler.unlink()
        assert kubelet.prepare([second]).claims[second.uid].error == ""
        kubelet.unprepare([first, second])
        assert node.checkpoint()["claims"] == {}
        kubelet.close()
    finally:
        if process is not None:
            process.stop()
        subprocess.run(["umount", str(node.plugin_dir)], check=True)


def test_rolling_update_mode_puts_the_uid_in_socket_names(
    start_plugin: Callable[..., PluginProcess], node: SimNode
) -> None:
    process = start_plugin(wait=False, extra_args=["--plugin-uid", "pod-1234"])
    reg = node.registrar_dir / "gpu.nvidia.com-pod-1234-reg.sock"
    info = wait_for_socket(reg, process.proc, process.log_tail)
    assert info.endpoint == str(node.plugin_dir / "dra-pod-1234.sock")
    assert not node.registration_socket.exists()


def test_sigterm_removes_sockets_and_exits_cleanly(
    start_plugin: Callable[..., PluginProcess], node: SimNode
) -> None:
    # A stale socket from a crashed predecessor must not stop the start.
    import socket

    node.plugin_dir.mkdir(parents=True, exist_ok=True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(node.plugin_dir / "dra.sock"))
    stale.close()
    process = start_plugin()
    assert process.stop() == 0
    assert not node.registration_socket.exists()
    assert not (node.plugin_dir / "dra.sock").exists()


def test_http_health_and_metrics(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    import time
    import urllib.error
    import urllib.request

    from tests.support.control_plane import free_port

    port, probe_port = free_port(), free_port()
    process = start_plugin(http_port=port, extra_args=["--healthcheck-port", str(probe_port)])
    base = f"http://127.0.0.1:{port}"
    for url in (f"{base}/healthz", f"{base}/readyz"):
        deadline = time.monotonic() + 20  # the endpoints start just after the sockets appear
        while True:
            try:
                with urllib.request.urlopen(url, timeout=10) as resp:
                    assert resp.status == 200 and resp.read() == b"ok\n"
                break
            except urllib.error.URLError:
                assert time.monotonic() < deadline, f"{url} never answered 200"
                time.sleep(0.2)
    # The health-check port speaks grpc.health.v1 (as NVIDIA's plugin), not HTTP: no metrics there.
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{probe_port}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="liveness"), timeout=10, wait_for_ready=True
        )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    import http.client

    with pytest.raises((http.client.HTTPException, OSError)):  # HTTP/1.1 gets no HTTP answer there
        urllib.request.urlopen(f"http://127.0.0.1:{probe_port}/metrics", timeout=10)
    log_line = json.loads(process.log_path.read_text().splitlines()[0])  # structured JSON logs
    assert {"event", "level", "timestamp"} <= set(log_line)
    kubelet = KubeletClient(node.registration_socket)
    claim = claim_id("metrics", claims.make("metrics", [Result("gpu", "gpu-0")]))
    kubelet.prepare([claim, ClaimId("metrics", "00000000-0000-0000-0000-00000000000f", "gone")])
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert 'dra_gpu_claims_total{operation="prepare",outcome="ok"} 1.0' in text
    assert 'dra_gpu_claim_errors_total{operation="prepare",reason="not_found"} 1.0' in text
    assert "dra_gpu_prepared_devices 1.0" in text
    assert "dra_gpu_apiserver_wait_seconds_count" in text
    kubelet.unprepare([claim])
    kubelet.close()


def test_one_process_publishes_slices_and_serves(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory, kube_apiserver: object
) -> None:
    import time

    from kubernetes import client

    start_plugin(extra_args=["--publish-slices", "true"])
    api = client.ResourceV1Api(claims.api.api_client)
    deadline = time.monotonic() + 30
    devices: list[str] = []
    while time.monotonic() < deadline and "gpu-7" not in devices:
        listed = json.loads(
            api.list_resource_slice(field_selector=f"spec.nodeName={node.name}", _preload_content=False).data
        )
        devices = [d["name"] for s in listed["items"] for d in s["spec"].get("devices", [])]
        time.sleep(0.2)
    assert {"gpu-0", "gpu-7", "gpu-0-shared", "gpu-3-mig-1g10gb-19-0"} <= set(devices)
    kubelet = KubeletClient(node.registration_socket)
    claim = claim_id("slices", claims.make("slices", [Result("gpu", "gpu-3")]))
    assert kubelet.prepare([claim]).claims[claim.uid].error == ""
    kubelet.unprepare([claim])
    kubelet.close()


@pytest.mark.parametrize("service", SERVICES)
def test_share_id_is_echoed_in_v1_only(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory, service: str
) -> None:
    import uuid as uuidlib

    start_plugin()
    kubelet = KubeletClient(node.registration_socket, force_service=service)
    share = str(uuidlib.uuid4())
    other_share = str(uuidlib.uuid4())
    first = claim_id(
        "share",
        claims.make(
            "share",
            [Result("gpu", "gpu-2-shared", share_id=share, consumed={"memory": "4Gi", "compute": "20"})],
        ),
    )
    second = claim_id(
        "share",
        claims.make(
            "share",
            [
                Result(
                    "gpu", "gpu-2-shared", share_id=other_share, consumed={"memory": "8Gi", "compute": "30"}
                )
            ],
        ),
    )
    answer = kubelet.prepare([first, second])
    for claim, share_id in ((first, share), (second, other_share)):
        assert answer.claims[claim.uid].error == "", answer.claims[claim.uid].error
        device = answer.claims[claim.uid].devices[0]
        assert device.device_name == "gpu-2-shared"
        if service == "v1.DRAPlugin":
            assert device.HasField("share_id") and device.share_id == share_id
        else:
            assert "share_id" not in type(device).DESCRIPTOR.fields_by_name
    # both are clients of gpu-2's one MPS server, each with its own share as client limits
    assert mps_host_dir(node, first.uid) == mps_host_dir(node, second.uid)
    for claim, percent, mib in ((first, 20, 4096), (second, 30, 8192)):
        env = dict(e.split("=", 1) for e in claim_edits(node, claim.uid).env)
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps/pipe"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(percent)
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={mib}M"
    assert kubelet.unprepare([first, second]).claims[first.uid].error == ""
    assert node.checkpoint()["claims"] == {}
    kubelet.close()


def test_admin_access_may_share_a_prepared_device(
    kubelet: KubeletClient, node: SimNode, claims: ClaimFactory
) -> None:
    user = claim_id("users", claims.make("users", [Result("gpu", "gpu-4")], [opaque(time_slicing("Short"))]))
    claims.namespace("monitoring", {"resource.kubernetes.io/admin-access": "true"})
    name, uid = claims.create("monitoring", ["watch"], admin_access=True)
    claims.allocate(
        "monitoring", name, [Result("watch", "gpu-4", admin_access=True)], [opaque(time_slicing("Long"))]
    )
    admin = ClaimId("monitoring", uid, name)
    answer = kubelet.prepare([user, admin])
    assert answer.claims[user.uid].error == "" and answer.claims[admin.uid].error == ""
    assert list(node.timeslices().values()) == [1]  # the admin claim's config does not reconfigure the GPU
    kubelet.unprepare([admin])
    assert list(node.timeslices().values()) == [1]
    kubelet.unprepare([user])
    assert node.checkpoint()["claims"] == {}
