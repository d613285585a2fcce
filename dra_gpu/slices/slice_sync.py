"""What to write to make the published slices match the desired ones (pure; the controller does the I/O).

The publishing algorithm of the Go ResourceSlice controller (k8s-dra-api §8), adapted to deterministic names:
1. `gen` = the highest `pool.generation` among the existing slices of the pool; slices below it, slices of
another
   pool, and slices whose name is not one of the desired names are obsolete.
2. Existing slices are matched to desired slices by name; a slice is changed when its pool fields, node,
devices,
   counters or ownerReferences differ (quantities compared by value, "1k" == "1000"; device order matters).
3. Generation: unchanged when only missing slices are recreated and at most one slice changed (the names are
   deterministic, so a recreated slice is the same slice); otherwise `max(gen, last published) + 1`, and then
   every
   slice is rewritten. Generations never go backwards within one controller (a wiped pool comes back higher).
4. Obsolete slices are deleted first (with uid + resourceVersion preconditions), then changed slices are
updated,
   then missing slices created.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_gpu.config.quantity import QuantityError, parse_quantity

_QUANTITY_KEYS = {"value", "default", "min", "max", "step"}


@dataclass(frozen=True)
class Obsolete:
    name: str
    uid: str
    resource_version: str


@dataclass
class SyncPlan:
    generation: int
    deletes: list[Obsolete] = field(default_factory=list)
    # desired slices with metadata.resourceVersion
    updates: list[dict[str, Any]] = field(default_factory=list)
    creates: list[dict[str, Any]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.deletes or self.updates or self.creates)


def _normalize(value: Any, key: str | None = None) -> Any:
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if v is None or v == [] or v == {}:
                continue
            if k == "allowMultipleAllocations" and v is False:
                continue
            out[k] = _normalize(v, k)
        return out
    if isinstance(value, list):
        return [_normalize(v, key) for v in value]
    if key in _QUANTITY_KEYS and isinstance(value, str):
        try:
            return parse_quantity(value)
        except QuantityError:
            return value
    if key == "validValues" and isinstance(value, str):
        try:
            return parse_quantity(value)
        except QuantityError:
            return value
    return value


def comparable(item: Mapping[str, Any]) -> str:
    """What decides whether an existing slice still matches: spec content and owner, canonical JSON."""
    spec = dict(item.get("spec") or {})
    owners = [
        {k: o.get(k) for k in ("apiVersion", "kind", "name", "uid", "controller")}
        for o in (item.get("metadata") or {}).get("ownerReferences") or []
    ]
    return json.dumps({"spec": _normalize(spec), "owners": owners}, sort_keys=True)


def plan_sync(
    existing: Sequence[Mapping[str, Any]],
    pool_name: str,
    desired_at: Callable[[int], list[dict[str, Any]]],
    last_generation: int,
    equivalent: Callable[[str, str, str], bool] | None = None,
) -> SyncPlan:
    """The writes that bring `existing` (this driver's slices on this node) to the desired state.

    `desired_at(generation)` builds the desired slices at a generation. `equivalent(name, existing_form,
    desired_form)` may declare two different forms the same (the server dropped a field it does not know).
    """
    in_pool = [s for s in existing if ((s.get("spec") or {}).get("pool") or {}).get("name") == pool_name]
    current_gen = max((int(s["spec"]["pool"].get("generation", 0)) for s in in_pool), default=0)
    obsolete: list[Mapping[str, Any]] = [s for s in existing if s not in in_pool]
    live: dict[str, Mapping[str, Any]] = {}
    for item in in_pool:
        name = item["metadata"]["name"]
        if int(item["spec"]["pool"].get("generation", 0)) < current_gen or name in live:
            obsolete.append(item)
        else:
            live[name] = item
    desired = desired_at(current_gen)
    desired_names = {d["metadata"]["name"] for d in desired}
    for name in [n for n in live if n not in desired_names]:
        obsolete.append(live.pop(name))

    def same(name: str, current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
        have, want = comparable(current), comparable(wanted)
        return have == want or (equivalent is not None and equivalent(name, have, want))

    changed = [
        d
        for d in desired
        if d["metadata"]["name"] in live and not same(d["metadata"]["name"], live[d["metadata"]["name"]], d)
    ]
    missing = [d for d in desired if d["metadata"]["name"] not in live]
    if not live or obsolete or len(changed) > 1:
        if not (changed or missing or obsolete):
            return SyncPlan(current_gen)
        generation = max(current_gen, last_generation) + 1
        desired = desired_at(generation)
        plan = SyncPlan(generation, deletes=[_obsolete(s) for s in obsolete])
        for item in desired:
            name = item["metadata"]["name"]
            if name in live:
                plan.updates.append(_with_version(item, live[name]))
            else:
                plan.creates.append(item)
        return plan
    return SyncPlan(
        current_gen,
        updates=[_with_version(d, live[d["metadata"]["name"]]) for d in changed],
        creates=missing,
    )


def _obsolete(item: Mapping[str, Any]) -> Obsolete:
    meta = item["metadata"]
    return Obsolete(meta["name"], meta.get("uid", ""), meta.get("resourceVersion", ""))


def _with_version(desired: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(desired))
    out["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    return out
