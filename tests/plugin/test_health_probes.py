"""The gRPC health port answers at once while a burst of prepares waits behind a slow MIG creation.

The kubelet restarts a plugin whose liveness probe fails: a probe that queued behind prepare work (the DRA
workers, the node-wide prepare lock) got the plugin killed in the middle of a burst. Here 64 prepares hit the
plugin while every MIG creation on GPUs 0 and 1 takes a second (latency injected in the simulated NVML, as
`dra-gpu hardware fault --delay-seconds` does), and grpc.health.v1 must answer SERVING within a tenth of the
chart's probe timeout the whole time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.plugin.kubelet_client import ClaimId, KubeletClient
from tests.plugin.plugin_harness import ClaimFactory, PluginProcess, Result, SimNode
from tests.support.control_plane import free_port

pytestmark = pytest.mark.apiserver

PROBE_TIMEOUT_S = 5.0  # the chart's kubeletPlugin.probeTimeoutSeconds
SERVICES = [
    "",
    "liveness",
    "readiness",
    "pluginregistration.Registration",
    "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
    "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
]


def _check(stub: Any, service: str, timeout: float, wait: bool = False) -> int:
    request = health_pb2.HealthCheckRequest(service=service)
    return int(stub.Check(request, timeout=timeout, wait_for_ready=wait).status)


def test_health_answers_during_a_prepare_burst_with_slow_mig_creation(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    port = free_port()
    start_plugin(extra_args=["--healthcheck-port", str(port)])
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + 30
    while _check(stub, "readiness", 5, wait=True) != health_pb2.HealthCheckResponse.SERVING:  # start-up
        assert time.monotonic() < deadline, "never ready"
        time.sleep(0.2)
    for service in SERVICES:
        assert _check(stub, service, 5) == health_pb2.HealthCheckResponse.SERVING, service
    with pytest.raises(grpc.RpcError) as unknown:
        _check(stub, "no.such.Service", 5)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

    for gpu in ("0", "1"):
        for function in ("nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceCreateComputeInstance"):
            node.hardware_cli("fault", "--index", gpu, "--function", function, "--delay-seconds", "0.5")
    kubelet = KubeletClient(node.registration_socket)
    mig = []
    for gpu in range(4):
        for start in range(7):
            name, uid = claims.make("burst", [Result("gpu", f"gpu-{gpu}-mig-1g10gb-19-{start}")])
            mig.append(ClaimId("burst", uid, name))
    calls = (mig * 3)[:64]  # 28 claims, some prepared by several pods at once

    slowest = 0.0
    answers: list[int] = []
    burst_done = threading.Event()

    def probe() -> None:
        nonlocal slowest
        while not burst_done.is_set():
            began = time.monotonic()
            answers.append(_check(stub, "liveness", PROBE_TIMEOUT_S / 10))
            answers.append(_check(stub, "readiness", PROBE_TIMEOUT_S / 10))
            slowest = max(slowest, time.monotonic() - began)
            time.sleep(0.1)

    prober = threading.Thread(target=probe)
    began = time.monotonic()
    prober.start()
    try:
        with ThreadPoolExecutor(max_workers=64) as pool:
            results = list(pool.map(lambda c: kubelet.prepare([c], timeout=120), calls))
    finally:
        burst_done.set()
        prober.join(timeout=30)
    burst_s = time.monotonic() - began
    print(f"64 prepares: {burst_s:.1f}s; {len(answers)} health answers, slowest {slowest * 1000:.0f} ms")
    assert all(r.claims[c.uid].error == "" for r, c in zip(results, calls, strict=True))
    assert burst_s > 5, f"the injected MIG latency did not slow the burst down ({burst_s:.1f}s)"
    assert len(answers) > 10 and set(answers) == {health_pb2.HealthCheckResponse.SERVING}
    assert slowest < PROBE_TIMEOUT_S / 10, f"a health check took {slowest:.2f}s"
    kubelet.unprepare(mig)
    kubelet.close()
    channel.close()
