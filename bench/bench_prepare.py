"""NodePrepareResources speed through the plugin's real socket, against a real kube-apiserver.

- latency: 200 one-GPU claims prepared one after the other (each unprepared before the next), p50/p99 of the
  gRPC call as the kubelet sees it, and the same for unprepare;
- burst: 64 claims for fractional GPU shares (8 per GPU on a simulated DGX H100) prepared by 64 concurrent
  calls, as when 64 pods land on the node at once; throughput in claims per second;
- the share of prepare time spent waiting on the API server (GET of the claim), from the plugin's own metrics;
- the disk's cost of one durable file replacement (fsync + rename + directory fsync), since a prepare alone
  makes three checkpoint writes, one durable (concurrent prepares share writes): on a shared, busy disk this,
  not the plugin, dominates the tail.
Target: p99 < 20 ms for the one-GPU claim.
"""

from __future__ import annotations

import re
import statistics
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dra_gpu.checkpoint.atomic_file import atomic_write
from tests.plugin.kubelet_client import ClaimId, KubeletClient
from tests.plugin.plugin_harness import ClaimFactory, PluginProcess, Result, SimNode
from tests.support.control_plane import ControlPlane, free_port

LATENCY_CLAIMS = 200
BURST_CLAIMS = 64


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return ordered[index]


def _metric(text: str, name: str, labels: str = "") -> float:
    pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" ([0-9.e+-]+)"
    match = re.search(pattern, text)
    return float(match.group(1)) if match else 0.0


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _durable_replace_ms(directory: Path, samples: int = 50) -> float:
    """The disk's cost of one durable atomic replacement (what each checkpoint write pays), median."""
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        atomic_write(directory / "probe.json", b"{}" * 1000, error=OSError)
        times.append(time.perf_counter() - started)
    return _ms(statistics.median(times))


def run() -> dict[str, Any]:
    plane = ControlPlane()
    plane.start()
    node = SimNode(name=f"bench-{uuid.uuid4().hex[:6]}")
    port = free_port()
    process: PluginProcess | None = None
    try:
        factory = ClaimFactory(plane.api_client(), node.name)
        process = PluginProcess(node, str(plane.kubeconfig), http_port=port)
        process.wait_ready()
        kubelet = KubeletClient(node.registration_socket)

        one_gpu = [
            ClaimId("bench", *reversed(factory.make("bench", [Result("gpu", "gpu-0")])))
            for _ in range(LATENCY_CLAIMS)
        ]
        for warm in one_gpu[:5]:  # connection set-up, first-call imports
            kubelet.prepare([warm])
            kubelet.unprepare([warm])
        before = _scrape(port)
        prepare_s: list[float] = []
        unprepare_s: list[float] = []
        for claim in one_gpu[5:]:
            started = time.perf_counter()
            answer = kubelet.prepare([claim])
            prepare_s.append(time.perf_counter() - started)
            if answer.claims[claim.uid].error:
                raise RuntimeError(answer.claims[claim.uid].error)
            started = time.perf_counter()
            kubelet.unprepare([claim])
            unprepare_s.append(time.perf_counter() - started)
        after = _scrape(port)
        wait = _metric(after, "dra_gpu_apiserver_wait_seconds_sum") - _metric(
            before, "dra_gpu_apiserver_wait_seconds_sum"
        )
        busy = _metric(after, "dra_gpu_claim_duration_seconds_sum", 'operation="prepare"') - _metric(
            before, "dra_gpu_claim_duration_seconds_sum", 'operation="prepare"'
        )

        burst: list[ClaimId] = []
        for gpu in range(8):
            for _ in range(BURST_CLAIMS // 8):
                result = Result(
                    "gpu",
                    f"gpu-{gpu}-shared",
                    share_id=str(uuid.uuid4()),
                    consumed={"memory": "4Gi", "compute": "10"},
                )
                burst.append(ClaimId("bench", *reversed(factory.make("bench", [result]))))
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=BURST_CLAIMS) as pool:
            answers = list(pool.map(lambda c: kubelet.prepare([c]), burst))
        burst_s = time.perf_counter() - started
        failed = [a.claims[c.uid].error for a, c in zip(answers, burst, strict=True) if a.claims[c.uid].error]
        if failed:
            raise RuntimeError(f"{len(failed)} burst claims failed, e.g. {failed[0]}")
        with ThreadPoolExecutor(max_workers=BURST_CLAIMS) as pool:
            list(pool.map(lambda c: kubelet.unprepare([c]), burst))
        kubelet.close()
        return {
            "durable_file_replace_p50_ms": _durable_replace_ms(node.base),
            "checkpoint_writes_per_prepare": 3,
            "prepare_one_gpu_p50_ms": _ms(statistics.median(prepare_s)),
            "prepare_one_gpu_p99_ms": _ms(_percentile(prepare_s, 99)),
            "prepare_one_gpu_max_ms": _ms(max(prepare_s)),
            "unprepare_one_gpu_p50_ms": _ms(statistics.median(unprepare_s)),
            "unprepare_one_gpu_p99_ms": _ms(_percentile(unprepare_s, 99)),
            "prepare_samples": len(prepare_s),
            "apiserver_wait_share_of_prepare": round(wait / busy, 3) if busy else None,
            "apiserver_wait_per_prepare_ms": _ms(wait / len(prepare_s)),
            "burst_claims": len(burst),
            "burst_wall_s": round(burst_s, 3),
            "burst_claims_per_s": round(len(burst) / burst_s, 1),
            "target_p99_ms": 20,
        }
    finally:
        if process is not None:
            process.stop()
        node.cleanup()
        plane.stop()


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
