"""The health table behind the gRPC health port: a dead socket turns liveness NOT_SERVING, readiness also
waits for start-up cleanup, and every service has its own verdict."""

from __future__ import annotations

from pathlib import Path

from grpc_health.v1 import health_pb2

from dra_gpu.plugin.grpc_health import (
    SERVICE_DRA,
    SERVICE_REGISTRATION,
    PluginHealth,
    check_sockets,
)
from dra_gpu.plugin.server import SocketPaths

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _status(table: PluginHealth, service: str) -> int:
    request = health_pb2.HealthCheckRequest(service=service)
    return int(table.servicer.Check(request, None).status)


def test_missing_sockets_are_not_serving(tmp_path: Path) -> None:
    paths = SocketPaths(tmp_path / "reg.sock", tmp_path / "gpu" / "dra.sock", tmp_path / "gpu")
    problems = check_sockets(paths, "gpu.nvidia.com", timeout_s=0.5)
    assert "GetInfo failed: UNAVAILABLE" in problems[SERVICE_REGISTRATION]
    assert all("does not accept a connection" in problems[name] for name in SERVICE_DRA.values())
    table = PluginHealth(lambda: check_sockets(paths, "gpu.nvidia.com", timeout_s=0.5), lambda: True)
    assert table.problem() == "health not checked yet"
    table.refresh()
    for service in ("", "liveness", "readiness", SERVICE_REGISTRATION, *SERVICE_DRA.values()):
        assert _status(table, service) == NOT_SERVING, service
    assert "GetInfo failed" in (table.problem() or "")


def test_each_service_has_its_verdict_and_readiness_waits_for_cleanup() -> None:
    started = False
    verdicts = {SERVICE_REGISTRATION: "", **{name: "" for name in SERVICE_DRA.values()}}
    table = PluginHealth(lambda: dict(verdicts), lambda: started)
    table.refresh()
    assert _status(table, "liveness") == SERVING and _status(table, "readiness") == NOT_SERVING
    assert table.problem() is None and table.problem(readiness=True) == "start-up cleanup not finished"
    started = True
    table.refresh()
    assert _status(table, "readiness") == SERVING and table.problem(readiness=True) is None
    v1beta1 = SERVICE_DRA["v1beta1.DRAPlugin"]
    verdicts[v1beta1] = "v1beta1.DRAPlugin not served"
    table.refresh()
    assert _status(table, v1beta1) == NOT_SERVING and _status(table, SERVICE_DRA["v1.DRAPlugin"]) == SERVING
    assert _status(table, "") == NOT_SERVING and "v1beta1.DRAPlugin not served" in (table.problem() or "")
    table.stop()
    assert _status(table, SERVICE_REGISTRATION) == NOT_SERVING  # shutting down: nothing reports healthy
