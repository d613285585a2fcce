"""`make e2e-kind` ran on kind, with the driver as its chart deploys it, not on the local cluster.

Runs where e2e/kind/run.sh says which kind cluster it made (`DRA_GPU_E2E_KIND_CLUSTER`); fails if the nodes
are not that cluster's containers or the driver is not the chart's pods from the image loaded into them.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import DriverMode, E2ESettings, load_settings

pytestmark = pytest.mark.e2e

KIND_CLUSTER = load_settings().kind_cluster or ""
if not KIND_CLUSTER:
    pytest.skip(
        "not a kind run (DRA_GPU_E2E_KIND_CLUSTER is set by e2e/kind/run.sh)", allow_module_level=True
    )


def test_every_node_is_a_container_of_the_kind_cluster(kubectl: Kubectl) -> None:
    nodes = kubectl.items("nodes")
    assert len(nodes) >= 2, [n["metadata"]["name"] for n in nodes]
    for node in nodes:
        name = node["metadata"]["name"]
        # kind's cloud-provider-less nodes carry this provider ID (kind sets it through kubeadm).
        assert node["spec"].get("providerID") == f"kind://docker/{KIND_CLUSTER}/{name}", node["spec"]
        inspect = subprocess.run(["docker", "inspect", name], capture_output=True, text=True, check=True)
        container = json.loads(inspect.stdout)[0]
        assert container["State"]["Running"], container["State"]
        assert container["Config"]["Labels"].get("io.x-k8s.kind.cluster") == KIND_CLUSTER


def test_the_driver_is_the_charts_pods_on_every_gpu_node(kubectl: Kubectl, settings: E2ESettings) -> None:
    assert settings.mode is DriverMode.IN_CLUSTER
    gpu_nodes = {
        n["metadata"]["name"]
        for n in kubectl.items("nodes")
        if n["metadata"].get("labels", {}).get("nvidia.com/gpu.present") == "true"
    }
    plugins = kubectl.items("pods", settings.chart_namespace, "app.kubernetes.io/component=kubelet-plugin")
    running = {p["spec"]["nodeName"]: p for p in plugins if p.get("status", {}).get("phase") == "Running"}
    assert set(running) == gpu_nodes, (sorted(running), sorted(gpu_nodes))
    for pod in running.values():
        images = {c["image"] for c in pod["spec"]["containers"]}
        assert images == {"dra-gpu:kind"}, images
