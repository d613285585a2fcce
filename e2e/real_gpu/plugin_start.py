"""Start-up time and memory of the kubelet plugin on a real GPU node, beside the simulator on that machine.

    PYTHONPATH=. python3 e2e/real_gpu/plugin_start.py [--nvidia-driver-root /] [--runs 5]
        [--simulated h100-80gb] [--skip-real]

Starts `dra-gpu kubelet-plugin` as the DaemonSet does (slices not published, so no API server is needed:
claims are read only when the kubelet asks to prepare one) in throw-away plugin directories, and measures from
the process's start until its registration socket answers GetInfo, then its VmRSS at that moment and 2 s
later. Read-only: an empty checkpoint means the plugin changes no GPU setting. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.plugin.plugin_harness import wait_for_socket

DRIVER = "gpu.nvidia.com"
# Nothing listens there: with --publish-slices false the plugin only needs the API to read a claim.
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _one_start(hardware: str, driver_root: str | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "kubeconfig").write_text(KUBECONFIG)
        root = driver_root or str(base / "drv")
        argv = [
            sys.executable, "-m", "dra_gpu.cli.kubelet_plugin", "--node-name", "real-gpu-node",
            "--hardware", hardware, "--nvidia-driver-root", root, "--kubeconfig", str(base / "kubeconfig"),
            "--kubelet-registrar-directory-path", str(base / "reg"),
            "--kubelet-plugins-directory-path", str(base / "plg"), "--cdi-root", str(base / "cdi"),
            "--publish-slices", "false", "--log-format", "json",
        ]  # fmt: skip
        log = base / "plugin.log"
        with log.open("wb") as out:
            started = time.perf_counter()
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
            try:
                wait_for_socket(base / "reg" / f"{DRIVER}-reg.sock", proc, log.read_text, poll_s=0.005)
                ready = time.perf_counter() - started
                rss_ready = _rss_mb(proc.pid)
                time.sleep(2.0)
                rss_later = _rss_mb(proc.pid)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
        return {"start_s": ready, "rss_ready_mb": rss_ready, "rss_after_2s_mb": rss_later}


def _summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    return {key: {"median": statistics.median(r[key] for r in runs), "all": [round(r[key], 3) for r in runs]}
            for key in runs[0]}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nvidia-driver-root", default="/")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--simulated", default="h100-80gb", help="simulated profile measured alongside")
    parser.add_argument("--skip-real", action="store_true", help="simulated runs only (to test this)")
    args = parser.parse_args()
    subjects = [("simulated", args.simulated, None)]
    if not args.skip_real:
        subjects.insert(0, ("real", "real", args.nvidia_driver_root))
    report: dict[str, Any] = {}
    for label, hardware, root in subjects:
        report[label] = _summary([_one_start(hardware, root) for _ in range(args.runs)])
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
