"""`--kube-api-qps` / `--kube-api-burst`: the plugin's API client keeps to client-go's token bucket, measured
on real HTTP requests to a local server (requests counted on the server side, with their arrival times)."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dra_gpu.cli.main import build_parser
from dra_gpu.kube.client import LazyApiClient, request_json
from dra_gpu.kube.rate_limit import DEFAULT_BURST, DEFAULT_QPS, TokenBucket


class _Version(http.server.BaseHTTPRequestHandler):
    arrivals: list[float] = []

    def do_GET(self) -> None:
        type(self).arrivals.append(time.monotonic())
        body = json.dumps({"major": "1", "minor": "36"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[str]:
    _Version.arrivals = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Version)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                "clusters": [{"name": "k", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )
    yield str(path)
    server.shutdown()


def _send(kubeconfig: str, limiter: TokenBucket | None, count: int) -> float:
    api = LazyApiClient(kubeconfig, limiter)
    started = time.monotonic()
    for _ in range(count):
        assert request_json(api, "GET", "/version/")["minor"] == "36"
    return time.monotonic() - started


def test_requests_beyond_the_burst_wait_for_the_qps(kubeconfig: str) -> None:
    # burst 3 at 20 QPS: 3 at once, then one every 50 ms -> 9 requests take >= 6 x 50 ms
    elapsed = _send(kubeconfig, TokenBucket(20, 3), 9)
    assert elapsed >= 0.29, elapsed
    # what the server saw: request k (from 0) no sooner than (k - 2) / 20 s after the first
    since = [t - _Version.arrivals[0] for t in _Version.arrivals]
    assert len(since) == 9
    assert all(t >= (k - 2) * 0.05 - 0.01 for k, t in enumerate(since)), since


def test_a_negative_qps_turns_the_limit_off(kubeconfig: str) -> None:
    limited = _send(kubeconfig, TokenBucket(2, 1), 3)  # 1 at once, then 0.5 s each
    assert limited >= 0.95, limited
    assert _send(kubeconfig, TokenBucket(-1, 1), 20) < 0.9  # 20 requests, no waiting


def test_token_bucket_refills_at_qps_up_to_burst() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    bucket = TokenBucket(10, 2, clock=lambda: now[0], sleep=sleep)
    assert [bucket.take() for _ in range(2)] == [0.0, 0.0]  # the burst
    assert bucket.take() == pytest.approx(0.1)  # then 1/qps
    now[0] += 10.0  # a long pause refills to the burst, never beyond
    assert [bucket.take() for _ in range(2)] == [0.0, 0.0]
    assert bucket.take() == pytest.approx(0.1)
    defaults = TokenBucket(0, 0)  # client-go: QPS 0 and burst 0 mean its defaults
    assert (defaults.qps, defaults.burst) == (DEFAULT_QPS, DEFAULT_BURST)
    with pytest.raises(ValueError, match="--kube-api-burst"):
        TokenBucket(5, -1)


def test_flags_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser().parse_args(["kubelet-plugin", "--kube-api-qps", "50", "--kube-api-burst", "100"])
    assert (args.kube_api_qps, args.kube_api_burst) == (50.0, 100)
    monkeypatch.setenv("KUBE_API_QPS", "7.5")
    monkeypatch.setenv("KUBE_API_BURST", "15")
    args = build_parser().parse_args(["kubelet-plugin"])
    assert (args.kube_api_qps, args.kube_api_burst) == (7.5, 15)
    monkeypatch.delenv("KUBE_API_QPS")
    monkeypatch.delenv("KUBE_API_BURST")
    args = build_parser().parse_args(["kubelet-plugin"])
    assert (args.kube_api_qps, args.kube_api_burst) == (5.0, 10)  # NVIDIA's (client-go's) defaults
