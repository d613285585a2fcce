"""The Helm chart installs into the local cluster: the plugin's pod is Ready, registers and publishes slices.

Opt-in (`DRA_GPU_E2E_CHART=1`), against the cluster of the current kubeconfig (`make cluster-up`), and never
next to the host-process driver of the main suite (a node serves one plugin per driver name):

    DRA_GPU_E2E_CHART=1 .venv/bin/pytest -q e2e/test_chart_install.py

The image is built from this machine by e2e/image/build_local_image.py (no Docker) and imported into the
cluster's containerd as registry.local/dra-gpu:dev. The tests run in file order against one release: install,
pod Ready, registration and slices, webhook, a GPU pod, uninstall and slice clean-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from e2e.image.build_local_image import DEFAULT_REFERENCE, build, import_into_cluster
from e2e.lib.chart import CHART_DIR, find_helm
from e2e.lib.kubectl import Kubectl, KubectlError
from e2e.lib.settings import DRIVER_NAME, E2ESettings
from e2e.lib.waiting import wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.environ.get("DRA_GPU_E2E_CHART") != "1",
        reason="chart install test is opt-in: set DRA_GPU_E2E_CHART=1 "
        "(needs the local cluster, no host driver)",
    ),
]

RELEASE = "dra-gpu"
NAMESPACE = "dra-gpu-chart-e2e"
HARDWARE = "dgx-h100"
# The pool the plugin publishes for the simulated dgx-h100 node (as the host-process driver does).
EXPECTED_SLICES = 9
EXPECTED_DEVICES = 216
KUBELET_DIR = Path("/var/lib/kubelet")
SIM_DRIVER_ROOT = Path("/var/lib/dra-gpu/sim-root")  # the chart's default driver root for a simulated layout
PLUGIN_SELECTOR = "app.kubernetes.io/component=kubelet-plugin"
WEBHOOK_SELECTOR = "app.kubernetes.io/component=webhook"


@dataclass
class Release:
    """What the install did, for the tests and for teardown."""

    kubectl: Kubectl
    helm: str
    node: str
    installed_at: float
    timings: dict[str, float] = field(default_factory=dict)
    uninstalled: bool = False


def _helm(helm: str, kubeconfig: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    argv = [helm, f"--kubeconfig={kubeconfig}", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def _propagation(path: Path) -> str | None:
    """'shared'/'slave'/'private' for a mount point, None when path is not one."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        parts = line.split()
        if parts[4] == str(path):
            optional = parts[6 : parts.index("-")]
            if any(o.startswith("shared:") for o in optional):
                return "shared"
            return "slave" if any(o.startswith("master:") for o in optional) else "private"
    return None


@pytest.fixture(scope="module")
def shared_host_paths() -> Iterator[None]:
    """The chart mounts the driver root HostToContainer and the kubelet plugin dir Bidirectional; containerd
    refuses both unless the host path is on a shared (or slave) mount. A systemd host makes `/` shared; this
    sandbox's `/` is private, so bind each path onto itself and make it shared, for the test's duration."""
    made: list[Path] = []
    for path in (SIM_DRIVER_ROOT, KUBELET_DIR / "plugins"):
        if _propagation(path) in ("shared", "slave"):
            continue
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
        made.append(path)
        subprocess.run(["mount", "--make-rshared", str(path)], check=True)
    yield
    for path in reversed(made):
        subprocess.run(["umount", "-l", str(path)], check=False)


def _node_slices(kubectl: Kubectl, node: str) -> list[dict[str, Any]]:
    out = kubectl.run(
        "get", "resourceslices.resource.k8s.io", "-o", "json",
        f"--field-selector=spec.nodeName={node},spec.driver={DRIVER_NAME}",
    ).stdout  # fmt: skip
    items: list[dict[str, Any]] = json.loads(out).get("items", [])
    return items


def _pods(kubectl: Kubectl, selector: str) -> list[dict[str, Any]]:
    out = kubectl.run("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "json").stdout
    items: list[dict[str, Any]] = json.loads(out).get("items", [])
    return items


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


def _explain(kubectl: Kubectl, selector: str) -> Any:
    def explain() -> str:
        out = kubectl.run("describe", "pods", "-n", NAMESPACE, "-l", selector, check=False).stdout
        logs = kubectl.run("logs", "-n", NAMESPACE, "-l", selector, "--tail=30", check=False)
        return out[-3000:] + "\n--- logs ---\n" + (logs.stdout or logs.stderr)[-3000:]

    return explain


def _uninstall(release: Release, settings: E2ESettings) -> None:
    if release.uninstalled:
        return
    release.uninstalled = True
    _helm(
        release.helm, settings.kubeconfig, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=120s"
    )


@pytest.fixture(scope="module")
def release(kubectl: Kubectl, settings: E2ESettings, shared_host_paths: None) -> Iterator[Release]:
    helm = find_helm()
    if helm is None:
        pytest.fail("no helm: build it with `e2e/cluster/build.sh helm`", pytrace=False)
    nodes = kubectl.items("nodes")
    assert len(nodes) == 1, f"the chart test expects the single-node local cluster, found {len(nodes)} nodes"
    node = nodes[0]["metadata"]["name"]
    if _node_slices(kubectl, node):
        if sorted((KUBELET_DIR / "plugins_registry").glob(f"{DRIVER_NAME}-*reg.sock")):
            pytest.fail(
                f"another {DRIVER_NAME} plugin serves {node} (the host-process driver? stop it with "
                "`.venv/bin/python -m e2e.lib.install down`)",
                pytrace=False,
            )
        # Left by a plugin that stopped without unpublishing (docs/install.md): nobody serves them any more.
        kubectl.run("delete", "resourceslices.resource.k8s.io", f"--field-selector=spec.driver={DRIVER_NAME}")
    t0 = time.monotonic()
    image = build()
    import_into_cluster(image)
    timings = {"image_build_s": image.seconds, "image_total_s": time.monotonic() - t0}
    rel = Release(kubectl, helm, node, time.monotonic(), timings)
    try:
        _helm(
            helm, settings.kubeconfig, "install", RELEASE, str(CHART_DIR),
            "-n", NAMESPACE, "--create-namespace",
            "--set", f"hardware={HARDWARE}",
            "--set", f"image.repository={DEFAULT_REFERENCE.rsplit(':', 1)[0]}",
            "--set", f"image.tag={DEFAULT_REFERENCE.rsplit(':', 1)[1]}",
            "--set", "image.pullPolicy=Never",
            # The API server reaches the webhook Pod through its endpoints (--enable-aggregator-routing;
            # there is no kube-proxy), so the in-cluster webhook works with a Helm-generated certificate.
            "--set", "webhook.tls.mode=helm",
        )  # fmt: skip
        yield rel
    finally:
        try:
            _uninstall(rel, settings)
        finally:
            kubectl.run(
                "delete", "resourceslices.resource.k8s.io", f"--field-selector=spec.driver={DRIVER_NAME}",
                "--ignore-not-found", check=False,
            )  # fmt: skip
            kubectl.run("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", check=False)
            print(f"\n[chart] timings {json.dumps({k: round(v, 1) for k, v in rel.timings.items()})}")


def test_plugin_and_webhook_pods_become_ready(release: Release) -> None:
    kubectl = release.kubectl

    def plugin_ready() -> list[dict[str, Any]] | None:
        pods = _pods(kubectl, PLUGIN_SELECTOR)
        return pods if pods and all(_ready(p) for p in pods) else None

    pods = wait_until(
        plugin_ready, timeout_s=180, what="the kubelet-plugin DaemonSet pod Ready",
        explain=_explain(kubectl, PLUGIN_SELECTOR),
    )  # fmt: skip
    release.timings["plugin_ready_s"] = time.monotonic() - release.installed_at
    assert [p["spec"]["nodeName"] for p in pods] == [release.node]
    (container,) = pods[0]["status"]["containerStatuses"]
    assert container["image"].endswith(DEFAULT_REFERENCE.split("/", 1)[1]) and container["restartCount"] == 0

    def webhook_ready() -> list[dict[str, Any]] | None:
        pods = _pods(kubectl, WEBHOOK_SELECTOR)
        return pods if pods and all(_ready(p) for p in pods) else None

    wait_until(
        webhook_ready,
        timeout_s=120,
        what="the webhook pod Ready",
        explain=_explain(kubectl, WEBHOOK_SELECTOR),
    )
    release.timings["webhook_ready_s"] = time.monotonic() - release.installed_at


def test_kubelet_registered_plugin_and_slices_are_published(release: Release) -> None:
    sockets = sorted((KUBELET_DIR / "plugins_registry").glob(f"{DRIVER_NAME}-*reg.sock"))
    assert sockets, f"no {DRIVER_NAME} registration socket in {KUBELET_DIR / 'plugins_registry'}"

    def complete() -> list[dict[str, Any]] | None:
        slices = _node_slices(release.kubectl, release.node)
        if not slices:
            return None
        newest = max(int(s["spec"]["pool"]["generation"]) for s in slices)
        current = [s for s in slices if int(s["spec"]["pool"]["generation"]) == newest]
        return current if len(current) == int(current[0]["spec"]["pool"]["resourceSliceCount"]) else None

    slices = wait_until(
        complete, timeout_s=120, what=f"the ResourceSlices of {DRIVER_NAME} on {release.node}",
        explain=_explain(release.kubectl, PLUGIN_SELECTOR),
    )  # fmt: skip
    release.timings["slices_s"] = time.monotonic() - release.installed_at
    devices = sum(len(s["spec"].get("devices") or []) for s in slices)
    assert (len(slices), devices) == (EXPECTED_SLICES, EXPECTED_DEVICES)


def test_webhook_rejects_invalid_opaque_config(release: Release, namespace: str) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "bad-config", "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
                "config": [{
                    "requests": ["gpu"],
                    "opaque": {"driver": DRIVER_NAME, "parameters": {
                        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                        "sharing": {"strategy": "NoSuchStrategy"},
                    }},
                }],
            }
        },
    }  # fmt: skip
    proc = release.kubectl.try_apply(json.dumps(claim), namespace=namespace)
    assert proc.returncode != 0, "the webhook admitted a GpuConfig with an unknown sharing strategy"
    assert "validate-resource-claim-parameters.gpu.nvidia.com" in proc.stderr, proc.stderr
    assert "strategy" in proc.stderr, proc.stderr


def test_gpu_pod_runs_with_device_nodes(release: Release, namespace: str) -> None:
    manifest = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
            ]}}},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "gpu-pod", "namespace": namespace},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                "containers": [{
                    "name": "ctr", "image": "registry.local/busybox:1", "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "sleep 3600"], "resources": {"claims": [{"name": "gpu"}]},
                }],
            },
        },
    ]  # fmt: skip
    started = time.monotonic()
    release.kubectl.apply("\n---\n".join(json.dumps(d) for d in manifest), namespace=namespace)

    def running() -> bool:
        pod = release.kubectl.get_json("pod", "gpu-pod", namespace=namespace)
        phase = pod.get("status", {}).get("phase")
        assert phase not in ("Failed", "Succeeded"), f"gpu-pod ended {phase}: {pod.get('status')}"
        return bool(phase == "Running")

    wait_until(
        running, timeout_s=120, what="gpu-pod Running",
        explain=lambda: release.kubectl.describe("pod", "gpu-pod", namespace=namespace)[-3000:],
    )  # fmt: skip
    release.timings["gpu_pod_running_s"] = time.monotonic() - started
    listing = release.kubectl.exec(namespace, "gpu-pod", ["sh", "-c", "ls /dev/nvidia*"])
    nodes = listing.split()
    assert "/dev/nvidiactl" in nodes and any(n.removeprefix("/dev/nvidia").isdigit() for n in nodes), listing


def test_uninstall_removes_pods_and_slices(release: Release, settings: E2ESettings) -> None:
    started = time.monotonic()
    _uninstall(release, settings)
    wait_until(
        lambda: not _pods(release.kubectl, PLUGIN_SELECTOR), timeout_s=120, what="the plugin pod to go away"
    )
    stale = sorted((KUBELET_DIR / "plugins_registry").glob(f"{DRIVER_NAME}-*reg.sock"))
    assert not stale, f"the stopped plugin left its registration sockets: {stale}"
    left = _node_slices(release.kubectl, release.node)
    if left:
        # A plugin stopped by uninstall does not unpublish (docs/install.md): delete the slices by driver.
        release.kubectl.run(
            "delete", "resourceslices.resource.k8s.io", f"--field-selector=spec.driver={DRIVER_NAME}"
        )
    try:
        assert not _node_slices(release.kubectl, release.node)
    except KubectlError as exc:  # pragma: no cover - explains an API failure instead of a bare assert
        raise AssertionError(f"listing slices after uninstall failed: {exc}") from exc
    release.timings["uninstall_s"] = time.monotonic() - started
    release.timings["slices_left_by_uninstall"] = float(len(left))
