"""`dra-gpu explain` as a user runs it, over 1,000 simulated DGX H100 nodes (216,000 devices): wall time and
peak memory (the child's max RSS) of the whole CLI process, for the two cases of issue 16:

- easy: one whole GPU;
- mig_mix_unsatisfiable: four MIG profiles (1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb = 10 compute slices, a GPU
  has 7) constrained to one parent GPU (`matchAttribute: gpu.nvidia.com/parentUUID`): no node can satisfy it,
  so every node is searched and explained.

Goals (issue 16): under 2 s and 300 MB for both. Also reported: the size of the JSON output and of the
longest `reason`, which repeats per node unless identical reasons are aggregated.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NODES = 1000
TIMEOUT_S = 300
GOAL_S = 2.0
GOAL_MB = 300

_EASY = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: one-gpu}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com}
"""


def _mig_request(name: str, profile: str) -> str:
    return f"""
    - name: {name}
      exactly:
        deviceClassName: mig.nvidia.com
        selectors:
        - cel: {{expression: "device.attributes['gpu.nvidia.com'].profile == '{profile}'"}}"""


_MIG_MIX = (
    """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: mig-mix}
spec:
  devices:
    requests:"""
    + "".join(
        _mig_request(n, p)
        for n, p in (("m1", "1g.10gb"), ("m2", "2g.20gb"), ("m3", "3g.40gb"), ("m4", "4g.40gb"))
    )
    + """
    constraints:
    - requests: [m1, m2, m3, m4]
      matchAttribute: gpu.nvidia.com/parentUUID
"""
)

CASES = {"easy": _EASY, "mig_mix_unsatisfiable": _MIG_MIX}


def _longest_reason(value: Any) -> int:
    if isinstance(value, dict):
        own = len(value["reason"]) if isinstance(value.get("reason"), str) else 0
        return max([own, *(_longest_reason(v) for v in value.values())])
    if isinstance(value, list):
        return max([0, *(_longest_reason(v) for v in value)])
    return 0


def _run_case(label: str, manifest: str, workdir: Path) -> dict[str, Any]:
    path = workdir / f"{label}.yaml"
    path.write_text(manifest)
    out = workdir / f"{label}.json"
    command = [sys.executable, "-m", "dra_gpu.cli.main", "explain", "-f", str(path)]
    command += ["--hardware", "dgx-h100", "--nodes", str(NODES), "-o", "json"]
    started = time.perf_counter()
    with out.open("wb") as stdout:
        proc = subprocess.Popen(command, stdout=stdout, stderr=subprocess.PIPE)
        deadline = started + TIMEOUT_S
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                os.wait4(proc.pid, 0)
                return {f"{label}_timed_out_after_s": TIMEOUT_S}
            time.sleep(0.01)
    elapsed = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    figures: dict[str, Any] = {
        f"{label}_wall_s": round(elapsed, 2),
        f"{label}_peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        f"{label}_exit_code": code,
        f"{label}_json_kb": round(out.stat().st_size / 1024, 1),
    }
    if code in (0, 1):
        figures[f"{label}_longest_reason_chars"] = _longest_reason(json.loads(out.read_text()))
    figures[f"{label}_meets_goal"] = elapsed < GOAL_S and usage.ru_maxrss / 1024 < GOAL_MB
    return figures


def run() -> dict[str, Any]:
    figures: dict[str, Any] = {"nodes": NODES, "goal": f"< {GOAL_S} s and < {GOAL_MB} MB per case"}
    with tempfile.TemporaryDirectory(prefix="bench-explain-fleet-") as workdir:
        for label, manifest in CASES.items():
            figures.update(_run_case(label, manifest, Path(workdir)))
    return figures


if __name__ == "__main__":
    for key, value in run().items():
        print(f"{key:45s} {value}")
