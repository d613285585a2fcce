"""DeviceModel -> ResourceSlices (`resource.k8s.io/v1` wire-format dicts, camelCase). Pure.

Layouts (one pool named after the node, every slice at the same generation, `resourceSliceCount` = all
slices):
- Kubernetes 1.34: one slice per GPU holding that GPU's counter set next to its devices (1.34 resolves counter
  references inside a slice only).
- Kubernetes 1.35+: counters and devices may not share a slice, so first the counters-only slices (at most 8
  counter
  sets each), then one device slice per GPU (split at 64 devices when they consume counters or carry taints,
  128 otherwise).
- Device taints (health): at most 16 per device on 1.35+, 4 on 1.34 (the model orders them most severe
  first; the rest are left out). Effect `None` only exists since 1.35: on 1.34 such taints are left out.
- No devices at all: one empty slice, so consumers see an empty pool rather than no pool.
- List-typed attributes (KEP-5491, gate DRAListTypeAttributes, alpha since 1.36): published as lists only with
  `list_type_attributes=True` on 1.36+ (the API server drops them when its gate is off, and the scheduler
  cannot match them without its gate). Otherwise a one-element list is published as its scalar (NVIDIA's
  `resource.kubernetes.io/numaNode` is `int` without the gate, `ints: [n]` with it) and a longer list is left
  out. A device with a list attribute counts as "advanced" (at most 64 per slice).

Names are deterministic, `<node>-gpu.nvidia.com-<n>` in order, so the controller can match existing slices to
desired ones by name and a restart rewrites nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from dra_gpu.config.quantity import format_quantity
from dra_gpu.inventory.model import (
    DRIVER_NAME,
    Attribute,
    Capacity,
    CounterSet,
    Device,
    DeviceModel,
    DeviceTaint,
    RequestPolicy,
)

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES = 128
MAX_DEVICES_WITH_COUNTERS = 64
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_TAINTS_PER_DEVICE = 16  # 1.35+
MAX_TAINTS_PER_DEVICE_134 = 4
MIN_KUBERNETES = (1, 34)
_MAX_NAME = 253


def uses_split_layout(kubernetes_version: tuple[int, int]) -> bool:
    """1.35 made counters-only slices mandatory for partitionable devices (KEP-4815 upgrade note)."""
    return tuple(kubernetes_version) >= (1, 35)


def slice_name(node_name: str, index: int, driver_name: str = DRIVER_NAME) -> str:
    name = f"{node_name}-{driver_name}-{index}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]  # keep very long node names unique and legal
    return f"{node_name[:200].rstrip('-.')}-{digest}-{driver_name}-{index}"


LIST_KINDS = {"strings": "string", "ints": "int", "bools": "bool", "versions": "version"}


def lists_published(kubernetes_version: tuple[int, int], list_type_attributes: bool) -> bool:
    """Whether list attributes go out as lists: the gate is on and the release has it (1.36+)."""
    return list_type_attributes and tuple(kubernetes_version) >= (1, 36)


def _attribute(attr: Attribute, lists: bool) -> dict[str, Any] | None:
    """The wire form of one attribute; None when it cannot be published (a longer list without lists)."""
    if attr.kind not in LIST_KINDS:
        return {attr.kind: attr.value}
    items = list(attr.value) if isinstance(attr.value, tuple) else [attr.value]
    if lists:
        return {attr.kind: items}
    return {LIST_KINDS[attr.kind]: items[0]} if len(items) == 1 else None


def _has_list_attribute(device: Device) -> bool:
    return any(a.kind in LIST_KINDS for a in device.attributes.values())


def _request_policy(policy: RequestPolicy, binary_si: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if policy.default is not None:
        out["default"] = format_quantity(policy.default, binary_si)
    if policy.valid_values:
        out["validValues"] = [format_quantity(v, binary_si) for v in policy.valid_values]
    elif policy.valid_range_min is not None:
        valid_range: dict[str, Any] = {"min": format_quantity(policy.valid_range_min, binary_si)}
        if policy.valid_range_max is not None:
            valid_range["max"] = format_quantity(policy.valid_range_max, binary_si)
        if policy.valid_range_step is not None:
            valid_range["step"] = format_quantity(policy.valid_range_step, binary_si)
        out["validRange"] = valid_range
    return out


def _capacity(capacity: Capacity) -> dict[str, Any]:
    out: dict[str, Any] = {"value": format_quantity(capacity.value, capacity.binary_si)}
    if capacity.request_policy is not None:
        out["requestPolicy"] = _request_policy(capacity.request_policy, capacity.binary_si)
    return out


def _counter_value(name: str, value: int) -> dict[str, str]:
    return {"value": format_quantity(value, binary_si=name == "memory")}


def taint_to_wire(taint: DeviceTaint) -> dict[str, Any]:
    out: dict[str, Any] = {"key": taint.key, "effect": taint.effect}
    if taint.value:
        out["value"] = taint.value
    if taint.time_added:
        out["timeAdded"] = taint.time_added
    return out


def max_taints(kubernetes_version: tuple[int, int]) -> int:
    return MAX_TAINTS_PER_DEVICE if uses_split_layout(kubernetes_version) else MAX_TAINTS_PER_DEVICE_134


def device_to_wire(
    device: Device, taint_limit: int = MAX_TAINTS_PER_DEVICE, lists: bool = False
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": device.name}
    attributes = {k: _attribute(v, lists) for k, v in sorted(device.attributes.items())}
    if any(v is not None for v in attributes.values()):
        out["attributes"] = {k: v for k, v in attributes.items() if v is not None}
    if device.capacity:
        out["capacity"] = {k: _capacity(v) for k, v in sorted(device.capacity.items())}
    if device.consumes_counters:
        out["consumesCounters"] = [
            {
                "counterSet": c.counter_set,
                "counters": {k: _counter_value(k, v) for k, v in sorted(c.counters.items())},
            }
            for c in device.consumes_counters
        ]
    if device.allow_multiple_allocations:
        out["allowMultipleAllocations"] = True
    # the 1.34 limit (4) also marks the release without effect None
    taints = [t for t in device.taints if taint_limit > MAX_TAINTS_PER_DEVICE_134 or t.effect != "None"]
    if taints:
        out["taints"] = [taint_to_wire(t) for t in taints[:taint_limit]]
    return out


def counter_set_to_wire(counter_set: CounterSet) -> dict[str, Any]:
    return {
        "name": counter_set.name,
        "counters": {k: _counter_value(k, v) for k, v in sorted(counter_set.counters.items())},
    }


def _chunks(devices: Sequence[Device], lists: bool = False) -> Iterable[list[Device]]:
    advanced = any(d.consumes_counters or d.taints or (lists and _has_list_attribute(d)) for d in devices)
    limit = MAX_DEVICES_WITH_COUNTERS if advanced else MAX_DEVICES
    for start in range(0, len(devices), limit):
        yield list(devices[start : start + limit])


def _group_by_gpu(devices: Sequence[Device]) -> list[list[Device]]:
    groups: dict[int, list[Device]] = {}
    for device in devices:  # keeps the model's order inside each GPU
        groups.setdefault(device.parent_minor, []).append(device)
    return [groups[minor] for minor in sorted(groups)]


def _slice_specs(model: DeviceModel, split: bool, taint_limit: int, lists: bool) -> list[dict[str, Any]]:
    """The `spec` content of each slice (devices and/or sharedCounters), in publishing order."""
    specs: list[dict[str, Any]] = []
    sets_by_name = {c.name: c for c in model.counter_sets}
    if split:
        sets = list(model.counter_sets)
        for start in range(0, len(sets), MAX_COUNTER_SETS_PER_SLICE):
            chunk_sets = sets[start : start + MAX_COUNTER_SETS_PER_SLICE]
            specs.append({"sharedCounters": [counter_set_to_wire(c) for c in chunk_sets]})
        for group in _group_by_gpu(model.devices):
            specs.extend(
                {"devices": [device_to_wire(d, taint_limit, lists) for d in chunk]}
                for chunk in _chunks(group, lists)
            )
    else:
        placed: set[str] = set()
        for group in _group_by_gpu(model.devices):
            used = sorted({c.counter_set for d in group for c in d.consumes_counters})
            for chunk in _chunks(group, lists):
                spec: dict[str, Any] = {"devices": [device_to_wire(d, taint_limit, lists) for d in chunk]}
                # 1.34 resolves references inside the slice only, so a slice carries the sets its devices use.
                needed = [
                    n
                    for n in used
                    if n in sets_by_name
                    and any(c.counter_set == n for d in chunk for c in d.consumes_counters)
                ]
                if needed:
                    spec["sharedCounters"] = [counter_set_to_wire(sets_by_name[n]) for n in needed]
                    placed.update(needed)
                specs.append(spec)
        leftovers = [c for c in model.counter_sets if c.name not in placed]
        if leftovers:
            specs.append({"sharedCounters": [counter_set_to_wire(c) for c in leftovers]})
    if not specs:
        specs.append({"devices": []})
    return specs


def build_slices(
    model: DeviceModel,
    node_name: str,
    kubernetes_version: tuple[int, int] = (1, 36),
    generation: int = 1,
    node_uid: str | None = None,
    driver_name: str = DRIVER_NAME,
    list_type_attributes: bool = False,
) -> list[dict[str, Any]]:
    """The node's ResourceSlices for `model`, ready to create/compare (see the module docstring for the
    layout). `list_type_attributes`: the cluster has DRAListTypeAttributes on (driver flag)."""
    if tuple(kubernetes_version) < MIN_KUBERNETES:
        raise ValueError(
            f"kubernetes_version {kubernetes_version[0]}.{kubernetes_version[1]} is too old: "
            "resource.k8s.io/v1 "
            f"ResourceSlices need Kubernetes {MIN_KUBERNETES[0]}.{MIN_KUBERNETES[1]} or newer"
        )
    if not node_name:
        raise ValueError("node_name must not be empty: slices are published for one node")
    specs = _slice_specs(
        model,
        uses_split_layout(kubernetes_version),
        max_taints(kubernetes_version),
        lists_published(kubernetes_version, list_type_attributes),
    )
    slices = []
    for index, content in enumerate(specs):
        metadata: dict[str, Any] = {"name": slice_name(node_name, index, driver_name)}
        if node_uid:
            metadata["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "controller": True}
            ]
        spec: dict[str, Any] = {
            "driver": driver_name,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": len(specs)},
            **content,
        }
        slices.append(
            {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": metadata, "spec": spec}
        )
    return slices
