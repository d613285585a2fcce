"""The validating admission webhook's HTTPS server (stdlib `http.server` + `ssl`, a fixed pool of workers).

    POST /validate-resource-claim-parameters   AdmissionReview v1 in, AdmissionReview v1 out
    GET  /healthz                              200 "ok"

The certificate and key are files mounted from a Secret; they are re-read when they change, so a rotated
certificate is served without a restart (tls_reload.py). Connections are served by `workers` threads, each
request within `request_timeout_s` (connections.py), so no client can make the server start threads or hold
them for ever.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import structlog

from dra_gpu.webhook.connections import Deadlines, WorkerPool
from dra_gpu.webhook.review import review
from dra_gpu.webhook.tls_reload import ReloadingContext, TlsFiles

__all__ = ["HEALTH_PATH", "VALIDATE_PATH", "TlsFiles", "WebhookServer", "serve"]

log = structlog.get_logger(__name__)

VALIDATE_PATH = "/validate-resource-claim-parameters"
HEALTH_PATH = "/healthz"
MAX_BODY_BYTES = 3 * 1024 * 1024  # the apiserver's request limit; a bigger body is not an AdmissionReview
# Enough for the API servers' concurrent calls (each answer takes about a millisecond) and their idle
# keep-alive connections; a thread costs little, a bound is what matters.
WORKERS = 32
REQUEST_TIMEOUT_S = 10.0  # the API server's own limit for a webhook call is at most 30 s, default 10 s
HANDSHAKE_TIMEOUT_S = 3.0  # a worker's wait for a TLS handshake (milliseconds for the API server)
# An idle keep-alive connection gives its worker back this soon; the API server reconnects when it needs to.
IDLE_TIMEOUT_S = 5.0


class _Handler(BaseHTTPRequestHandler):
    server_version = "dra-gpu-webhook"
    protocol_version = "HTTP/1.1"
    server: WebhookServer

    def handle_one_request(self) -> None:
        # Each request on a keep-alive connection gets its own deadline, counted from when the worker starts
        # waiting for it (an idle connection is closed sooner, by the socket timeout).
        self.server.deadlines.set(self.connection.fileno(), self.server.request_timeout_s)
        super().handle_one_request()

    def do_GET(self) -> None:
        if self.path.split("?")[0] in (HEALTH_PATH, "/readyz", "/livez"):
            self._send(HTTPStatus.OK, b"ok", "text/plain")
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found", "text/plain")

    def do_POST(self) -> None:
        if self.path.split("?")[0] != VALIDATE_PATH:
            self._send(HTTPStatus.NOT_FOUND, b"not found", "text/plain")
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit() or int(length) > MAX_BODY_BYTES:
            self._send(HTTPStatus.BAD_REQUEST, b"Content-Length missing or too large", "text/plain")
            return
        raw = self.rfile.read(int(length))
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("body is not a JSON object")
            answer = review(body, self.server.refused_strategies)
        except (ValueError, UnicodeDecodeError) as err:
            self._send(HTTPStatus.BAD_REQUEST, f"bad AdmissionReview: {err}".encode(), "text/plain")
            return
        response = answer["response"]
        if not response["allowed"]:
            log.info("denied", uid=response["uid"], message=response["status"]["message"])
        self._send(HTTPStatus.OK, json.dumps(answer).encode(), "application/json")

    def _send(self, status: HTTPStatus, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http", client=self.address_string(), request=format % args)


class WebhookServer(HTTPServer):
    """HTTPS admission server. `serve_forever()` to run, `shutdown()` + `server_close()` to stop."""

    allow_reuse_address = True
    request_queue_size = 128  # listen backlog: connections beyond the queue wait in the kernel

    def __init__(
        self,
        host: str,
        port: int,
        tls: TlsFiles,
        workers: int = WORKERS,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
        refused_strategies: Mapping[str, str] | None = None,
    ) -> None:
        if min(request_timeout_s, idle_timeout_s, handshake_timeout_s) <= 0:
            raise ValueError("request, idle and handshake timeouts must be positive")
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self._tls = ReloadingContext(tls)
        # sharing strategy -> why claims asking for it are refused (its feature gate is off)
        self.refused_strategies: Mapping[str, str] = dict(refused_strategies or {})
        self.request_timeout_s = request_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.handshake_timeout_s = handshake_timeout_s
        self.deadlines = Deadlines()
        self._stopping = threading.Event()
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)
        self._pool = WorkerPool(self._serve_connection, workers, backlog=4 * workers)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        sock.settimeout(self.idle_timeout_s)  # bounds each blocking read or write
        return sock, address

    def process_request(self, request: Any, client_address: Any) -> None:
        # Every worker busy and the queue full: stop accepting (further clients wait in the listen backlog)
        # until a worker is free, and keep cutting off connections past their deadline meanwhile.
        while not self._pool.submit(request, client_address, timeout_s=0.1):
            self.deadlines.expire()
            if self._stopping.is_set():
                self._close(request)
                return

    def shutdown(self) -> None:
        self._stopping.set()
        super().shutdown()

    def service_actions(self) -> None:
        # Runs in serve_forever's loop (every poll interval, 0.5 s): deadlines need no thread of their own.
        self.deadlines.expire()

    def _serve_connection(self, sock: socket.socket, address: Any) -> None:
        # The TLS handshake runs in a worker, so a slow client cannot block the accept loop.
        fd, conn = sock.fileno(), sock
        # From here, not from accept: a client queued behind slow ones is not cut off for having waited.
        self.deadlines.set(fd, self.handshake_timeout_s)
        try:
            # wrap_socket takes over sock's descriptor; the handshake is explicit so that a failed one leaves
            # closing the descriptor to the finally below, after its deadline is forgotten.
            conn = self._tls.current().wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            conn.do_handshake()
            self.finish_request(conn, address)
        except (OSError, ssl.SSLError) as err:
            log.debug("webhook connection ended", client=address, error=str(err))
        finally:
            self.deadlines.forget(fd)  # before close: the descriptor number may be reused at once
            with contextlib.suppress(OSError):
                conn.close()

    def _close(self, sock: socket.socket) -> None:
        self.deadlines.forget(sock.fileno())
        with contextlib.suppress(OSError):
            sock.close()

    def server_close(self) -> None:
        super().server_close()
        for sock, _ in self._pool.stop():
            self._close(sock)


def serve(host: str, port: int, tls: TlsFiles) -> None:
    server = WebhookServer(host, port, tls)
    log.info("webhook listening", address=f"{host}:{server.port}", path=VALIDATE_PATH)
    try:
        server.serve_forever()
    finally:
        server.server_close()
