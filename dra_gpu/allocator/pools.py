"""ResourceSlices -> resource pools as the scheduler sees them from one node.

A slice is available on a node when `nodeName` is the node, `allNodes` is set, or `nodeSelector` matches the
node's labels; with `perDeviceNodeSelection` every device says so itself. Slices are grouped by (driver,
pool); only the highest generation counts; a pool with fewer slices than `resourceSliceCount` is incomplete,
and duplicate device names, duplicate counter sets or dangling counter references make it invalid.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from dra_gpu.allocator.model import Candidate, InputError, Pool, quantity_of


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)


def node_selector_matches(selector: Mapping[str, Any] | None, node: Node) -> bool:
    """core/v1 NodeSelector: terms are ORed, expressions inside a term ANDed."""
    if not selector:
        return False
    for term in selector.get("nodeSelectorTerms") or ():
        expressions = list(term.get("matchExpressions") or ())
        fields = list(term.get("matchFields") or ())
        if not expressions and not fields:
            continue
        if all(_requirement(e, node.labels) for e in expressions) and all(
            _requirement(f, {"metadata.name": node.name}) for f in fields
        ):
            return True
    return False


def _requirement(requirement: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key = str(requirement.get("key", ""))
    operator = str(requirement.get("operator", ""))
    values = [str(v) for v in requirement.get("values") or ()]
    present = key in labels
    value = labels.get(key)
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, want = int(str(value)), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def _slice_name(slice_obj: Mapping[str, Any]) -> str:
    return str((slice_obj.get("metadata") or {}).get("name", ""))


def _spec(slice_obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = slice_obj.get("spec")
    if not isinstance(spec, Mapping):
        raise InputError(f"ResourceSlice {_slice_name(slice_obj)!r}: spec is missing")
    return spec


class SliceIndex:
    """All slices of a cluster, indexed so that the pools of one node are cheap to assemble."""

    def __init__(self, slices: Iterable[Mapping[str, Any]]):
        self.by_node: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        self.shared: list[Mapping[str, Any]] = []  # allNodes, nodeSelector, perDeviceNodeSelection
        self.node_names: set[str] = set()
        for slice_obj in slices:
            spec = _spec(slice_obj)
            pool = spec.get("pool") or {}
            if not spec.get("driver") or not pool.get("name"):
                raise InputError(
                    f"ResourceSlice {_slice_name(slice_obj)!r}: spec.driver and spec.pool.name are required"
                )
            node_name = spec.get("nodeName")
            if node_name:
                self.by_node[str(node_name)].append(slice_obj)
                self.node_names.add(str(node_name))
            else:
                self.shared.append(slice_obj)
                for device in spec.get("devices") or ():
                    if device.get("nodeName"):
                        self.node_names.add(str(device["nodeName"]))

    def pools_for(self, node: Node) -> list[Pool]:
        relevant: list[tuple[Mapping[str, Any], list[Mapping[str, Any]] | None]] = []
        for slice_obj in self.by_node.get(node.name, ()):
            relevant.append((slice_obj, None))
        for slice_obj in self.shared:
            spec = slice_obj["spec"]
            if spec.get("perDeviceNodeSelection"):
                devices = [d for d in spec.get("devices") or () if _device_on_node(d, node)]
                relevant.append((slice_obj, devices))
            elif spec.get("allNodes") or node_selector_matches(spec.get("nodeSelector"), node):
                relevant.append((slice_obj, None))
        return build_pools(relevant, node.name)


def _device_on_node(device: Mapping[str, Any], node: Node) -> bool:
    if device.get("nodeName"):
        return str(device["nodeName"]) == node.name
    if device.get("allNodes"):
        return True
    return node_selector_matches(device.get("nodeSelector"), node)


def build_pools(
    slices: Sequence[tuple[Mapping[str, Any], list[Mapping[str, Any]] | None]], node_name: str | None
) -> list[Pool]:
    """Group (slice, device subset or None for all) into pools, sorted by driver and pool name."""
    grouped: dict[tuple[str, str], list[tuple[Mapping[str, Any], list[Mapping[str, Any]] | None]]] = (
        defaultdict(list)
    )
    for slice_obj, devices in slices:
        spec = slice_obj["spec"]
        grouped[(str(spec["driver"]), str(spec["pool"]["name"]))].append((slice_obj, devices))
    pools = []
    for (driver, pool_name), members in sorted(grouped.items()):
        generation = max(int(m[0]["spec"]["pool"].get("generation", 0) or 0) for m in members)
        current = [m for m in members if int(m[0]["spec"]["pool"].get("generation", 0) or 0) == generation]
        current.sort(key=lambda m: _slice_name(m[0]))
        slice_count = int(current[0][0]["spec"]["pool"].get("resourceSliceCount", 1) or 1)
        pool = Pool(driver, pool_name, generation, slice_count, [m[0] for m in current], [], {})
        pool.incomplete = len(current) < slice_count
        _fill_pool(pool, current, node_name)
        pools.append(pool)
    return pools


def _fill_pool(
    pool: Pool, members: list[tuple[Mapping[str, Any], list[Mapping[str, Any]] | None]], node_name: str | None
) -> None:
    names: set[str] = set()
    problems: list[str] = []
    for slice_obj, subset in members:
        spec = slice_obj["spec"]
        for counter_set in spec.get("sharedCounters") or ():
            set_name = str(counter_set.get("name", ""))
            if set_name in pool.counter_sets:
                problems.append(f"duplicate counter set {set_name!r}")
                continue
            pool.counter_sets[set_name] = {
                counter: quantity_of(
                    (value or {}).get("value"), f"pool {pool.name} counter set {set_name} {counter}"
                )
                for counter, value in (counter_set.get("counters") or {}).items()
            }
        devices = spec.get("devices") or () if subset is None else subset
        slice_name = _slice_name(slice_obj)
        driver, pool_name, append = pool.driver, pool.name, pool.candidates.append
        for device in devices:
            device_name = device.get("name", "")
            if device_name in names:
                problems.append(f"duplicate device name {device_name!r}")
            names.add(device_name)
            append(Candidate(driver, pool_name, slice_name, device_name, device, node_name))
    counter_sets = pool.counter_sets
    for candidate in pool.candidates:
        for entry in candidate.data.get("consumesCounters") or ():
            set_name = str(entry.get("counterSet", ""))
            counter_set = counter_sets.get(set_name)
            if counter_set is None:
                problems.append(f"device {candidate.name} consumes from unknown counter set {set_name!r}")
                continue
            counters = entry.get("counters") or {}
            if counters.keys() <= counter_set.keys():
                continue
            for counter in counters:
                if counter not in counter_set:
                    problems.append(
                        f"device {candidate.name} consumes unknown counter {counter!r} of {set_name!r}"
                    )
    if problems and not pool.incomplete:
        pool.invalid_reason = "; ".join(problems[:3]) + (
            f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        )


def counter_totals(pool: Pool) -> dict[str, dict[str, Decimal]]:
    return {name: dict(counters) for name, counters in pool.counter_sets.items()}
