"""`dra-gpu explain` as a user runs it: a real subprocess, real files, exit codes and output."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tests.allocator.builders import claim, consumes, device, exactly, resource_slice

CLAIMS = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: one-gpu}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel: {expression: "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: mig-template}
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly: {deviceClassName: mig.nvidia.com}
---
apiVersion: v1
kind: Pod
metadata: {name: worker}
spec:
  resourceClaims:
  - {name: gpu, resourceClaimName: one-gpu}
  - {name: mig, resourceClaimTemplateName: mig-template}
  containers:
  - name: c
    image: busybox
    resources:
      claims: [{name: gpu}, {name: mig}]
"""


def dra_gpu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_gpu.cli.main", *args], capture_output=True, text=True, timeout=120
    )


def write(path: Path, docs: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump_all(docs))
    return path


def slices_file(tmp_path: Path) -> Path:
    counters = {"gpu-0-counter-set": {"memory": "40Gi", "memory-slice-0": "1", "memory-slice-1": "1"}}
    devices = [
        device(
            "gpu-0",
            capacity={"memory": "40Gi"},
            consumes=[consumes("gpu-0-counter-set", memory="40Gi", memory_slice_0="1", memory_slice_1="1")],
        ),
        device(
            "gpu-0-mig-0",
            "mig",
            capacity={"memory": "20Gi"},
            consumes=[consumes("gpu-0-counter-set", memory="20Gi", memory_slice_0="1")],
        ),
        device("gpu-1", capacity={"memory": "80Gi"}),
    ]
    return write(
        tmp_path / "slices.yaml",
        [
            resource_slice("n1-0", "n1", counters=counters, count=2),
            resource_slice("n1-1", "n1", devices, count=2),
        ],
    )


def test_pod_with_claim_and_template_json(tmp_path: Path) -> None:
    (tmp_path / "claims.yaml").write_text(CLAIMS)
    done = dra_gpu(
        "explain", "-f", str(tmp_path / "claims.yaml"), "--slices", str(slices_file(tmp_path)), "-o", "json"
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    by_name = {c["name"]: c for c in report["claims"]}
    assert set(by_name) == {"one-gpu", "worker-mig"}
    gpu = by_name["one-gpu"]["requests"][0]
    assert gpu["matching"] == ["n1/gpu-0", "n1/gpu-1"]
    assert {r["device"] for r in gpu["rejected"]} == {"n1/gpu-0-mig-0"}
    # The pod's claims are allocated together: gpu-0 would take every counter of its GPU and leave no room for
    # the MIG device, so first fit backtracks to gpu-1.
    assert gpu["allocated"] == ["n1/gpu-1"]
    assert by_name["worker-mig"]["allocatable"] is True
    assert by_name["worker-mig"]["requests"][0]["allocated"] == ["n1/gpu-0-mig-0"]
    assert any("DeviceClasses not given" in note for note in report["notes"])


def test_table_output_and_exit_code_when_not_allocatable(tmp_path: Path) -> None:
    write(tmp_path / "c.yaml", [claim("too-many", exactly("gpu", count=5))])
    done = dra_gpu("explain", "-f", str(tmp_path / "c.yaml"), "--slices", str(slices_file(tmp_path)))
    assert done.returncode == 1
    assert "NOT ALLOCATABLE" in done.stdout
    assert "needs 5 device(s), 2 eligible" in done.stdout


def test_bad_cel_is_exit_2_with_expression_and_position(tmp_path: Path) -> None:
    write(tmp_path / "c.yaml", [claim("bad", exactly("gpu", selectors=["device.attributes['x'].y >"]))])
    done = dra_gpu("explain", "-f", str(tmp_path / "c.yaml"), "--slices", str(slices_file(tmp_path)))
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "<input>:1:" in done.stderr and "device.attributes['x'].y >" in done.stderr


def test_v1beta1_shape_is_bad_input(tmp_path: Path) -> None:
    bad = claim("old")
    bad["spec"]["devices"]["requests"] = [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}]
    write(tmp_path / "c.yaml", [bad])
    done = dra_gpu("explain", "-f", str(tmp_path / "c.yaml"), "--slices", str(slices_file(tmp_path)))
    assert done.returncode == 2
    assert "exactly" in done.stderr


def test_not_yaml_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("a: [\n")
    done = dra_gpu("explain", "-f", str(tmp_path / "c.yaml"), "--slices", str(slices_file(tmp_path)))
    assert done.returncode == 2
    assert "invalid YAML" in done.stderr and "Traceback" not in done.stderr


def test_hardware_profile_inventory(tmp_path: Path) -> None:
    write(tmp_path / "c.yaml", [claim("eight", exactly("gpu", count=8))])
    done = dra_gpu(
        "explain", "-f", str(tmp_path / "c.yaml"), "--hardware", "dgx-a100", "--nodes", "3", "-o", "json"
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    [entry] = report["claims"]
    assert entry["allocation"]["nodeName"] == "node-0"
    assert len(entry["requests"][0]["allocated"]) == 8
    assert len(entry["requests"][0]["matching"]) == 24  # 8 GPUs on each of 3 nodes


def test_hardware_inventory_equals_build_slices_per_node() -> None:
    from dra_gpu.cli.explain import _hardware_inventory
    from dra_gpu.hardware.loader import open_hardware
    from dra_gpu.inventory.device_model import ModelOptions, build_device_model
    from dra_gpu.slices.slice_builder import build_slices

    inventory = _hardware_inventory("dgx-h100", 2, "1.36")
    root = tempfile.mkdtemp(dir="/tmp")
    try:
        hardware = open_hardware("dgx-h100", root, seed="explain")
        try:
            model = build_device_model(hardware.discover(), ModelOptions())
        finally:
            hardware.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    expected = build_slices(model, "node-0", (1, 36)) + build_slices(model, "node-1", (1, 36))
    assert inventory.slices == expected
