"""HTTP endpoint: Prometheus metrics, `/healthz` and `/readyz`.

The health checks go through the real sockets, as the kubelet would: the registration `GetInfo` on the
registration socket, then a no-op `NodePrepareResources` (no claims) on the DRA socket. `/readyz` also needs
the start-up cleanup to be done.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from dra_gpu.plugin.protos import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from dra_gpu.plugin.server import SocketPaths

PROBE_TIMEOUT_S = 5.0


def probe_sockets(paths: SocketPaths, driver_name: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when both sockets answer correctly, else what is wrong."""
    try:
        with grpc.insecure_channel(f"unix://{paths.registration}") as channel:
            info = pluginregistration_v1_pb2_grpc.RegistrationStub(channel).GetInfo(
                pluginregistration_v1_pb2.InfoRequest(), timeout=timeout_s
            )
        if info.name != driver_name or info.endpoint != str(paths.endpoint):
            return f"registration socket answers for {info.name} at {info.endpoint}"
        with grpc.insecure_channel(f"unix://{paths.endpoint}") as channel:
            dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(), timeout=timeout_s
            )
    except grpc.RpcError as exc:
        return f"gRPC check failed: {exc.code().name}: {exc.details()}"
    return None


class HttpEndpoint:
    def __init__(
        self,
        address: str,
        *,
        registry: CollectorRegistry | None,
        metrics_path: str,
        healthy: Callable[[], str | None],
        ready: Callable[[], str | None],
    ) -> None:
        host, _, port = address.rpartition(":")
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if registry is not None and path == metrics_path:
                    self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/livez", "/readyz"):
                    check = endpoint.ready if path == "/readyz" else endpoint.healthy
                    problem = check()
                    if problem is None:
                        self._reply(200, b"ok\n", "text/plain")
                    else:
                        self._reply(503, f"{problem}\n".encode(), "text/plain")
                else:
                    self._reply(404, b"not found\n", "text/plain")

            def _reply(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would flood the log

        self.healthy = healthy
        self.ready = ready
        self._server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
