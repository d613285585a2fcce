"""A real HTTPS webhook server on loopback with a freshly generated self-signed certificate."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from webhook_helpers import Cert, RunningWebhook, make_cert

from dra_gpu.webhook.server import TlsFiles, WebhookServer


@pytest.fixture(scope="session")
def cert(tmp_path_factory: pytest.TempPathFactory) -> Cert:
    return make_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def webhook(cert: Cert) -> Iterator[RunningWebhook]:
    server = WebhookServer("127.0.0.1", 0, TlsFiles(str(cert.cert_file), str(cert.key_file)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield RunningWebhook(server, cert)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
