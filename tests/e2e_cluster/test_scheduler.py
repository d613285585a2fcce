"""The `kube_scheduler` fixture: a real kube-scheduler allocates a DRA claim and binds the pod."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from tests.support.control_plane import ControlPlane

pytestmark = pytest.mark.apiserver


def _wait_for(fetch: Any, done: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        obj = fetch()
        if done(obj):
            return obj
        if time.monotonic() > deadline:
            return obj
        time.sleep(0.25)


def test_scheduler_allocates_a_claim_and_binds_the_pod(kube_scheduler: ControlPlane) -> None:
    from kubernetes import client

    api = kube_scheduler.api_client()
    core = client.CoreV1Api(api)
    objects = client.CustomObjectsApi(api)
    suffix = uuid.uuid4().hex[:8]
    node, driver, klass = f"sched-node-{suffix}", f"sched-{suffix}.example.com", f"sched-class-{suffix}"
    ns = f"sched-{suffix}"

    node_body: Any = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
    core.create_node(node_body)
    core.patch_node_status(
        node,
        {
            "status": {
                "capacity": {"cpu": "4", "memory": "8Gi", "pods": "10"},
                "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "10"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "Test", "message": "test node"}],
            }
        },
    )
    # The TaintNodesByCondition admission plugin taints every new node not-ready; without a node lifecycle
    # controller nobody lifts it, so do what that controller does for a Ready node.
    core.patch_node(node, {"spec": {"taints": []}})
    ns_body: Any = {"metadata": {"name": ns}}
    core.create_namespace(ns_body)
    objects.create_cluster_custom_object(
        "resource.k8s.io",
        "v1",
        "deviceclasses",
        {
            "metadata": {"name": klass},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]},
        },
    )
    objects.create_cluster_custom_object(
        "resource.k8s.io",
        "v1",
        "resourceslices",
        {
            "metadata": {"name": f"{node}-slice"},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "dev-0", "attributes": {"type": {"string": "gpu"}}}],
            },
        },
    )
    objects.create_namespaced_custom_object(
        "resource.k8s.io",
        "v1",
        ns,
        "resourceclaims",
        {
            "metadata": {"name": "claim"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": klass}}]}},
        },
    )
    pod_body: Any = {
        "metadata": {"name": "pod"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "claim"}],
            "containers": [
                {
                    "name": "c",
                    "image": "registry.local/busybox:1",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    core.create_namespaced_pod(ns, pod_body)
    try:
        pod = _wait_for(lambda: core.read_namespaced_pod("pod", ns), lambda p: bool(p.spec.node_name))
        assert pod.spec.node_name == node, pod.status.conditions
        claim: Any = objects.get_namespaced_custom_object(
            "resource.k8s.io", "v1", ns, "resourceclaims", "claim"
        )
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [(r["driver"], r["pool"], r["device"]) for r in results] == [(driver, node, "dev-0")]
        assert claim["status"]["reservedFor"][0]["name"] == "pod"
    finally:
        core.delete_namespace(ns)
        objects.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", f"{node}-slice")
        objects.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", klass)
        core.delete_node(node)
