"""HTTP endpoint: Prometheus metrics, `/healthz` and `/readyz`.

`healthy` and `ready` read the verdicts that `grpc_health.PluginHealth` keeps current from its own thread, so
an HTTP probe never waits behind prepare work either. `/readyz` also needs the start-up cleanup to be done.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


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
