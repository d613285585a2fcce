"""The Helm chart installs into the local cluster: the plugin's pod is Ready, registers and publishes slices.

Opt-in (`DRA_GPU_E2E_CHART=1`), against the cluster of the current kubeconfig (`make cluster-up`), and never
next to the host-process driver of the main suite (a node serves one plugin per driver name):

    DRA_GPU_E2E_CHART=1 .venv/bin/pytest -q e2e/test_chart_install.py

The image is the Dockerfile's (`make image`, e2e/image/real_image.py) when buildah, podman or docker is
installed, else one assembled from this machine (e2e/image/build_local_image.py); DRA_GPU_E2E_IMAGE=real|local
picks one. It is imported into the cluster's containerd as registry.local/dra-gpu:dev. The tests run in file
order against one release: install, pod Ready, registration and slices, webhook, a GPU pod, uninstall and
slice clean-up.

On kind (`make e2e-kind`: DRA_GPU_E2E_MODE=in-cluster with DRA_GPU_E2E_KIND_CLUSTER) the tests run without
the opt-in against the release e2e/kind/run.sh installed (image dra-gpu:kind, built from the Dockerfile and
loaded into the nodes): the node's files are read through `docker exec`, the simulator's tools run in the
plugin pod, processes are found by their container's id. The uninstall and NVIDIA-values tests take that
release down; the module installs it again with run.sh's values file afterwards, for the tests that follow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from e2e.image.build_local_image import DEFAULT_REFERENCE, BuildResult, build_for_cluster, import_into_cluster
from e2e.image.real_image import config_digest
from e2e.lib.chart import CHART_DIR, find_helm
from e2e.lib.container_client import client_in_container, container_ids, host_pid_of_container
from e2e.lib.driver import wait_complete_pool
from e2e.lib.example_runner import cluster_has
from e2e.lib.expectations import manifest_to_make_again, runtime_start_flake
from e2e.lib.incluster import InClusterDriver
from e2e.lib.kubectl import Kubectl, KubectlError
from e2e.lib.node_files import NodeFiles
from e2e.lib.settings import DRIVER_NAME, DriverMode, E2ESettings, load_settings
from e2e.lib.waiting import wait_until
from e2e.lib.workloads import claim, claim_template, claim_with_opaque, gpu_config_time_slicing

_SETTINGS = load_settings()
# kind: the chart is the whole suite's driver (e2e/kind/run.sh installed it); these tests use that release.
ON_KIND = _SETTINGS.mode is DriverMode.IN_CLUSTER and _SETTINGS.kind_cluster is not None

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.environ.get("DRA_GPU_E2E_CHART") != "1" and not ON_KIND,
        reason="chart install test is opt-in on the local cluster: set DRA_GPU_E2E_CHART=1 "
        "(no host driver); on kind (make e2e-kind) it always runs",
    ),
]

RELEASE = _SETTINGS.chart_release if ON_KIND else "dra-gpu"
NAMESPACE = _SETTINGS.chart_namespace if ON_KIND else "dra-gpu-chart-e2e"
GPU_NODE_LABEL = "nvidia.com/gpu.present=true"  # the chart's default node selector (kind's GPU workers)
HARDWARE = "dgx-h100"
# The pool the plugin publishes for the simulated dgx-h100 node (as the host-process driver does).
EXPECTED_SLICES = 9  # 1.35+: a counters-only slice, then one per GPU (1.34: 8, docs/kubernetes-versions.md)
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
    image: BuildResult | None = None
    uninstalled: bool = False
    nodes: list[str] = field(default_factory=list)  # every node the plugin DaemonSet runs on
    image_ref: str = DEFAULT_REFERENCE  # the driver image the release runs (also the tenants' image)
    real_image: bool = False  # the Dockerfile's image (it carries NVIDIA's CDI hooks)
    files: NodeFiles | None = None  # the files of `node`
    settings: E2ESettings = _SETTINGS

    @property
    def node_files(self) -> NodeFiles:
        return self.files or NodeFiles(self.node, kind=False)

    def sim_hardware(self, *args: str) -> str:
        """`dra-gpu hardware ...` on the driver root the node's plugin reads: in the plugin pod on kind (the
        simulator's tools reached through kubectl), on this machine's sim root on the local cluster."""
        if ON_KIND:
            return InClusterDriver(self.settings, self.kubectl, self.node).hardware(*args)
        argv = [*_HARDWARE_CLI, *args, "--driver-root", str(SIM_DRIVER_ROOT)]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
        assert proc.returncode == 0, f"`{' '.join(argv)}` failed: {proc.stderr.strip()}"
        return proc.stdout


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
    if ON_KIND:  # kind's nodes are containers whose mounts kind made shared
        yield
        return
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


def _expected_slices(kubectl: Kubectl) -> int:
    newer, _ = cluster_has("kubernetes>=1.35", kubectl)
    return EXPECTED_SLICES if newer else EXPECTED_SLICES - 1  # 1.34: each GPU's counters beside its devices


def _require_shares(kubectl: Kubectl) -> None:
    """Fractional shares (gpu-share.nvidia.com, consumable capacity) are published on 1.34 but its alpha
    scheduler does not allocate them (docs/kubernetes-versions.md)."""
    newer, why = cluster_has("kubernetes>=1.35", kubectl)
    if not newer:
        pytest.skip(
            f"fractional shares need kubernetes>=1.35 (1.34's scheduler does not allocate them): {why}"
        )


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


def _gpu_nodes(kubectl: Kubectl) -> list[str]:
    return sorted(n["metadata"]["name"] for n in kubectl.items("nodes", selector=GPU_NODE_LABEL))


def _kind_release(kubectl: Kubectl, settings: E2ESettings, helm: str) -> Iterator[Release]:
    """The release run.sh installed; afterwards run.sh's install again (the tests uninstall, upgrade it)."""
    if settings.chart_values is None or settings.node_name is None:
        pytest.fail(
            "kind without DRA_GPU_E2E_CHART_VALUES / DRA_GPU_E2E_NODE: run e2e/kind/run.sh", pytrace=False
        )
    (daemonset,) = kubectl.items("daemonsets", NAMESPACE, PLUGIN_SELECTOR)
    image = daemonset["spec"]["template"]["spec"]["containers"][0]["image"]
    rel = Release(
        kubectl, helm, settings.node_name, time.monotonic(), nodes=_gpu_nodes(kubectl), image_ref=image,
        real_image=True, files=NodeFiles(settings.node_name, kind=True), settings=settings,
    )  # fmt: skip
    try:
        yield rel
    finally:
        started = time.monotonic()
        _helm(
            helm, settings.kubeconfig, "upgrade", "--install", RELEASE, str(CHART_DIR), "-n", NAMESPACE,
            "--create-namespace", "-f", str(settings.chart_values), "--wait", "--timeout=5m", timeout=360,
        )  # fmt: skip
        kubectl.run(
            "rollout", "status", "daemonset", "-n", NAMESPACE, "-l", PLUGIN_SELECTOR, "--timeout=300s"
        )
        for node in rel.nodes:
            wait_complete_pool(kubectl, node, timeout_s=180)
        rel.timings["reinstall_s"] = time.monotonic() - started
        print(f"\n[chart] timings {json.dumps({k: round(v, 1) for k, v in rel.timings.items()})}")


@pytest.fixture(scope="module")
def release(kubectl: Kubectl, settings: E2ESettings, shared_host_paths: None) -> Iterator[Release]:
    helm = find_helm()
    if helm is None:
        pytest.fail("no helm: build it with `e2e/cluster/build.sh helm`", pytrace=False)
    if ON_KIND:
        yield from _kind_release(kubectl, settings, helm)
        return
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
    image = build_for_cluster()
    import_into_cluster(image)
    timings = {"image_build_s": image.seconds, "image_total_s": time.monotonic() - t0}
    print(f"\n[chart] image: {image.kind} {image.reference} {image.digest} ({image.archive_bytes >> 20} MiB)")
    rel = Release(kubectl, helm, node, time.monotonic(), timings, image=image, nodes=[node])
    rel.real_image = image.kind == "real"
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
    assert sorted(p["spec"]["nodeName"] for p in pods) == release.nodes
    for pod in pods:
        (container,) = pod["status"]["containerStatuses"]
        assert container["image"].endswith(release.image_ref.split("/", 1)[-1]), container["image"]
        assert container["restartCount"] == 0, f"{pod['metadata']['name']} restarted: {container}"
    # The pod runs the image this test built and imported (the Dockerfile's when a container tool is here).
    image = release.image
    if image is not None:
        image_id = config_digest(image.archive)
        assert container["imageID"].endswith(image_id), (
            f"pod runs {container['imageID']}, the test imported the {image.kind} image {image_id}"
        )

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
    sockets = release.node_files.glob(KUBELET_DIR / "plugins_registry", f"{DRIVER_NAME}-*reg.sock")
    assert sockets, (
        f"no {DRIVER_NAME} registration socket in {KUBELET_DIR / 'plugins_registry'} of {release.node}"
    )

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
    assert (len(slices), devices) == (_expected_slices(release.kubectl), EXPECTED_DEVICES)


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


def _try(kubectl: Kubectl, doc: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return kubectl.try_apply(json.dumps(doc), namespace=doc["metadata"]["namespace"])


def test_webhook_pods_down_block_only_gpu_nvidia_com_configs(release: Release, namespace: str) -> None:
    """One of the two webhook replicas deleted: nothing is refused. Every replica gone (scaled to 0, as after
    a failed image pull or a drain without the PDB): only objects carrying a gpu.nvidia.com opaque config wait
    for it (failurePolicy Fail); claims for another driver, claims and templates without a config create, and
    a stored claim with a config can still be annotated and deleted. Back to two replicas: as before."""
    kubectl = release.kubectl
    config = gpu_config_time_slicing("Medium")
    assert _try(kubectl, claim(namespace, "stored", config)).returncode == 0
    first = _pods(kubectl, WEBHOOK_SELECTOR)
    assert len(first) == 2, [p["metadata"]["name"] for p in first]
    kubectl.run("delete", "pod", "-n", NAMESPACE, first[0]["metadata"]["name"], "--wait=false")
    one_down = _try(kubectl, claim(namespace, "with-one-replica", config))
    assert one_down.returncode == 0, one_down.stderr

    deployment = f"deployment/{RELEASE}-webhook"
    kubectl.run("scale", deployment, "-n", NAMESPACE, "--replicas=0")
    try:
        wait_until(lambda: not _pods(kubectl, WEBHOOK_SELECTOR), timeout_s=60, what="webhook pods gone")
        refused = _try(kubectl, claim(namespace, "while-down", config))
        assert refused.returncode != 0, "a gpu.nvidia.com config was admitted with every webhook pod gone"
        assert "validate-resource-claim-parameters.gpu.nvidia.com" in refused.stderr, refused.stderr
        other = {"driver": "other.example.com", "parameters": {"kind": "Anything"}}
        for doc in (
            claim_with_opaque(namespace, "other-driver", other),
            claim_with_opaque(namespace, "no-config"),
            claim_template(namespace, "template-no-config"),
        ):
            created = _try(kubectl, doc)
            assert created.returncode == 0, f"{doc['metadata']['name']} refused: {created.stderr}"
        claims = "resourceclaims.resource.k8s.io"
        kubectl.run("annotate", claims, "stored", "-n", namespace, "e2e/touched=yes")
        kubectl.run("delete", claims, "stored", "-n", namespace, "--timeout=60s")
    finally:
        kubectl.run("scale", deployment, "-n", NAMESPACE, "--replicas=2")

    def two_ready() -> bool:
        pods = _pods(kubectl, WEBHOOK_SELECTOR)
        return len(pods) == 2 and all(_ready(p) for p in pods)

    wait_until(two_ready, timeout_s=120, what="two webhook pods Ready again")
    wait_until(
        lambda: _try(kubectl, claim(namespace, "after", config)).returncode == 0,
        timeout_s=30, what="a valid config admitted again",
    )  # fmt: skip
    bad = _try(kubectl, claim(namespace, "bad-after", gpu_config_time_slicing("VeryLong")))
    assert bad.returncode != 0 and "sharing.timeSlicingConfig.interval" in bad.stderr, bad.stderr


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

    _running(release, namespace, "gpu-pod", timeout_s=120)
    release.timings["gpu_pod_running_s"] = time.monotonic() - started
    listing = release.kubectl.exec(namespace, "gpu-pod", ["sh", "-c", "ls /dev/nvidia*"])
    nodes = listing.split()
    assert "/dev/nvidiactl" in nodes and any(n.removeprefix("/dev/nvidia").isdigit() for n in nodes), listing
    if release.real_image:
        _assert_nvidia_hooks_ran(release, namespace)


MPS_DAEMON_SELECTOR = "app.kubernetes.io/name=dra-gpu-mps-daemon"
MPS_DAEMON_LABEL = "gpu.nvidia.com/mps-daemon"  # the daemon id: <claim uid>-<hash>, or shares-<gpu uuid>
CLAIMS = "resourceclaims.resource.k8s.io"


def _share_manifest(name: str, namespace: str, compute: str, memory: str) -> list[dict[str, Any]]:
    """A pod with a fractional share (DeviceClass gpu-share.nvidia.com) that prints its MPS env and mounts."""
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "share", "exactly": {
                "deviceClassName": "gpu-share.nvidia.com",
                "capacity": {"requests": {"compute": compute, "memory": memory}},
            }}]}}},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "share", "resourceClaimTemplateName": name}],
                "containers": [{
                    "name": "ctr", "image": "registry.local/busybox:1", "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "sleep 3600"], "resources": {"claims": [{"name": "share"}]},
                }],
            },
        },
    ]  # fmt: skip


def _running(release: Release, namespace: str, name: str, timeout_s: float = 180) -> None:
    """Wait until pod `name` runs. A pod the container runtime could not start for a reason of the host
    (expectations.runtime_start_flake) is made again, once: with restartPolicy Never nothing else would."""
    kubectl = release.kubectl
    remade: list[str] = []

    def running() -> bool:
        pod = kubectl.get_json("pod", name, namespace=namespace)
        phase = pod.get("status", {}).get("phase")
        flake = runtime_start_flake(pod)
        if flake is not None and not remade:
            remade.append(flake)
            print(f"pod {namespace}/{name}: the runtime could not create it ({flake[:300]}); made again")
            kubectl.run("delete", "pod", name, "-n", namespace, "--wait=true", "--timeout=120s")
            kubectl.apply(json.dumps(manifest_to_make_again(pod)), namespace=namespace)
            return False
        assert phase not in ("Failed", "Succeeded"), f"{name} ended {phase}: {pod.get('status')}"
        return bool(phase == "Running")

    wait_until(
        running, timeout_s=timeout_s, what=f"{name} Running",
        explain=lambda: release.kubectl.describe("pod", name, namespace=namespace)[-3000:],
    )  # fmt: skip


def _workload_view(release: Release, namespace: str, name: str) -> str:
    """What the workload sees of MPS: its env and its mounts of the pipe and /dev/shm."""
    return release.kubectl.exec(
        namespace,
        name,
        ["sh", "-c", "env | grep CUDA_MPS | sort; grep -E 'nvidia-mps| /dev/shm ' /proc/mounts"],
    )


def _mps_manifest(
    name: str, namespace: str, device_class: str, kind: str, selector: str | None = None
) -> list[dict[str, Any]]:
    """A pod whose claim (from a template) asks for one device of `device_class` under MPS (`kind`:
    GpuConfig or MigDeviceConfig) with limits."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    mps = {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "4Gi"}
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {
                "requests": [{"name": "dev", "exactly": exactly}],
                "config": [{"requests": ["dev"], "opaque": {"driver": DRIVER_NAME, "parameters": {
                    "apiVersion": "resource.nvidia.com/v1beta1", "kind": kind,
                    "sharing": {"strategy": "MPS", "mpsConfig": mps},
                }}}],
            }}},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": name}],
                "containers": [{
                    "name": "ctr", "image": "registry.local/busybox:1", "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "sleep 3600"], "resources": {"claims": [{"name": "dev"}]},
                }],
            },
        },
    ]  # fmt: skip


def _plugin_host_pid(release: Release) -> int:
    """The host pid of the chart's kubelet-plugin process on the release's node: the first process of the
    plugin pod's container (its cgroup names the container; kind nodes' processes are this host's too)."""
    (pod,) = [p for p in _pods(release.kubectl, PLUGIN_SELECTOR) if p["spec"]["nodeName"] == release.node]
    cid = container_ids(pod).get("plugin", "")
    pid = host_pid_of_container(cid)
    assert pid is not None, f"no host process of the plugin container {cid} of {pod['metadata']['name']}"
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"kubelet-plugin" in argv, f"process {pid} of the plugin container runs {argv}"
    return pid


@dataclass
class MpsClaims:
    """Pods with every kind of MPS claim, prepared: what the workloads saw, which daemon pods serve them."""

    pods: list[tuple[str, str]]  # (namespace, pod)
    views: dict[tuple[str, str], str]  # what each workload sees of MPS (env, mounts)
    daemon_uids: list[str]
    served: dict[tuple[str, str], tuple[Any, ...]]  # what a CUDA process in each workload gets from MPS


# (threads %, pinned MiB) each workload of _prepare_every_mps_claim_kind must get from its daemon
MPS_LIMITS = {
    "whole": (50, "4096M"),
    "mig": (50, "4096M"),
    "tenant-a": (30, "10240M"),
    "tenant-b": (20, "8192M"),
}


def _served(release: Release, namespace: str, name: str) -> tuple[Any, ...]:
    """What a CUDA process in the workload gets from MPS, asked from inside it: the simulated client run in
    the container's view (its env, its pipe through /proc/<pid>/root: e2e/lib/container_client.py), so a
    stale or lost bind mount, or a daemon that no longer answers, shows. Not the server pid: an idle
    server may end and the daemon start another."""
    pod = release.kubectl.get_json("pod", name, namespace=namespace)
    report = client_in_container(pod, "ctr", driver_root=None)
    assert report.error is None and report.mps, f"{namespace}/{name}: not served by MPS: {report}"
    return report.gpus, report.active_thread_percentage, tuple(sorted(report.pinned_limits.items()))


def _prepare_every_mps_claim_kind(release: Release, namespace: str, other: str) -> MpsClaims:
    """Whole-GPU MPS, MIG + MPS and a fractional share in `namespace`, another share in `other`: four claims,
    a daemon pod for each whole-GPU and MIG claim and one per GPU that serves shares (pinned to the node, not
    owned by the plugin). The tenants have their own /dev/shm and their share as client limits in env."""
    kubectl = release.kubectl
    manifest = (
        _mps_manifest("whole", namespace, "gpu.nvidia.com", "GpuConfig")
        + _mps_manifest(
            "mig", namespace, "mig.nvidia.com", "MigDeviceConfig",
            f"device.attributes['{DRIVER_NAME}'].profile == '1g.10gb'",
        )
        + _share_manifest("tenant-a", namespace, "30", "10Gi")
    )  # fmt: skip
    kubectl.apply("\n---\n".join(json.dumps(d) for d in manifest), namespace=namespace)
    kubectl.apply("\n---\n".join(json.dumps(d) for d in _share_manifest("tenant-b", other, "20", "8Gi")),
                  namespace=other)  # fmt: skip
    pods = [(namespace, "whole"), (namespace, "mig"), (namespace, "tenant-a"), (other, "tenant-b")]
    for ns, name in pods:
        _running(release, ns, name)

    served = {(ns, name): _served(release, ns, name) for ns, name in pods}
    # the shares of one GPU are clients of one server: one daemon pod per GPU the tenants landed on
    expected = 2 + len({served[ns, name][0] for ns, name in pods[2:]})

    def daemons_ready() -> list[dict[str, Any]] | None:
        found = _pods(kubectl, MPS_DAEMON_SELECTOR)
        return found if len(found) == expected and all(_ready(p) for p in found) else None

    daemons = wait_until(daemons_ready, timeout_s=120, what=f"{expected} MPS daemon pods Ready")
    assert all(p["spec"]["nodeName"] == release.node for p in daemons)
    # not owned by a plugin pod (a rolling update deletes those); the DaemonSet may own them (helm uninstall)
    owners = [o for p in daemons for o in p["metadata"].get("ownerReferences") or []]
    assert all(o.get("kind") != "Pod" for o in owners), owners
    views = {(ns, name): _workload_view(release, ns, name) for ns, name in pods}
    assert all("CUDA_MPS_PIPE_DIRECTORY=" in v for v in views.values()), views
    for ns, name in pods[2:]:
        # a share is a client of its GPU's one server and carries its own share as client limits
        threads, pinned = MPS_LIMITS[name]
        assert f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={threads}" in views[ns, name], views[ns, name]
        assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={pinned}" in views[ns, name], views[ns, name]
    for (_, name), (_gpus, threads, pinned) in served.items():
        assert (threads, [v for _, v in pinned]) == (MPS_LIMITS[name][0], [MPS_LIMITS[name][1]]), served
    # no shared /dev/shm: what one tenant writes there the other does not see
    kubectl.exec(namespace, "tenant-a", ["sh", "-c", "echo a > /dev/shm/written-by-tenant-a"])
    assert "written-by-tenant-a" not in kubectl.exec(other, "tenant-b", ["ls", "-a", "/dev/shm"])
    return MpsClaims(pods, views, sorted(p["metadata"]["uid"] for p in daemons), served)


def _assert_mps_claims_untouched(release: Release, claims: MpsClaims, namespace: str, late: str) -> None:
    """Every daemon pod is the same (UID) and never restarted, every workload runs and sees what it saw, and
    a new share (pod `late`) prepares."""
    kubectl = release.kubectl
    time.sleep(12)  # more than one reconcile period of the new plugin: it must not have touched the daemons
    after = _pods(kubectl, MPS_DAEMON_SELECTOR)
    assert sorted(p["metadata"]["uid"] for p in after) == claims.daemon_uids
    statuses = [c for p in after for c in p.get("status", {}).get("containerStatuses", [])]
    assert [c.get("restartCount", 0) for c in statuses] == [0] * len(claims.daemon_uids), statuses
    for (ns, name), view in claims.views.items():
        assert kubectl.get_json("pod", name, namespace=ns)["status"]["phase"] == "Running"
        assert _workload_view(release, ns, name) == view
        # the same env and mount table could still lead nowhere (a stale bind mount): ask the daemon itself
        assert _served(release, ns, name) == claims.served[ns, name], f"{ns}/{name} after the update"
    manifest = _share_manifest(late, namespace, "10", "4Gi")
    kubectl.apply("\n---\n".join(json.dumps(d) for d in manifest), namespace=namespace)
    _running(release, namespace, late)
    kubectl.run("delete", "pod", late, "-n", namespace, "--wait=true", "--timeout=120s")


def _rolled_out(release: Release) -> None:
    kubectl = release.kubectl
    kubectl.run("rollout", "status", "daemonset", "-n", NAMESPACE, "-l", PLUGIN_SELECTOR, "--timeout=180s")
    wait_until(
        lambda: (pods := _pods(kubectl, PLUGIN_SELECTOR)) and len(pods) == len(release.nodes)
        and all(_ready(p) for p in pods),
        timeout_s=180, what="a kubelet-plugin pod Ready per node", explain=_explain(kubectl, PLUGIN_SELECTOR),
    )  # fmt: skip


def test_mps_daemons_of_every_claim_kind_outlive_rolling_updates_of_the_plugin(
    release: Release, settings: E2ESettings, namespace: str
) -> None:
    """With every kind of MPS claim prepared: `kubectl rollout restart` of the plugin DaemonSet (the chart's
    default, maxSurge 1: the new pod starts next to the old one), then an upgrade to maxUnavailable 1
    (`kubeletPlugin.rollingUpdateSockets=false`: the old pod goes first) and back. After each, every daemon
    pod is the same and never restarted, the workloads' env and mounts are as they were, a CUDA process in
    each workload (the simulated client in its container's view) still reaches its daemon and gets the same
    limits, and a new claim prepares."""
    kubectl = release.kubectl
    _require_shares(kubectl)
    other = f"{namespace}-b"
    kubectl.create_namespace(other)
    try:
        claims = _prepare_every_mps_claim_kind(release, namespace, other)
        kubectl.run("rollout", "restart", "daemonset", "-n", NAMESPACE, "-l", PLUGIN_SELECTOR)
        _rolled_out(release)
        _assert_mps_claims_untouched(release, claims, namespace, "late-surge")
        for sockets in ("false", "true"):  # maxUnavailable 1, then back to the default
            _helm(
                release.helm, settings.kubeconfig, "upgrade", RELEASE, str(CHART_DIR), "-n", NAMESPACE,
                "--reuse-values", "--set", f"kubeletPlugin.rollingUpdateSockets={sockets}",
            )  # fmt: skip
            _rolled_out(release)
            _assert_mps_claims_untouched(release, claims, namespace, f"late-{sockets}")
    finally:
        kubectl.run("delete", "pod", "--all", "-n", namespace, "--wait=true", "--timeout=120s")
        kubectl.delete_namespace(other, wait=True)
    wait_until(lambda: not _pods(kubectl, MPS_DAEMON_SELECTOR), timeout_s=120, what="MPS daemon pods deleted")


def test_mps_daemons_of_every_claim_kind_survive_a_sigkill_of_the_plugin(
    release: Release, namespace: str
) -> None:
    """With every kind of MPS claim prepared, a SIGKILL of the plugin process (the container restarts) leaves
    every daemon pod running (same UIDs, no restart) and the workloads' env and mounts as they were, and a new
    claim prepares afterwards."""
    kubectl = release.kubectl
    _require_shares(kubectl)
    other = f"{namespace}-b"
    kubectl.create_namespace(other)
    try:
        claims = _prepare_every_mps_claim_kind(release, namespace, other)
        restarts_before = sum(_plugin_restarts(kubectl).values())

        os.kill(_plugin_host_pid(release), 9)

        def plugin_back() -> bool:
            plugin = _pods(kubectl, PLUGIN_SELECTOR)
            restarted = sum(_plugin_restarts(kubectl).values()) > restarts_before
            return restarted and all(_ready(p) for p in plugin)

        wait_until(plugin_back, timeout_s=180, what="the plugin container restarted and Ready")
        _assert_mps_claims_untouched(release, claims, namespace, "late")
    finally:
        kubectl.run("delete", "pod", "--all", "-n", namespace, "--wait=true", "--timeout=120s")
        kubectl.delete_namespace(other, wait=True)
    wait_until(lambda: not _pods(kubectl, MPS_DAEMON_SELECTOR), timeout_s=120, what="MPS daemon pods deleted")


def _tenant_manifest(
    name: str, namespace: str, compute: str, memory: str, env: dict[str, str], image: str = DEFAULT_REFERENCE
) -> list[Any]:
    """A fractional share whose container (the driver's image: it has the simulated MPS client) sets `env`."""
    docs = _share_manifest(name, namespace, compute, memory)
    container = docs[1]["spec"]["containers"][0]
    container.update(image=image, command=["sleep", "3600"])
    container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return docs


def _share_of(report: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a client report says of the tenant's share (not the server pid or timing)."""
    return (
        report.get("mps"),
        report.get("gpus"),
        report.get("activeThreadPercentage"),
        sorted((report.get("pinnedDeviceMemoryLimits") or {}).items()),
    )


def _tenant_limits(release: Release, namespace: str, name: str, env: Mapping[str, str] | None = None) -> Any:
    """What a CUDA process in the tenant's container gets from its MPS daemon (the simulated MPS client reads
    the container's env, as libcuda does); `env`: what the process sets for itself on top."""
    own = [f"{k}={v}" for k, v in (env or {}).items()]
    argv = ["env", *own, "python3", "-m", "dra_gpu.hardware.sim_tools.mps_client"]
    out = release.kubectl.exec(namespace, name, argv)
    return json.loads(out)


def _daemon_host_pid(pod: Mapping[str, Any]) -> int:
    """The host pid of the MPS control daemon in its pod: the process of the pod's container (its cgroup names
    the container) that runs the control binary in the foreground. Every daemon sees its pipe at
    /tmp/nvidia-mps, so the pipe does not tell them apart."""
    (container_id,) = container_ids(pod).values()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            cgroup = (proc / "cgroup").read_text()
        except OSError:
            continue
        if container_id in cgroup and b"-f" in argv and any(b"mps_control" in a for a in argv):
            found.append(int(proc.name))
    assert len(found) == 1, f"expected one MPS control daemon in {pod['metadata']['name']}, found {found}"
    return found[0]


def test_tenants_cannot_raise_their_share_and_a_killed_daemon_is_back_within_10s_with_it(
    release: Release, namespace: str
) -> None:
    """Two fractional tenants of one node. Tenant a sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 and a pinned
    limit of 80G in its pod spec and still gets its 30 % / 10Gi (the driver's client limits in the
    container's env are its share, and the server's caps are the largest share on the GPU); tenant b's pod
    spec asks for 10 % and b still gets its share (the pod spec cannot override the driver's), while a
    process of b that lowers its own env gets 10 %. The daemon serving tenant a is SIGKILLed: the kubelet
    restarts it in its pod (same UID), the plugin puts it back in place once it holds its limits, and within
    10 s a's processes get the same share again."""
    kubectl = release.kubectl
    _require_shares(kubectl)
    raise_env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}
    manifest = _tenant_manifest("tenant-a", namespace, "30", "10Gi", raise_env, release.image_ref)
    manifest += _tenant_manifest(
        "tenant-b", namespace, "20", "8Gi", {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10"}, release.image_ref
    )
    kubectl.apply("\n---\n".join(json.dumps(d) for d in manifest), namespace=namespace)
    try:
        for name in ("tenant-a", "tenant-b"):
            _running(release, namespace, name)
        a, b = _tenant_limits(release, namespace, "tenant-a"), _tenant_limits(release, namespace, "tenant-b")
        assert a["activeThreadPercentage"] == 30, a
        assert list(a["pinnedDeviceMemoryLimits"].values()) == ["10240M"], a
        assert b["activeThreadPercentage"] == 20, b
        assert list(b["pinnedDeviceMemoryLimits"].values()) == ["8192M"], b
        lowered = _tenant_limits(
            release, namespace, "tenant-b", env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10"}
        )
        assert lowered["activeThreadPercentage"] == 10, lowered
        expected = len({a["gpus"][0], b["gpus"][0]})  # one daemon per GPU the tenants landed on

        def daemons_ready() -> list[dict[str, Any]] | None:
            pods = _pods(kubectl, MPS_DAEMON_SELECTOR)
            return pods if len(pods) == expected and all(_ready(p) for p in pods) else None

        before = {p["metadata"]["uid"]: p for p in wait_until(daemons_ready, timeout_s=120, what="daemons")}
        # the daemon serving tenant a: the shares server of a's GPU
        labels = {uid: p["metadata"]["labels"][MPS_DAEMON_LABEL] for uid, p in before.items()}
        (a_uid,) = [uid for uid, daemon in labels.items() if daemon == f"shares-{a['gpus'][0].lower()}"]
        os.kill(_daemon_host_pid(before[a_uid]), 9)
        killed = time.monotonic()

        seen: list[Any] = []

        def share_again() -> bool:
            try:
                seen.append(_tenant_limits(release, namespace, "tenant-a"))
            except KubectlError:
                return False  # no daemon answers yet
            return bool(_share_of(seen[-1]) == _share_of(a))  # a new server: its pid differs

        wait_until(
            share_again, timeout_s=30, interval_s=0.2, what="tenant a served with its share again",
            explain=lambda: f"tenant a got {seen[-3:]}, before the kill {a}",
        )  # fmt: skip
        took = time.monotonic() - killed
        release.timings["mps_daemon_back_s"] = took
        assert took < 10, f"tenant a's daemon was back after {took:.1f}s, not within 10 s"

        def restarts() -> dict[str, int]:
            counts = {}
            for pod in _pods(kubectl, MPS_DAEMON_SELECTOR):
                statuses = pod["status"].get("containerStatuses") or []
                counts[pod["metadata"]["uid"]] = sum(c.get("restartCount", 0) for c in statuses)
            return counts

        def restarted_once() -> dict[str, int] | None:
            counts = restarts()
            return counts if counts.get(a_uid) == 1 else None

        # the status of the restarted container reaches the API server a little later
        counts = wait_until(
            restarted_once, timeout_s=30, what="tenant a's daemon container restarted once",
            explain=lambda: str(restarts()),
        )  # fmt: skip
        assert set(counts) == set(before), "a daemon pod was replaced instead of restarted in place"
        assert sum(counts.values()) == 1, counts
        assert _share_of(_tenant_limits(release, namespace, "tenant-b")) == _share_of(b)
    finally:
        kubectl.run("delete", "pod", "--all", "-n", namespace, "--wait=true", "--timeout=120s")
    wait_until(lambda: not _pods(kubectl, MPS_DAEMON_SELECTOR), timeout_s=120, what="MPS daemon pods deleted")


def _assert_nvidia_hooks_ran(release: Release, namespace: str) -> None:
    """The Dockerfile's image carries nvidia-ctk and nvidia-cdi-hook: the plugin copied the hook next to its
    sockets, the claim's CDI spec names NVIDIA's hooks, and the runtime ran them in the container."""
    files = release.node_files
    hook = KUBELET_DIR / "plugins" / DRIVER_NAME / "nvidia-cdi-hook"
    assert files.is_executable_file(hook), f"{hook} missing: the plugin did not install the hook"
    specs = files.glob(Path("/var/run/cdi"), "k8s.gpu.nvidia.com-claim_*.json")
    assert specs, "no per-claim CDI spec in /var/run/cdi"
    hooks = json.loads(files.read_text(Path(specs[-1])))["containerEdits"].get("hooks") or []
    assert {h["path"] for h in hooks} == {str(hook)}, hooks
    names = [h["args"][1] for h in hooks]
    assert "update-ldcache" in names and "create-symlinks" in names, names
    # create-symlinks made the development name of libcuda inside the container.
    link = release.kubectl.exec(
        namespace, "gpu-pod", ["sh", "-c", "readlink /usr/lib/x86_64-linux-gnu/libcuda.so"]
    ).strip()
    assert link == "libcuda.so.1", f"libcuda.so in the container points to {link!r}"


def _plugin_restarts(kubectl: Kubectl) -> dict[str, int]:
    """pod uid/container -> restartCount of the kubelet-plugin DaemonSet's containers."""
    return {
        f"{p['metadata']['uid']}/{c['name']}": int(c.get("restartCount", 0))
        for p in _pods(kubectl, PLUGIN_SELECTOR)
        for c in p.get("status", {}).get("containerStatuses") or []
    }


_HARDWARE_CLI = (sys.executable, "-m", "dra_gpu.cli.main", "hardware")


BURST_PODS = 16
SLOW_MIG_CALLS = ("nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceCreateComputeInstance")


def test_prepare_burst_with_slow_mig_creation_does_not_restart_the_plugin(
    release: Release, namespace: str
) -> None:
    """16 pods with a dynamic MIG claim each while every GPU and compute instance creation takes 0.5 s: the
    kubelet's grpc liveness/readiness probes never queue behind NodePrepareResources, so the plugin container
    is not restarted (restartCount and pod unchanged) and every pod runs."""
    kubectl = release.kubectl
    wait_until(
        lambda: (pods := _pods(kubectl, PLUGIN_SELECTOR)) and all(_ready(p) for p in pods),
        timeout_s=180, what="the kubelet-plugin DaemonSet pod Ready",
        explain=_explain(kubectl, PLUGIN_SELECTOR),
    )  # fmt: skip
    before = _plugin_restarts(kubectl)
    assert before, "no kubelet-plugin container status"
    one_slice = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
    manifest: list[dict[str, Any]] = [{
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "mig", "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "mig.nvidia.com",
            "selectors": [{"cel": {"expression": one_slice}}],
        }}]}}},
    }]  # fmt: skip
    names = [f"burst-{i}" for i in range(BURST_PODS)]
    for name in names:
        manifest.append({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "mig"}],
                "containers": [{
                    "name": "ctr", "image": "registry.local/busybox:1", "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "sleep 3600"], "resources": {"claims": [{"name": "gpu"}]},
                }],
            },
        })  # fmt: skip
    gpus = len(json.loads(release.sim_hardware("state", "-o", "json"))["gpus"])
    try:
        for index in range(gpus):
            for function in SLOW_MIG_CALLS:
                release.sim_hardware(
                    "fault", "-i", str(index), "--function", function, "--delay-seconds", "0.5"
                )
        started = time.monotonic()
        kubectl.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": manifest}))

        def all_running() -> bool:
            pods = json.loads(kubectl.run("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
            phases = {p["metadata"]["name"]: p.get("status", {}).get("phase") for p in pods}
            return all(phases.get(n) == "Running" for n in names)

        wait_until(
            all_running, timeout_s=300, what=f"{BURST_PODS} MIG pods Running",
            explain=lambda: kubectl.run("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
            + _explain(kubectl, PLUGIN_SELECTOR)(),
        )  # fmt: skip
        release.timings["mig_burst_s"] = time.monotonic() - started
    finally:
        release.sim_hardware("fault", "--clear")
    after = _plugin_restarts(kubectl)
    assert after == before, f"the plugin restarted during the burst: before {before}, after {after}"


def test_uninstall_removes_pods_and_slices(release: Release, settings: E2ESettings) -> None:
    started = time.monotonic()
    _uninstall(release, settings)
    wait_until(
        lambda: not _pods(release.kubectl, PLUGIN_SELECTOR), timeout_s=120, what="the plugin pod to go away"
    )
    # MPS daemon pods are owned by the DaemonSet: the garbage collector deletes them with it (one serving a
    # claim at uninstall time: e2e/test_chart_security.py)
    wait_until(
        lambda: not _pods(release.kubectl, MPS_DAEMON_SELECTOR), timeout_s=120, what="no MPS daemon pod left"
    )
    stale = release.node_files.glob(KUBELET_DIR / "plugins_registry", f"{DRIVER_NAME}-*reg.sock")
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


NVIDIA_VALUES = Path(__file__).resolve().parents[1] / "tests" / "deploy" / "data" / "nvidia-values.yaml"
NFD_LABEL = "feature.node.kubernetes.io/pci-10de.present"
OPERATOR_LABEL = "nvidia.com/gpu.present"


def test_nvidia_chart_values_install_and_nfd_affinity(release: Release, settings: E2ESettings) -> None:
    """A values file written for NVIDIA's chart (its own values.yaml) installs this chart: the plugin runs on
    a node that has only Node Feature Discovery's NVIDIA PCI label (NVIDIA's affinity) and publishes slices.
    Overridden: the image (NVIDIA's file names NVIDIA's), resources.computeDomains.enabled (refused when
    true) and, for the simulator, driver root and hardware."""
    assert release.uninstalled, "runs after the first release is gone (one plugin per node)"
    kubectl, node = release.kubectl, release.node
    reference = release.image.reference if release.image is not None else release.image_ref
    # Only `node` gets NFD's label; the operator's label goes from every GPU node (kind has several), so a
    # plugin pod anywhere else would mean the affinity does not hold.
    kubectl.run("label", "node", node, f"{NFD_LABEL}=true", "--overwrite")
    for each in release.nodes:
        kubectl.run("label", "node", each, f"{OPERATOR_LABEL}-")
    # The simulator's hardware: on kind each node's own root (hardware=simulated), else the chart's sim root.
    simulated = ["hardware=simulated", f"nvidiaDriverRoot={settings.driver_root}"] if ON_KIND else [
        f"hardware={HARDWARE}", "nvidiaDriverRoot="
    ]  # fmt: skip
    started = time.monotonic()
    try:
        out = _helm(
            release.helm, settings.kubeconfig, "install", RELEASE, str(CHART_DIR), "-n", NAMESPACE,
            "--create-namespace", "-f", str(NVIDIA_VALUES),
            # dra-gpu has no ComputeDomains: NVIDIA's `true` is refused with a message, so it is turned off;
            # NVIDIA's gates and rate limits reach the plugin (it refuses to start on a value it cannot use)
            "--set", "resources.computeDomains.enabled=false", "--set", "featureGates.ContextualLogging=true",
            "--set", "featureGates.MPSSupport=true", "--set", "kubeletPlugin.kubeApiQps=20",
            "--set", f"image.repository={reference.rsplit(':', 1)[0]}",
            "--set", f"image.tag={reference.rsplit(':', 1)[1]}", "--set", "image.pullPolicy=Never",
            *(arg for value in simulated for arg in ("--set", value)),
            # NVIDIA's file turns ComputeDomains on; the chart refuses that (dra-gpu has none) until told off
            "--set", "resources.computeDomains.enabled=false",
        )  # fmt: skip
        assert "Ignored values" in out.stdout and "controller" in out.stdout, out.stdout

        def ready() -> list[dict[str, Any]] | None:
            pods = _pods(kubectl, PLUGIN_SELECTOR)
            return pods if pods and all(_ready(p) for p in pods) else None

        pods = wait_until(
            ready, timeout_s=180, what="the plugin pod (NVIDIA's values) Ready",
            explain=_explain(kubectl, PLUGIN_SELECTOR),
        )  # fmt: skip
        assert [p["spec"]["nodeName"] for p in pods] == [node]
        wait_until(
            lambda: len(_node_slices(kubectl, node)) >= _expected_slices(kubectl) or None, timeout_s=120,
            what=f"{_expected_slices(kubectl)} slices from the plugin installed with NVIDIA's values",
        )  # fmt: skip
        release.timings["nvidia_values_ready_s"] = time.monotonic() - started
    finally:
        try:
            _helm(
                release.helm, settings.kubeconfig, "uninstall", RELEASE, "-n", NAMESPACE, "--wait",
                "--ignore-not-found",
            )  # fmt: skip
        finally:
            kubectl.run("label", "node", node, f"{NFD_LABEL}-")
            for each in release.nodes:
                kubectl.run("label", "node", each, f"{OPERATOR_LABEL}=true", "--overwrite")
            kubectl.run(
                "delete", "resourceslices.resource.k8s.io", f"--field-selector=spec.driver={DRIVER_NAME}",
                "--ignore-not-found", check=False,
            )  # fmt: skip
