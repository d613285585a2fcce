"""The claim kube-scheduler makes for a pod's DRA-backed extended resources (KEP-5004), as `explain` makes
it.

Expected request names and counts follow 1.37's scheduler (pkg/scheduler/framework/plugins/dynamicresources/
extendeddynamicresources.go): one request per long-lived container and resource, `container-<i>-request-<j>`
with j the resource's position among all the container's requests, plain init containers reusing the devices
of the containers after them.
"""

from __future__ import annotations

from typing import Any

import pytest

from dra_gpu.allocator.extended_resources import class_for_resource, extended_resource_claim
from dra_gpu.allocator.model import InputError

NAMES = {"nvidia.com/gpu": "gpu.nvidia.com", "nvidia.com/mig-1g.12gb": "mig-1g-12gb.gpu.nvidia.com"}
CLASSES = frozenset({*NAMES.values(), "mig.nvidia.com"})


def _pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"initContainers": list(init), "containers": list(containers)},
    }


def _ctr(name: str, limits: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": limits or {}}, **more}


def _requests(pod: dict[str, Any]) -> list[tuple[str, str, int]]:
    claim = extended_resource_claim(pod, NAMES, CLASSES)
    assert claim is not None
    return [
        (r["name"], r["exactly"]["deviceClassName"], r["exactly"]["count"])
        for r in claim["spec"]["devices"]["requests"]
    ]


def test_a_resource_maps_by_extended_name_or_by_the_implicit_class_name() -> None:
    assert class_for_resource("nvidia.com/gpu", NAMES, CLASSES) == "gpu.nvidia.com"
    assert class_for_resource("deviceclass.resource.kubernetes.io/mig.nvidia.com", NAMES, CLASSES) == (
        "mig.nvidia.com"
    )
    assert class_for_resource("deviceclass.resource.kubernetes.io/nope", NAMES, CLASSES) is None
    assert class_for_resource("cpu", NAMES, CLASSES) is None


def test_the_manifests_pod_gets_the_request_nvidia_shows() -> None:
    # extended-resources/mig-1g-12gb.yaml's header shows the scheduler's claim: container-0-request-0 for 1
    pod = _pod(_ctr("cuda-container", {"nvidia.com/mig-1g.12gb": 1}))
    claim = extended_resource_claim(pod, NAMES, CLASSES)
    assert claim is not None and claim["metadata"] == {"name": "p-extended-resources", "namespace": "ns"}
    assert _requests(pod) == [("container-0-request-0", "mig-1g-12gb.gpu.nvidia.com", 1)]


def test_request_index_counts_every_resource_of_the_container_in_name_order() -> None:
    pod = _pod(
        _ctr("a", {"cpu": "1", "nvidia.com/gpu": "2", "memory": "1Gi"}),
        _ctr("b", {"example.com/other": 1}, resources={"requests": {"nvidia.com/mig-1g.12gb": 1}}),
    )
    # a: cpu, memory, nvidia.com/gpu -> index 2; b's requests alone count (limits were replaced here)
    assert _requests(pod) == [
        ("container-0-request-2", "gpu.nvidia.com", 2),
        ("container-1-request-0", "mig-1g-12gb.gpu.nvidia.com", 1),
    ]


def test_init_containers_reuse_the_devices_of_later_containers() -> None:
    pod = _pod(
        _ctr("main", {"nvidia.com/gpu": 1}),
        init=(_ctr("setup", {"nvidia.com/gpu": 3}), _ctr("warm", {"nvidia.com/gpu": 2})),
    )
    # setup (index 0) and warm (1) both run before main (2): 3 - 1 = 2 and 2 - 1 = 1 more; the largest is kept
    assert _requests(pod) == [
        ("container-0-request-0", "gpu.nvidia.com", 2),
        ("container-2-request-0", "gpu.nvidia.com", 1),
    ]
    covered = _pod(_ctr("main", {"nvidia.com/gpu": 2}), init=(_ctr("setup", {"nvidia.com/gpu": 1}),))
    assert _requests(covered) == [("container-1-request-0", "gpu.nvidia.com", 2)]


def test_a_sidecar_keeps_its_own_devices() -> None:
    sidecar = _ctr("proxy", {"nvidia.com/gpu": 1}, restartPolicy="Always")
    pod = _pod(_ctr("main", {"nvidia.com/gpu": 1}), init=(sidecar,))
    assert _requests(pod) == [
        ("container-0-request-0", "gpu.nvidia.com", 1),
        ("container-1-request-0", "gpu.nvidia.com", 1),
    ]


def test_pods_without_dra_backed_resources_get_no_claim() -> None:
    assert extended_resource_claim(_pod(_ctr("c", {"cpu": "1", "example.com/x": 1})), NAMES, CLASSES) is None


def test_a_fractional_count_names_the_container_and_resource() -> None:
    with pytest.raises(InputError, match=r"container 'c' resources 'nvidia.com/gpu': '500m' is not a whole"):
        extended_resource_claim(_pod(_ctr("c", {"nvidia.com/gpu": "500m"})), NAMES, CLASSES)
