"""grpc.health.v1 on the health-check port: liveness and readiness that never queue behind prepare work.

The answers come from a table kept current by a checker thread, on a gRPC server of its own (its own small
thread pool), so a probe is answered at once whatever the DRA server is doing. The checker looks at each
socket the way the kubelet first meets it, without any call that takes the prepare lock or a DRA worker:

- `pluginregistration.Registration`: `GetInfo` on the registration socket (its own 2-thread server), and the
  answer must name our driver and DRA socket.
- `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` / `...v1beta1.DRAPlugin`: the DRA socket completes an HTTP/2
  connection (done by gRPC's C core, not by the Python workers that a burst of prepares can all hold) and
  the version is among those registration advertises.
- `""` (what a probe without `service` asks) and `liveness` (the name NVIDIA's chart asks for): all of the
  above. `readiness`: that, and start-up cleanup done.

A slow MIG creation holding every DRA worker is not a dead plugin; restarting it mid-work would be the fault.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dra_gpu.plugin.protos import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc
from dra_gpu.plugin.server import SocketPaths

log = structlog.get_logger(__name__)

SERVICE_REGISTRATION = "pluginregistration.Registration"
SERVICE_DRA = {
    "v1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
    "v1beta1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
}
SERVICE_OVERALL = ""
SERVICE_LIVENESS = "liveness"
SERVICE_READINESS = "readiness"
CHECK_TIMEOUT_S = 3.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def check_sockets(paths: SocketPaths, driver_name: str, timeout_s: float = CHECK_TIMEOUT_S) -> dict[str, str]:
    """Problem per service name ('' when fine), for every service the health table reports."""
    problems = {SERVICE_REGISTRATION: "", **{name: "" for name in SERVICE_DRA.values()}}
    advertised: list[str] = []
    try:
        with grpc.insecure_channel(f"unix://{paths.registration}") as channel:
            info = pluginregistration_v1_pb2_grpc.RegistrationStub(channel).GetInfo(
                pluginregistration_v1_pb2.InfoRequest(), timeout=timeout_s
            )
        advertised = list(info.supported_versions)
        if info.name != driver_name or info.endpoint != str(paths.endpoint):
            problems[SERVICE_REGISTRATION] = f"registration answers for {info.name} at {info.endpoint}"
    except grpc.RpcError as err:
        problems[SERVICE_REGISTRATION] = f"GetInfo failed: {err.code().name}: {err.details()}"
    dra_problem = ""
    try:
        with grpc.insecure_channel(f"unix://{paths.endpoint}") as channel:
            grpc.channel_ready_future(channel).result(timeout=timeout_s)
    except grpc.FutureTimeoutError:
        dra_problem = f"DRA socket {paths.endpoint} does not accept a connection within {timeout_s:g}s"
    for version, name in SERVICE_DRA.items():
        if dra_problem:
            problems[name] = dra_problem
        elif advertised and version not in advertised:
            problems[name] = f"{version} not served (registration advertises {', '.join(advertised)})"
    return problems


class PluginHealth:
    """The grpc.health.v1 table and the thread that keeps it current."""

    def __init__(
        self,
        check: Callable[[], dict[str, str]],
        started: Callable[[], bool],
        *,
        period_s: float = 5.0,
    ) -> None:
        self.servicer = health.HealthServicer(experimental_non_blocking=True)
        self._check = check
        self._started = started
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="grpc-health", daemon=True)
        self._problems: dict[str, str] = {}
        for name in (SERVICE_OVERALL, SERVICE_LIVENESS, SERVICE_READINESS, SERVICE_REGISTRATION):
            self.servicer.set(name, health_pb2.HealthCheckResponse.UNKNOWN)
        for name in SERVICE_DRA.values():
            self.servicer.set(name, health_pb2.HealthCheckResponse.UNKNOWN)

    def refresh(self) -> dict[str, str]:
        """Run the checks once and publish them; returns the problems (name -> '' when fine)."""
        problems = self._check()
        overall = "; ".join(f"{name}: {p}" for name, p in sorted(problems.items()) if p)
        for name, problem in problems.items():
            self.servicer.set(name, NOT_SERVING if problem else SERVING)
        for name in (SERVICE_OVERALL, SERVICE_LIVENESS):
            self.servicer.set(name, NOT_SERVING if overall else SERVING)
        ready = not overall and self._started()
        self.servicer.set(SERVICE_READINESS, SERVING if ready else NOT_SERVING)
        if overall and overall != self._problems.get(SERVICE_OVERALL):
            log.warning("plugin health check failed", problem=overall)
        self._problems = {**problems, SERVICE_OVERALL: overall}
        return self._problems

    def problem(self, readiness: bool = False) -> str | None:
        """The last published verdict for /healthz (liveness) or /readyz: None when serving."""
        overall = self._problems.get(SERVICE_OVERALL)
        if overall is None:
            return "health not checked yet"
        if overall:
            return overall
        if readiness and not self._started():
            return "start-up cleanup not finished"
        return None

    def start(self) -> None:
        self.refresh()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.servicer.enter_graceful_shutdown()

    def _loop(self) -> None:
        while not self._stop.wait(self._period_s):
            try:
                self.refresh()
            except Exception:  # a bug in a check must not silently freeze the table at SERVING
                log.exception("health check raised")
                for name in (SERVICE_OVERALL, SERVICE_LIVENESS, SERVICE_READINESS):
                    self.servicer.set(name, NOT_SERVING)


class HealthServer:
    """grpc.health.v1 on a TCP port, with a pool of its own."""

    def __init__(self, health_table: PluginHealth, port: int, host: str = "0.0.0.0") -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="health"))
        health_pb2_grpc.add_HealthServicer_to_server(health_table.servicer, self._server)
        self.port = self._server.add_insecure_port(f"{host}:{port}")

    def start(self) -> None:
        self._server.start()

    def stop(self, grace_s: float = 1.0) -> None:
        self._server.stop(grace_s).wait()
