"""Extended resources backed by DRA (KEP-5004, `DRAExtendedResource`): a Pod that asks for
`nvidia.com/gpu: 1` in a container's resources gets a ResourceClaim that kube-scheduler makes for it.

A resource name maps to a DeviceClass when the class's `spec.extendedResourceName` is that name, or when the
name is `deviceclass.resource.kubernetes.io/<class name>` (every class has that implicit one). The claim is
made as 1.37's scheduler makes it (extendeddynamicresources.go), resource by resource in name order:
- every long-lived container (a regular container or a sidecar init container) that asks for the resource gets
  its own request `container-<i>-request-<j>`: i counts init containers first, then containers; j is the
  resource's position among all the container's requests (cpu and memory included) in name order;
- a plain init container runs before the long-lived containers it precedes and reuses their devices; it adds a
  request only for what those fall short of, and of those requests only the largest is kept;
- each request is `exactly: {deviceClassName, allocationMode: ExactCount, count}`.

Pure: Pod and DeviceClass objects in, a ResourceClaim object out (`explain` allocates it like any other).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_gpu.allocator.model import InputError

IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"


def class_for_resource(
    resource: str, extended_names: Mapping[str, str], class_names: set[str] | frozenset[str]
) -> str | None:
    """The DeviceClass that serves an extended resource name, or None (a device-plugin or other resource).

    `extended_names` maps spec.extendedResourceName -> class name."""
    if resource in extended_names:
        return extended_names[resource]
    if resource.startswith(IMPLICIT_PREFIX) and resource[len(IMPLICIT_PREFIX) :] in class_names:
        return resource[len(IMPLICIT_PREFIX) :]
    return None


def _count(value: Any, where: str) -> int:
    text = str(value).strip()
    if not text.isdigit():
        raise InputError(f"{where}: {value!r} is not a whole number of devices (use an integer such as 1)")
    return int(text)


def _requests(container: Mapping[str, Any]) -> dict[str, Any]:
    """The container's requests; the API server copies a limit into a missing request (extended resources
    must have them equal)."""
    resources = container.get("resources") or {}
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


def _request(index: int, container: Mapping[str, Any], resource: str, class_name: str, count: int) -> Any:
    position = sorted(_requests(container)).index(resource)
    return {
        "name": f"container-{index}-request-{position}",
        "exactly": {"deviceClassName": class_name, "allocationMode": "ExactCount", "count": count},
    }


def extended_resource_claim(
    pod: Mapping[str, Any], extended_names: Mapping[str, str], class_names: set[str] | frozenset[str]
) -> dict[str, Any] | None:
    """The ResourceClaim kube-scheduler would make for the pod's DRA-backed extended resources, or None when
    the pod asks for none."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    pod_name = str(meta.get("name") or "")
    spec = pod.get("spec") or {}
    init = list(spec.get("initContainers") or ())
    containers = [*init, *(spec.get("containers") or ())]
    short_lived = {i for i, c in enumerate(init) if c.get("restartPolicy") != "Always"}
    class_of: dict[str, str] = {}  # the DRA-backed resources the pod asks for -> their DeviceClass
    asked: list[dict[str, int]] = []  # per container: resource -> count
    for c in containers:
        counts = {}
        for name, value in _requests(c).items():
            class_name = class_for_resource(name, extended_names, class_names)
            if class_name is not None:
                class_of[name] = class_name
                where = f"Pod {namespace}/{pod_name} container {c.get('name')!r} resources {name!r}"
                counts[name] = _count(value, where)
        asked.append(counts)
    requests = []
    for resource, class_name in sorted(class_of.items()):
        long_lived: list[Any] = [None] * len(containers)
        for i, container in enumerate(containers):
            if i not in short_lived and asked[i].get(resource):
                long_lived[i] = _request(i, container, resource, class_name, asked[i][resource])
        largest = None
        for i in sorted(short_lived):
            wanted = asked[i].get(resource, 0)
            reused = sum(r["exactly"]["count"] for r in long_lived[i:] if r is not None)
            if wanted > reused and (largest is None or largest["exactly"]["count"] < wanted - reused):
                largest = _request(i, containers[i], resource, class_name, wanted - reused)
        requests += [r for r in (largest, *long_lived) if r is not None]
    if not requests:
        return None
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"{pod_name}-extended-resources", "namespace": namespace},
        "spec": {"devices": {"requests": requests}},
    }
