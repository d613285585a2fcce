"""Wire-format (resource.k8s.io/v1) objects for allocator tests, written out by hand."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_gpu.allocator.builtin_classes import builtin_device_classes
from dra_gpu.allocator.claims import claim_from_object, parse_device_class
from dra_gpu.allocator.explain import ClaimExplanation, explain
from dra_gpu.allocator.pools import Node, SliceIndex
from dra_gpu.allocator.search import Existing

DRIVER = "gpu.nvidia.com"


def device(
    name: str,
    kind: str = "gpu",
    *,
    attributes: Mapping[str, Any] | None = None,
    capacity: Mapping[str, Any] | None = None,
    consumes: Sequence[Mapping[str, Any]] = (),
    taints: Sequence[Mapping[str, Any]] = (),
    multi: bool = False,
) -> dict[str, Any]:
    attrs: dict[str, Any] = {"type": {"string": kind}}
    for key, value in (attributes or {}).items():
        if isinstance(value, Mapping):  # written out in wire form, e.g. a list attribute {"ints": [0, 1]}
            attrs[key] = dict(value)
        elif isinstance(value, bool):
            attrs[key] = {"bool": value}
        elif isinstance(value, int):
            attrs[key] = {"int": value}
        elif isinstance(value, str) and value.startswith("v:"):
            attrs[key] = {"version": value[2:]}
        else:
            attrs[key] = {"string": value}
    out: dict[str, Any] = {"name": name, "attributes": attrs}
    if capacity:
        out["capacity"] = {k: (v if isinstance(v, Mapping) else {"value": v}) for k, v in capacity.items()}
    if consumes:
        out["consumesCounters"] = list(consumes)
    if taints:
        out["taints"] = list(taints)
    if multi:
        out["allowMultipleAllocations"] = True
    return out


def consumes(counter_set: str, **counters: str) -> dict[str, Any]:
    return {
        "counterSet": counter_set,
        "counters": {k.replace("_", "-"): {"value": v} for k, v in counters.items()},
    }


def resource_slice(
    name: str,
    node: str,
    devices: Sequence[Mapping[str, Any]] = (),
    *,
    pool: str | None = None,
    generation: int = 1,
    count: int = 1,
    counters: Mapping[str, Mapping[str, str]] | None = None,
    driver: str = DRIVER,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": driver,
        "nodeName": node,
        "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": count},
    }
    if devices:
        spec["devices"] = list(devices)
    if counters:
        spec["sharedCounters"] = [
            {"name": set_name, "counters": {k: {"value": v} for k, v in values.items()}}
            for set_name, values in counters.items()
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": spec,
    }


def exactly(
    name: str, device_class: str = "gpu.nvidia.com", count: int | None = 1, **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": device_class}
    if count is not None:
        body["count"] = count
    if "selectors" in extra:
        body["selectors"] = [{"cel": {"expression": e}} for e in extra.pop("selectors")]
    body.update(extra)
    return {"name": name, "exactly": body}


def first_available(name: str, *subs: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": name, "firstAvailable": list(subs)}


def claim(
    name: str,
    *requests: Mapping[str, Any],
    constraints: Sequence[Mapping[str, Any]] = (),
    namespace: str = "default",
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = list(constraints)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": devices},
    }


def allocated(name: str, *results: Mapping[str, Any], namespace: str = "default") -> dict[str, Any]:
    obj = claim(name, exactly("x"), namespace=namespace)
    obj["status"] = {"allocation": {"devices": {"results": list(results)}}}
    return obj


def result(device_name: str, pool: str, request: str = "x", **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": DRIVER, "pool": pool, "device": device_name, **extra}


def run(
    claims: Sequence[Mapping[str, Any]],
    slices: Sequence[Mapping[str, Any]],
    *,
    existing: Sequence[Mapping[str, Any]] = (),
    classes: Sequence[Mapping[str, Any]] | None = None,
    nodes: Sequence[Node] | None = None,
    together: bool = False,
) -> list[ClaimExplanation]:
    class_specs = {c.name: c for c in (parse_device_class(o) for o in (classes or builtin_device_classes()))}
    index = SliceIndex(slices)
    node_list = list(nodes) if nodes is not None else [Node(n) for n in sorted(index.node_names)]
    parsed = [claim_from_object(c) for c in claims]
    groups = [parsed] if together else [[c] for c in parsed]
    return explain(groups, class_specs, index, node_list, Existing.from_claims(existing))


def allocated_labels(explanation: ClaimExplanation) -> list[str]:
    return [r.label for r in explanation.results]


def allocate_in_turn(
    slices: Sequence[Mapping[str, Any]],
    spec: Mapping[str, Any],
    replicas: int,
    *,
    namespace: str = "default",
    existing: Sequence[Mapping[str, Any]] = (),
) -> tuple[list[dict[str, Any]], list[str]]:
    """The claims of `replicas` pods made from one claim template (`spec`), allocated one after another as
    kube-scheduler does, each seeing the allocations before it: (the allocated claims as the API server would
    hold them, with shareID and consumedCapacity, and the reasons of the claims that did not fit)."""
    from dra_gpu.allocator.explain import result_json

    class_specs = {c.name: c for c in (parse_device_class(o) for o in builtin_device_classes())}
    index = SliceIndex(slices)
    nodes = [Node(n) for n in sorted(index.node_names)]
    allocated: list[dict[str, Any]] = []
    pending: list[str] = []
    for i in range(replicas):
        obj: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"replica-{i}-gpu", "namespace": namespace},
            "spec": dict(spec),
        }
        [explanation] = explain(
            [[claim_from_object(obj)]],
            class_specs,
            index,
            nodes,
            Existing.from_claims([*existing, *allocated]),
        )
        if not explanation.allocatable:
            pending.append(str(explanation.reason))
            continue
        results = [result_json(r) for r in explanation.results]
        allocated.append(obj | {"status": {"allocation": {"devices": {"results": results}}}})
    return allocated, pending
