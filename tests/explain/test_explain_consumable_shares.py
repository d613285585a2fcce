"""`dra-gpu explain --hardware ... --consumable-shares MODE`: simulated nodes whose plugin runs with NVIDIA's
consumable shares, so NVIDIA's consumable-shares claims can be checked before a cluster runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CLAIM = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: two-shares, namespace: x}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        capacity: {requests: {memory: 4Gi, shares: "2"}}
"""


def explain(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    manifest = tmp_path / "claim.yaml"
    manifest.write_text(CLAIM)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dra_gpu.cli.main",
            "explain",
            "--hardware",
            "h100-80gb",
            "-o",
            "json",
            "-f",
            str(manifest),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def claim(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    (found,) = json.loads(out.stdout)["claims"]
    result: dict[str, Any] = found
    return result


@pytest.mark.parametrize(("mode", "allocatable"), [("4", True), ("1", False), ("memory", False)])
def test_the_shares_capacity_follows_the_mode(tmp_path: Path, mode: str, allocatable: bool) -> None:
    # N=4: 2 of 4 shares fit; N=1: above the policy's max; memory mode publishes no `shares` capacity
    out = explain(tmp_path, "--consumable-shares", mode)
    assert out.returncode in (0, 1), out.stderr
    assert claim(out)["allocatable"] is allocatable, claim(out).get("reason")
    if allocatable:
        assert claim(out)["requests"][0]["allocated"] == ["node-0/gpu-0"]


def test_a_bad_mode_is_a_usage_error_naming_the_flag(tmp_path: Path) -> None:
    out = explain(tmp_path, "--consumable-shares", "some")
    assert out.returncode == 2
    assert "--consumable-shares (CONSUMABLE_SHARES) 'some': must be 'disabled', 'memory'" in out.stderr
