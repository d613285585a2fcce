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


def test_output_names_the_modeled_kubernetes_release(tmp_path: Path) -> None:
    write(tmp_path / "c.yaml", [claim("one", exactly("gpu"))])
    args = ["explain", "-f", str(tmp_path / "c.yaml"), "--hardware", "dgx-a100"]
    table = dra_gpu(*args)
    assert table.returncode == 0, table.stderr
    assert "Semantics: kube-scheduler of Kubernetes 1.37" in table.stdout
    report = json.loads(dra_gpu(*args, "-o", "json").stdout)
    assert report["kubernetesVersion"] == "1.37"
    assert not any("slice layout only" in note for note in report["notes"])
    older = json.loads(dra_gpu(*args, "--kubernetes-version", "1.34", "-o", "json").stdout)
    assert older["kubernetesVersion"] == "1.37"
    assert any("sets the slice layout only" in note for note in older["notes"])
    assert "Kubernetes 1.34 slice layout" in older["inventory"]["source"]
    refused = dra_gpu(*args, "--kubernetes-version", "1.33")
    assert refused.returncode == 2 and "supported are 1.34 to 1.37" in refused.stderr


def test_list_attribute_constraints_from_slice_files(tmp_path: Path) -> None:
    # NVIDIA's NUMA attribute in its DRAListTypeAttributes form: a one-element `ints` list per GPU.
    numa = "resource.kubernetes.io/numaNode"
    devices = [device(f"gpu-{i}", attributes={numa: {"ints": [i // 2]}}) for i in range(4)]
    write(tmp_path / "slices.yaml", [resource_slice("s", "n1", devices)])
    write(
        tmp_path / "c.yaml",
        [
            claim("pair", exactly("gpu", count=2), constraints=[{"matchAttribute": numa}]),
            claim("spread", exactly("gpu", count=3), constraints=[{"distinctAttribute": numa}]),
        ],
    )
    done = dra_gpu(
        "explain", "-f", str(tmp_path / "c.yaml"), "--slices", str(tmp_path / "slices.yaml"), "-o", "json"
    )
    claims = {c["name"]: c for c in json.loads(done.stdout)["claims"]}
    assert claims["pair"]["requests"][0]["allocated"] == ["n1/gpu-0", "n1/gpu-1"]
    assert not claims["spread"]["allocatable"]  # only two NUMA nodes


def test_shared_gpu_claims_carry_the_mps_isolation_caveats() -> None:
    example = Path(__file__).parents[2] / "examples" / "gpu-share-capacity" / "gpu-share-capacity.yaml"
    done = dra_gpu("explain", "--hardware", "dgx-h100", "-f", str(example), "-o", "json")
    assert done.returncode == 0, done.stderr
    claims = json.loads(done.stdout)["claims"]
    assert claims and all(c["isolation"] for c in claims)
    joined = " ".join(claims[0]["isolation"])
    # what a tenant can and cannot change, root or not, and what keeps a tenant inside the GPU's server
    assert "what a tenant can change" in joined and "up to the server's caps" in joined
    assert "a root tenant" in joined and "EXCLUSIVE_PROCESS" in joined
    assert "fatal GPU exception" in joined and "MIG" in joined
    table = dra_gpu("explain", "--hardware", "dgx-h100", "-f", str(example))
    assert "  isolation: faults:" in table.stdout


def test_whole_gpu_claims_without_mps_have_no_isolation_caveats(tmp_path: Path) -> None:
    path = tmp_path / "claims.yaml"
    path.write_text(CLAIMS)
    done = dra_gpu("explain", "--hardware", "dgx-h100", "-f", str(path), "-o", "json")
    assert done.returncode == 0, done.stderr
    assert [c["isolation"] for c in json.loads(done.stdout)["claims"]] == [[], []]


def test_reason_groups_count_identical_nodes_once() -> None:
    from dra_gpu.allocator.explain import reason_groups

    same = {f"node-{i}": "needs 9 device(s), 8 eligible" for i in range(1000)}
    groups = reason_groups(same)
    assert groups == [
        {"reason": "needs 9 device(s), 8 eligible", "nodes": 1000, "examples": ["node-0", "node-1", "node-2"]}
    ]
    mixed = {**same, "odd-0": "no device matches", "odd-1": "no device matches"}
    assert [(g["reason"], g["nodes"]) for g in reason_groups(mixed)] == [
        ("needs 9 device(s), 8 eligible", 1000),
        ("no device matches", 2),
    ]


def test_unallocatable_json_has_reason_groups(tmp_path: Path) -> None:
    write(tmp_path / "c.yaml", [claim("too-many", exactly("gpu", count=5))])
    done = dra_gpu(
        "explain", "-f", str(tmp_path / "c.yaml"), "--slices", str(slices_file(tmp_path)), "-o", "json"
    )
    assert done.returncode == 1
    (entry,) = json.loads(done.stdout)["claims"]
    assert entry["reason"]  # the existing field stays
    assert [(g["nodes"], g["examples"]) for g in entry["reasonGroups"]] == [(1, ["n1"])]
    assert "needs 5 device(s), 2 eligible" in entry["reasonGroups"][0]["reason"]
    table = dra_gpu("explain", "-f", str(tmp_path / "c.yaml"), "--slices", str(slices_file(tmp_path)))
    assert "on 1 node(s), e.g. n1: " in table.stdout


def test_reason_groups_ignore_the_nodes_own_device_prefix() -> None:
    from dra_gpu.allocator.explain import reason_groups

    failures = {f"node-{i}": f"no combination fits (e.g. node-{i}/gpu-0-mig-0: counters)" for i in range(50)}
    failures["other"] = "no combination fits (e.g. other/gpu-1: taint)"
    groups = reason_groups(failures)
    assert [(g["reason"], g["nodes"]) for g in groups] == [
        ("no combination fits (e.g. <node>/gpu-0-mig-0: counters)", 50),
        ("no combination fits (e.g. <node>/gpu-1: taint)", 1),
    ]


EXTENDED = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: mig-1g-10gb}
spec:
  selectors:
  - cel:
      expression: >-
        device.attributes['gpu.nvidia.com'].type == 'mig' &&
        device.attributes['gpu.nvidia.com'].profile == '1g.10gb'
  extendedResourceName: example.com/mig-1g.10gb
---
apiVersion: v1
kind: Pod
metadata: {name: trainer}
spec:
  containers:
  - name: c
    image: busybox
    resources:
      limits: {cpu: "1", example.com/mig-1g.10gb: 2}
"""


def test_pod_with_dra_backed_extended_resources(tmp_path: Path) -> None:
    """A pod asking for `example.com/mig-1g.10gb: 2` (no resourceClaims) gets the claim kube-scheduler makes
    from the DeviceClass with that extendedResourceName; with too many asked, it is not allocatable."""
    path = tmp_path / "pod.yaml"
    path.write_text(EXTENDED)
    done = dra_gpu("explain", "--hardware", "h100-80gb", "-f", str(path), "-o", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    (claim,) = json.loads(done.stdout)["claims"]
    assert claim["name"] == "trainer-extended-resources" and claim["allocatable"]
    (request,) = claim["requests"]
    assert request["name"] == "container-0-request-1"  # cpu sorts first
    assert len(request["allocated"]) == 2
    path.write_text(EXTENDED.replace("example.com/mig-1g.10gb: 2", "example.com/mig-1g.10gb: 8"))
    assert dra_gpu("explain", "--hardware", "h100-80gb", "-f", str(path)).returncode == 1  # 7 fit one H100
    path.write_text(EXTENDED.replace("example.com/mig-1g.10gb: 2", "example.com/mig-1g.10gb: 1.5"))
    bad = dra_gpu("explain", "--hardware", "h100-80gb", "-f", str(path))
    assert bad.returncode == 2 and "container 'c' resources 'example.com/mig-1g.10gb'" in bad.stderr
