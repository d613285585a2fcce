"""The real control plane fixture: pinned version, DRA gates on, resource.k8s.io/v1 validated server-side."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.support.control_plane import ControlPlane, selected_kubernetes_version

pytestmark = pytest.mark.apiserver


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _objects(plane: ControlPlane) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(plane.api_client())


def test_version_is_the_pinned_release(kube_apiserver: ControlPlane) -> None:
    pinned = selected_kubernetes_version()
    version = kube_apiserver.version()
    assert version["gitVersion"] == pinned
    assert (version["major"], version["minor"]) == tuple(pinned.lstrip("v").split(".")[:2])


def test_kubeconfig_client_reaches_the_server(kube_apiserver: ControlPlane) -> None:
    from kubernetes import client

    api = client.CoreV1Api(kube_apiserver.api_client())
    names = {ns.metadata.name for ns in api.list_namespace().items if ns.metadata}
    assert {"default", "kube-system"} <= names


def test_device_class_round_trips_with_extended_resource(kube_apiserver: ControlPlane) -> None:
    objects = _objects(kube_apiserver)
    name = _unique("gpu-test-class")
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}],
            # Gated by DRAExtendedResource: the server drops it when the gate is off.
            "extendedResourceName": f"example.com/{name}",
        },
    }
    objects.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", body)
    try:
        got = objects.get_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", name)
        assert got["spec"]["selectors"] == body["spec"]["selectors"]
        assert got["spec"]["extendedResourceName"] == f"example.com/{name}"
    finally:
        objects.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", name)


def _slice(name: str, pool: str, spec_extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": pool,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 2},
            **spec_extra,
        },
    }


def _before_1_35(plane: ControlPlane) -> bool:
    version = plane.version()
    return (int(version["major"]), int(version["minor"].rstrip("+"))) < (1, 35)


def test_partitionable_slices_keep_shared_counters(kube_apiserver: ControlPlane) -> None:
    if _before_1_35(kube_apiserver):
        pytest.skip("1.34 resolves counter sets inside the slice only (the 1.35+ split layout is refused)")
    objects = _objects(kube_apiserver)
    pool = _unique("node")
    counters = _slice(
        f"{pool}-counters",
        pool,
        {
            "sharedCounters": [
                {
                    "name": "gpu-0-counter-set",
                    "counters": {"memory": {"value": "80Gi"}, "multiprocessors": {"value": "132"}},
                }
            ]
        },
    )
    devices = _slice(
        f"{pool}-devices",
        pool,
        {
            "devices": [
                {
                    "name": "gpu-0",
                    "attributes": {"type": {"string": "gpu"}},
                    "consumesCounters": [
                        {
                            "counterSet": "gpu-0-counter-set",
                            "counters": {"memory": {"value": "80Gi"}, "multiprocessors": {"value": "132"}},
                        }
                    ],
                    # DRADeviceTaints and DRAConsumableCapacity fields, dropped when their gate is off.
                    "taints": [{"key": "example.com/unhealthy", "effect": "NoSchedule"}],
                    "allowMultipleAllocations": True,
                }
            ]
        },
    )
    created = []
    try:
        for body in (counters, devices):
            objects.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body)
            created.append(body["metadata"]["name"])
        got = objects.get_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", f"{pool}-counters")
        assert got["spec"]["sharedCounters"][0]["counters"]["memory"]["value"] == "80Gi"
        dev = objects.get_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", f"{pool}-devices")
        device = dev["spec"]["devices"][0]
        assert device["consumesCounters"][0]["counterSet"] == "gpu-0-counter-set"
        assert device["taints"][0]["key"] == "example.com/unhealthy"
        assert device["allowMultipleAllocations"] is True
    finally:
        for name in created:
            objects.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", name)


def test_server_rejects_counters_and_devices_in_one_slice(kube_apiserver: ControlPlane) -> None:
    from kubernetes.client.exceptions import ApiException

    if _before_1_35(kube_apiserver):
        pytest.skip("1.34 takes counters and devices in one slice (its layout)")

    objects = _objects(kube_apiserver)
    pool = _unique("node")
    body = _slice(
        f"{pool}-mixed",
        pool,
        {
            "sharedCounters": [{"name": "set", "counters": {"memory": {"value": "1Gi"}}}],
            "devices": [{"name": "gpu-0"}],
        },
    )
    with pytest.raises(ApiException) as excinfo:
        objects.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body)
    assert excinfo.value.status == 422
