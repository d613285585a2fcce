"""The kubelet plugin's figures in the shape of issue 16's side-by-side table, on a simulated DGX H100
against a real kube-apiserver, through the plugin's real DRA socket.

Rows: NodePrepareResources p50/p99 (one device, 200 in sequence); 64 whole-GPU claims in 8 waves of 8
concurrent prepares (claims/s, p99); 64 concurrent shared-GPU claims (claims/s); VmRSS idle and after the
bursts; process start -> registration socket answering (median of 3 starts).

The Go column (sigs.k8s.io/dra-example-driver against the same apiserver) is not built by this benchmark yet;
until it is, the figures the issue measured for it are printed for reference, marked as such.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.plugin.kubelet_client import ClaimId, KubeletClient
from tests.plugin.plugin_harness import ClaimFactory, PluginProcess, Result, SimNode
from tests.support.control_plane import ControlPlane

# Issue 16's measurement of the Go example driver (same machine class, three runs): reference only.
GO_REFERENCE = {
    "prepare_p50_ms": 5.91,
    "prepare_p99_ms": 12.77,
    "waves_claims_per_s": 381.0,
    "waves_p99_ms": 21.0,
    "shared_claims_per_s": 333.0,
    "rss_idle_mb": 44.0,
    "rss_after_mb": 48.0,
    "start_to_socket_s": 0.07,
}
GOALS = "prepare p99 <= 1.0x Go; waves >= 0.8x Go; shared >= 50 claims/s; RSS <= 60 MB; start < 0.3 s"


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def _start_to_socket(node: SimNode, kubeconfig: str) -> tuple[float, PluginProcess]:
    started = time.perf_counter()
    process = PluginProcess(node, kubeconfig)
    while not node.registration_socket.exists():
        if process.proc.poll() is not None:
            raise RuntimeError(f"plugin exited:\n{process.log_tail()}")
        time.sleep(0.001)
    elapsed = time.perf_counter() - started
    process.wait_ready()
    return elapsed, process


def _timed(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def run() -> dict[str, Any]:
    plane = ControlPlane()
    plane.start()
    node = SimNode(name=f"sbs-{uuid.uuid4().hex[:6]}")
    process: PluginProcess | None = None
    try:
        starts = []
        for _ in range(3):
            elapsed, process = _start_to_socket(node, str(plane.kubeconfig))
            starts.append(elapsed)
            process.stop()
        elapsed, process = _start_to_socket(node, str(plane.kubeconfig))
        starts.append(elapsed)
        time.sleep(2.0)  # slices published, start-up garbage collected
        rss_idle = _rss_mb(process.proc.pid)
        factory = ClaimFactory(plane.api_client(), node.name)
        kubelet = KubeletClient(node.registration_socket)

        def claim(result: Result) -> ClaimId:
            name, uid = factory.make("bench", [result])
            return ClaimId("bench", uid, name)

        def prepare(c: ClaimId) -> None:
            error = kubelet.prepare([c]).claims[c.uid].error
            if error:
                raise RuntimeError(error)

        sequence = [claim(Result("gpu", "gpu-0")) for _ in range(205)]
        for warm in sequence[:5]:
            prepare(warm)
            kubelet.unprepare([warm])
        latencies = []
        for c in sequence[5:]:
            latencies.append(_timed(lambda c=c: prepare(c)))  # type: ignore[misc]
            kubelet.unprepare([c])

        waves = [[claim(Result("gpu", f"gpu-{g}")) for g in range(8)] for _ in range(8)]
        wave_latencies: list[float] = []
        waves_s = 0.0
        with ThreadPoolExecutor(max_workers=8) as pool:
            for wave in waves:
                started = time.perf_counter()
                wave_latencies += pool.map(lambda c: _timed(lambda: prepare(c)), wave)
                waves_s += time.perf_counter() - started
                list(pool.map(lambda c: kubelet.unprepare([c]), wave))

        shared = [
            claim(
                Result(
                    "gpu",
                    f"gpu-{g}-shared",
                    share_id=str(uuid.uuid4()),
                    consumed={"memory": "4Gi", "compute": "10"},
                )
            )
            for g in range(8)
            for _ in range(8)
        ]
        with ThreadPoolExecutor(max_workers=64) as pool:
            shared_s = _timed(lambda: list(pool.map(prepare, shared)))
            list(pool.map(lambda c: kubelet.unprepare([c]), shared))
        kubelet.close()
        rss_after = _rss_mb(process.proc.pid)
        ours = {
            "prepare_p50_ms": round(statistics.median(latencies) * 1000, 2),
            "prepare_p99_ms": round(_percentile(latencies, 99) * 1000, 2),
            "waves_claims_per_s": round(64 / waves_s, 1),
            "waves_p99_ms": round(_percentile(wave_latencies, 99) * 1000, 1),
            "shared_claims_per_s": round(64 / shared_s, 1),
            "rss_idle_mb": rss_idle,
            "rss_after_mb": rss_after,
            "start_to_socket_s": round(statistics.median(starts), 3),
        }
        print(_table(ours), flush=True)
        return {**{f"dra_gpu_{k}": v for k, v in ours.items()}, "start_to_socket_samples_s": starts}
    finally:
        if process is not None:
            process.stop()
        node.cleanup()
        plane.stop()


def _table(ours: dict[str, float]) -> str:
    go = GO_REFERENCE

    def ratio(key: str) -> str:
        return f"{ours[key] / go[key]:.2f}"

    rows = [
        (
            "NodePrepareResources p50 / p99, one device, 200 in sequence",
            f"{ours['prepare_p50_ms']} / {ours['prepare_p99_ms']} ms",
            f"{go['prepare_p50_ms']} / {go['prepare_p99_ms']} ms",
            f"{ratio('prepare_p50_ms')} / {ratio('prepare_p99_ms')}",
        ),
        (
            "64 whole-GPU claims in 8 waves of 8 concurrent prepares",
            f"{ours['waves_claims_per_s']} claims/s, p99 {ours['waves_p99_ms']} ms",
            f"{go['waves_claims_per_s']:g} claims/s, p99 {go['waves_p99_ms']:g} ms",
            f"{ratio('waves_claims_per_s')}x / {ratio('waves_p99_ms')}x",
        ),
        (
            "64 concurrent shared-GPU claims",
            f"{ours['shared_claims_per_s']} claims/s",
            f"{go['shared_claims_per_s']:g} claims/s",
            f"{ratio('shared_claims_per_s')}x",
        ),
        (
            "plugin memory (VmRSS) idle / after bursts",
            f"{ours['rss_idle_mb']} / {ours['rss_after_mb']} MB",
            f"{go['rss_idle_mb']:g} / {go['rss_after_mb']:g} MB",
            f"{ratio('rss_idle_mb')}x",
        ),
        (
            "process start -> registration socket",
            f"{ours['start_to_socket_s']} s",
            f"{go['start_to_socket_s']} s",
            f"{ratio('start_to_socket_s')}x",
        ),
    ]
    lines = [
        "| metric | dra-gpu | Go example driver (issue 16's figures, not re-measured) | dra-gpu / Go |",
        "|---|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    lines.append(f"goals: {GOALS}")
    return "\n".join(lines)


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
