"""Helpers for the webhook tests: a self-signed certificate and a client for a running server."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_gpu.webhook.server import VALIDATE_PATH, WebhookServer


@dataclass(frozen=True)
class Cert:
    cert_file: Path
    key_file: Path


def make_cert(directory: Path, common_name: str = "localhost") -> Cert:
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            f"/CN={common_name}",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return Cert(cert, key)


@dataclass
class RunningWebhook:
    server: WebhookServer
    cert: Cert

    def connection(self) -> http.client.HTTPSConnection:
        context = ssl.create_default_context(cafile=str(self.cert.cert_file))
        return http.client.HTTPSConnection("127.0.0.1", self.server.port, context=context, timeout=10)

    def post(self, body: bytes, path: str = VALIDATE_PATH) -> tuple[int, bytes]:
        conn = self.connection()
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def review(
        self, obj: dict[str, Any], operation: str = "CREATE", old: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        uid = "705ab4f5-6393-11e8-b7cc-42010a800002"
        body: dict[str, Any] = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {
                    "group": "resource.k8s.io",
                    "version": obj["apiVersion"].split("/")[-1],
                    "kind": obj["kind"],
                },
                "operation": operation,
                "object": obj,
            },
        }
        if old is not None:
            body["request"]["oldObject"] = old
        status, payload = self.post(json.dumps(body).encode())
        assert status == 200, payload
        answer: dict[str, Any] = json.loads(payload)
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["response"]["uid"] == uid
        response: dict[str, Any] = answer["response"]
        return response


@contextmanager
def serving(server: WebhookServer) -> Iterator[WebhookServer]:
    """`server` answering on its port in a thread, shut down and closed on exit."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def served_common_name(port: int) -> str:
    """The CN of the certificate the server presents to a new connection (the handshake must succeed)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    out = subprocess.run(
        ["openssl", "x509", "-inform", "DER", "-noout", "-subject"],
        input=der,
        capture_output=True,
        check=True,
    )
    return out.stdout.decode().strip().rsplit("=", 1)[-1].strip()
