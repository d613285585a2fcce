"""The webhook server under hostile or careless clients: a fixed number of threads however many connections,
and no client, idle or trickling bytes, holds a worker past the request deadline."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from contextlib import AbstractContextManager, ExitStack

import pytest
from webhook_helpers import Cert, serving

from dra_gpu.webhook.server import TlsFiles, WebhookServer

WORKERS = 4
REQUEST_TIMEOUT_S = 2.0
IDLE_TIMEOUT_S = 1.0
HANDSHAKE_TIMEOUT_S = 0.5


def running(cert: Cert, workers: int = WORKERS) -> AbstractContextManager[WebhookServer]:
    server = WebhookServer(
        "127.0.0.1",
        0,
        TlsFiles(str(cert.cert_file), str(cert.key_file)),
        workers=workers,
        request_timeout_s=REQUEST_TIMEOUT_S,
        idle_timeout_s=IDLE_TIMEOUT_S,
        handshake_timeout_s=HANDSHAKE_TIMEOUT_S,
    )
    return serving(server)


def _healthz(cert: Cert, port: int, timeout_s: float = 15) -> float:
    """Seconds until GET /healthz answered 200 on a new connection."""
    started = time.monotonic()
    context = ssl.create_default_context(cafile=str(cert.cert_file))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=timeout_s)
    try:
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        assert (response.status, response.read()) == (200, b"ok")
    finally:
        conn.close()
    return time.monotonic() - started


def _idle_connections(stack: ExitStack, port: int, count: int) -> list[socket.socket]:
    """TCP connections that never start their TLS handshake."""
    return [
        stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5)) for _ in range(count)
    ]


def test_many_connections_never_start_more_threads_than_workers(cert: Cert) -> None:
    before = threading.active_count()
    with running(cert) as server, ExitStack() as stack:
        started = threading.active_count() - before
        assert started == WORKERS + 1, f"{started} threads: the workers and serve_forever's"
        # Every worker held by a client that never starts its handshake, the queue (4 per worker) full, more
        # waiting in the kernel's listen backlog: still only the workers' threads.
        _idle_connections(stack, server.port, 10 * WORKERS)
        time.sleep(0.5)
        assert threading.active_count() - before == started, "connections started threads"
        # A real client behind them all is served once they are cut off at their handshake deadline.
        took = _healthz(cert, server.port)
        # (each worker gives each idle client its handshake timeout: 10 rounds)
        assert took < 10 * HANDSHAKE_TIMEOUT_S + 3, f"served after {took:.1f}s"
        assert threading.active_count() - before == started


def test_idle_clients_below_the_pool_size_do_not_delay_others(cert: Cert) -> None:
    with running(cert) as server, ExitStack() as stack:
        _idle_connections(stack, server.port, WORKERS - 1)
        time.sleep(0.2)
        assert _healthz(cert, server.port) < 0.5


def _trickle(port: int, closed_at: list[float]) -> None:
    """A TLS client that sends its request one byte at a time, never waiting long enough for the idle
    timeout, until the server closes the connection (or 3 request timeouts pass); records when."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = b"POST /validate-resource-claim-parameters HTTP/1.1\r\nContent-Length: 100000\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        tls = context.wrap_socket(raw)
        started = time.monotonic()
        try:
            for byte in request + b"{" * 100000:
                if time.monotonic() - started > 3 * REQUEST_TIMEOUT_S:
                    return
                tls.sendall(bytes([byte]))
                time.sleep(IDLE_TIMEOUT_S / 4)
        except OSError:
            closed_at.append(time.monotonic() - started)
        finally:
            tls.close()


def test_a_trickling_client_is_cut_off_at_the_request_deadline(cert: Cert) -> None:
    """One worker, held by a client that keeps every read short of the idle timeout: the server ends that
    connection at the request deadline, and a client queued behind it is served then."""
    with running(cert, workers=1) as server:
        closed_at: list[float] = []
        trickler = threading.Thread(target=_trickle, args=(server.port, closed_at), daemon=True)
        trickler.start()
        time.sleep(0.3)
        try:
            took = _healthz(cert, server.port)
        finally:
            trickler.join(timeout=10)
        assert closed_at, "the trickling connection was never closed by the server"
        assert closed_at[0] < REQUEST_TIMEOUT_S + 1.5, f"held for {closed_at[0]:.1f}s"
        assert took < REQUEST_TIMEOUT_S + 1.5, f"the queued client waited {took:.1f}s"


def test_keep_alive_requests_share_a_connection_and_an_idle_one_is_closed(cert: Cert) -> None:
    with running(cert) as server:
        context = ssl.create_default_context(cafile=str(cert.cert_file))
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=5)
        try:
            for _ in range(3):
                conn.request("GET", "/healthz")
                assert conn.getresponse().read() == b"ok"
            sock = conn.sock
            assert sock is not None
            time.sleep(IDLE_TIMEOUT_S + 0.5)
            sock.settimeout(2)
            assert _peer_closed(sock), "the idle keep-alive connection still holds a worker"
        finally:
            conn.close()


def _peer_closed(sock: socket.socket) -> bool:
    """A read returns end of file (or fails) rather than timing out."""
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except (OSError, ssl.SSLError):
        return True


def test_workers_must_be_positive(cert: Cert) -> None:
    with pytest.raises(ValueError, match="workers must be at least 1"):
        WebhookServer("127.0.0.1", 0, TlsFiles(str(cert.cert_file), str(cert.key_file)), workers=0)


@pytest.mark.parametrize(("flag", "value"), [("--workers", "0"), ("--request-timeout", "-1")])
def test_cli_refuses_bad_limits_naming_the_flag(cert: Cert, flag: str, value: str) -> None:
    import subprocess
    import sys

    argv = [sys.executable, "-m", "dra_gpu.cli.main", "webhook", "--tls-cert-file", str(cert.cert_file)]
    argv += ["--tls-private-key-file", str(cert.key_file), "--port", "0", flag, value]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2 and flag in result.stderr, result.stderr
