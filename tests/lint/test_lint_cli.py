"""`dra-gpu lint` on real files: findings, hints, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

GOOD = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: big-gpu}
spec:
  selectors:
  - cel: {expression: "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: t}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: big-gpu}
      - name: mig
        firstAvailable:
        - {name: small, deviceClassName: mig.nvidia.com}
      constraints:
      - {requests: [gpu, mig], matchAttribute: gpu.nvidia.com/parentUUID}
      config:
      - requests: [gpu]
        opaque:
          driver: gpu.nvidia.com
          parameters: {apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig,
                       sharing: {strategy: TimeSlicing}}
---
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  resourceClaims: [{name: c, resourceClaimTemplateName: t}]
  containers:
  - name: x
    image: busybox
    resources: {claims: [{name: c, request: gpu}]}
"""


def lint(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_gpu.cli.main", "lint", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def claim_with(expression: str) -> str:
    return f"""apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: c}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel:
            expression: "{expression}"
"""


def test_clean_manifests_pass(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "good.yaml").write_text(GOOD)
    done = lint(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no findings" in done.stdout


def test_a_directory_s_files_that_hold_no_kubernetes_object_are_passed_over(tmp_path: Path) -> None:
    """Helm values, JSON schemas and the examples' expect.yaml sit beside manifests: in a directory they are
    not findings (the README's `dra-gpu lint examples/` lints only the manifests); named alone, such a file
    is still reported, and a manifest that lacks only its apiVersion still is in a directory."""
    (tmp_path / "good.yaml").write_text(GOOD)
    (tmp_path / "values.yaml").write_text("image: {tag: v1}\nnodeSelector: {}\n")
    (tmp_path / "schema.json").write_text('{"type": "object", "properties": {}}')
    done = lint(tmp_path)
    assert done.returncode == 0 and "no findings" in done.stdout, done.stdout + done.stderr
    alone = lint(tmp_path / "values.yaml")
    assert alone.returncode == 1 and "values.yaml:1" in alone.stdout, alone.stdout + alone.stderr
    (tmp_path / "half.yaml").write_text(GOOD.replace("apiVersion: v1\nkind: Pod", "kind: Pod"))
    half = lint(tmp_path)
    assert half.returncode == 1 and "half.yaml" in half.stdout, half.stdout + half.stderr


def test_the_repository_examples_lint_to_their_intended_findings_only() -> None:
    done = lint(Path(__file__).resolve().parents[2] / "examples")
    findings = [line for line in done.stdout.splitlines() if line.strip() and not line.startswith(" ")]
    assert findings and all("negative-" in line for line in findings), done.stdout + done.stderr


def check(tmp_path: Path, expression: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(claim_with(expression))
    done = lint(path)
    assert done.returncode == 1, done.stdout
    assert done.stdout.startswith(f"{path}:12 ResourceClaim/c: ")
    return done.stdout


def test_memory_attribute_hint(tmp_path: Path) -> None:
    out = check(tmp_path, "device.attributes['memory'] >= 40000")
    assert "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0" in out


def test_attribute_without_domain_hint(tmp_path: Path) -> None:
    out = check(tmp_path, "device.attributes.productName == 'A100'")
    assert "device.attributes['gpu.nvidia.com'].productName" in out


def test_removed_index_attribute_hint(tmp_path: Path) -> None:
    out = check(tmp_path, "device.attributes['gpu.nvidia.com'].index == 0")
    assert "removed" in out


def test_version_compared_to_string_hint(tmp_path: Path) -> None:
    out = check(tmp_path, "device.attributes['gpu.nvidia.com'].driverVersion == '550.54.15'")
    assert "semver(" in out


def test_syntax_error_with_position(tmp_path: Path) -> None:
    out = check(tmp_path, "device.driver == ")
    assert "<input>:1:" in out and "Syntax error" in out


def test_unknown_function(tmp_path: Path) -> None:
    out = check(tmp_path, "device.driver.lower() == 'x'")
    assert "undeclared reference to 'lower'" in out


def test_references_and_v1beta1_shape(tmp_path: Path) -> None:
    path = tmp_path / "refs.yaml"
    path.write_text("""apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: c}
spec:
  devices:
    requests:
    - name: gpu
      deviceClassName: gpu.nvidia.com
    - name: other
      exactly: {deviceClassName: no-such-class}
    constraints:
    - {requests: [nope], matchAttribute: gpu.nvidia.com/parentUUID}
    config:
    - opaque:
        driver: gpu.nvidia.com
        parameters: {apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig, sharing: {strategy: Nope}}
---
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  resourceClaims: [{name: c, resourceClaimName: missing}]
  containers: [{name: x, image: y, resources: {claims: [{name: d}]}}]
---
just: data
""")
    done = subprocess.run(
        [sys.executable, "-m", "dra_gpu.cli.main", "lint", "-o", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    findings = json.loads(done.stdout)["findings"]
    messages = "\n".join(f"{f['line']} {f['message']} {f['hint']}" for f in findings)
    assert "v1beta1 shape" in messages and "exactly:" in messages
    assert "no-such-class" in messages
    assert "'nope' is not a request" in messages
    assert "sharing.strategy" in messages
    assert "ResourceClaim default/missing is not in the files" in messages
    assert "'d' is not in spec.resourceClaims" in messages
    assert "not a Kubernetes object" in messages
    assert any(f["line"] == 8 for f in findings)  # the v1beta1 deviceClassName line


def test_unknown_kind_in_resource_group(tmp_path: Path) -> None:
    path = tmp_path / "k.yaml"
    path.write_text("apiVersion: resource.k8s.io/v1\nkind: ResourceClain\nmetadata: {name: x}\n")
    done = lint(path)
    assert done.returncode == 1 and "does not exist in resource.k8s.io" in done.stdout


def test_unreadable_input_is_exit_2(tmp_path: Path) -> None:
    done = lint(tmp_path / "missing.yaml")
    assert done.returncode == 2 and "no such file" in done.stderr


def test_kubernetes_version_selects_the_cel_release(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(claim_with("device.attributes['resource.kubernetes.io'].numaNode.includes(0)"))
    newest = subprocess.run(
        [sys.executable, "-m", "dra_gpu.cli.main", "lint", "-o", "json", str(path)],
        capture_output=True,
        text=True,
    )
    assert newest.returncode == 0, newest.stdout + newest.stderr
    assert json.loads(newest.stdout) == {"kubernetesVersion": "1.37", "findings": []}
    args = [sys.executable, "-m", "dra_gpu.cli.main", "lint", "--kubernetes-version", "1.36", str(path)]
    old = subprocess.run(args, capture_output=True, text=True)
    assert old.returncode == 1
    assert (
        "includes() needs Kubernetes 1.37, or 1.36 with the DRAListTypeAttributes feature gate" in old.stdout
    )
    gated = subprocess.run(
        [*args, "--feature-gates", "DRAListTypeAttributes=true"], capture_output=True, text=True
    )
    assert gated.returncode == 0 and "Kubernetes 1.36 (DRAListTypeAttributes on)" in gated.stdout


def test_unsupported_kubernetes_version_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(GOOD)
    done = subprocess.run(
        [sys.executable, "-m", "dra_gpu.cli.main", "lint", "--kubernetes-version", "1.31", str(path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "supported are 1.34 to 1.37" in done.stderr


def test_moved_numa_attribute_hint(tmp_path: Path) -> None:
    # NVIDIA's driver publishes only resource.kubernetes.io/numaNode (deviceinfo.go addNumaNodeAttribute)
    out = check(tmp_path, "device.attributes['gpu.nvidia.com'].numaNode == 0")
    assert "device.attributes['resource.kubernetes.io'].numaNode" in out
    path = tmp_path / "numa.yaml"
    path.write_text("""apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: c}
spec:
  devices:
    requests:
    - name: gpus
      exactly: {deviceClassName: gpu.nvidia.com, count: 2}
    constraints:
    - {requests: [gpus], matchAttribute: gpu.nvidia.com/numaNode}
""")
    done = lint(path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "matchAttribute: resource.kubernetes.io/numaNode" in done.stdout
