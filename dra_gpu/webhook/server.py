"""The validating admission webhook's HTTPS server (stdlib `http.server` + `ssl`, one thread per connection).

    POST /validate-resource-claim-parameters   AdmissionReview v1 in, AdmissionReview v1 out
    GET  /healthz                              200 "ok"

The certificate and key are files mounted from a Secret; they are re-read when their modification time
changes, so a rotated certificate is served without a restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog

from dra_gpu.webhook.review import review

log = structlog.get_logger(__name__)

VALIDATE_PATH = "/validate-resource-claim-parameters"
HEALTH_PATH = "/healthz"
MAX_BODY_BYTES = 3 * 1024 * 1024  # the apiserver's request limit; a bigger body is not an AdmissionReview
REQUEST_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class TlsFiles:
    cert_file: str
    key_file: str


class _ReloadingContext:
    """An SSLContext that reloads cert/key when either file changes (checked at most once per connection)."""

    def __init__(self, files: TlsFiles) -> None:
        self._files = files
        self._lock = threading.Lock()
        self._stamp: tuple[float, float] | None = None
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.maybe_reload()

    def maybe_reload(self) -> None:
        stamp = (os.stat(self._files.cert_file).st_mtime, os.stat(self._files.key_file).st_mtime)
        with self._lock:
            if stamp == self._stamp:
                return
            # load_cert_chain on a live context affects new handshakes only; open connections are unharmed.
            self.context.load_cert_chain(self._files.cert_file, self._files.key_file)
            if self._stamp is not None:
                log.info("webhook certificate reloaded", cert_file=self._files.cert_file)
            self._stamp = stamp


class _Handler(BaseHTTPRequestHandler):
    server_version = "dra-gpu-webhook"
    protocol_version = "HTTP/1.1"

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
            answer = review(body)
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


class WebhookServer(ThreadingHTTPServer):
    """HTTPS admission server. `serve_forever()` to run, `shutdown()` + `server_close()` to stop."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int, tls: TlsFiles) -> None:
        self._tls = _ReloadingContext(tls)
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        sock.settimeout(REQUEST_TIMEOUT_S)  # a client that never finishes its handshake must not pin a thread
        return sock, address

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake runs in the connection's thread, so a slow client cannot block the accept loop.
        try:
            self._tls.maybe_reload()
            tls_sock = self._tls.context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError) as err:
            log.debug("tls handshake failed", client=client_address, error=str(err))
            return
        try:
            super().finish_request(tls_sock, client_address)
        finally:
            with contextlib.suppress(OSError):
                tls_sock.close()


def serve(host: str, port: int, tls: TlsFiles) -> None:
    server = WebhookServer(host, port, tls)
    log.info("webhook listening", address=f"{host}:{server.port}", path=VALIDATE_PATH)
    try:
        server.serve_forever()
    finally:
        server.server_close()
