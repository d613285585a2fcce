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


# Capacities no mode divides between the claims of a device: never what a pending claim waits for.
UNSHARED = ("multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines")
CONFORMANCE = Path(__file__).resolve().parents[1] / "conformance" / "nvidia"
INTEGER_EXAMPLE = CONFORMANCE / "consumable-shares-integer" / "integer-sharing.yaml"


def _explain_next_replica(tmp_path: Path, flag: str, allocated_before: int) -> dict[str, Any]:
    """NVIDIA's integer-sharing example on a simulated DGX H100 node whose plugin runs with
    --consumable-shares `flag`: `allocated_before` replicas' claims are allocated one after another (as the
    scheduler would have), and `dra-gpu explain --slices` is asked about the next one."""
    import shutil
    import tempfile

    import yaml

    from dra_gpu.hardware.loader import open_hardware
    from dra_gpu.inventory.consumable_shares import parse_consumable_shares
    from dra_gpu.inventory.device_model import ModelOptions, build_device_model
    from dra_gpu.slices.slice_builder import build_slices
    from tests.allocator.builders import allocate_in_turn

    root = tempfile.mkdtemp(prefix="explain-shares-", dir="/tmp")
    try:
        discovery = open_hardware("dgx-h100", root).discover()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    model = build_device_model(discovery, ModelOptions(consumable_shares=parse_consumable_shares(flag)))
    slices = build_slices(model, "node-0", (1, 35))
    docs = list(yaml.safe_load_all(INTEGER_EXAMPLE.read_text()))
    (template,) = [d for d in docs if d and d["kind"] == "ResourceClaimTemplate"]
    spec = template["spec"]["spec"]
    allocated, _pending = allocate_in_turn(slices, spec, allocated_before, namespace="gpu-share-integer")
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text(yaml.safe_dump_all([*slices, *allocated]))
    manifest = tmp_path / "next.yaml"
    next_claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "next-replica-gpu", "namespace": "gpu-share-integer"},
        "spec": spec,
    }
    manifest.write_text(yaml.safe_dump(next_claim))
    out = subprocess.run(
        [sys.executable, "-m", "dra_gpu.cli.main", "explain", "--slices", str(inventory), "-o", "json",
         "-f", str(manifest)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode in (0, 1), out.stderr
    return claim(out)


def test_the_twelfth_replica_shares_a_gpu(tmp_path: Path) -> None:
    """NVIDIA's example at 12 replicas on 8 GPUs with N=4: the 12th claim fits on gpu-2 (4 per GPU), where
    before every claim took all of a GPU's copy engines and the 9th found none."""
    found = _explain_next_replica(tmp_path, "4", 11)
    assert found["allocatable"] is True, found.get("reason")
    assert found["requests"][0]["allocated"] == ["node-0/gpu-2"]
    [result] = found["allocation"]["devices"]["results"]
    assert result["shareID"] and result["consumedCapacity"]["shares"] == "1"
    assert all(result["consumedCapacity"][name] == "0" for name in UNSHARED)


def test_a_pending_replica_is_blocked_by_the_shares_not_an_engine_count(tmp_path: Path) -> None:
    """With all 4 shares of every GPU taken (32 claims), the 33rd waits for a share, and explain says so."""
    found = _explain_next_replica(tmp_path, "4", 32)
    assert found["allocatable"] is False
    text = json.dumps({k: found[k] for k in ("reason", "reasonGroups", "requests")})
    assert "capacity shares: 4 of 4 in use" in found["reason"], found["reason"]
    assert not any(name in text for name in UNSHARED), text
