"""Client-side checks of ResourceSlices before they are published (pure).

Every limit of the apiserver's ResourceSlice validation that our slices can hit (k8s-dra-api §3.4), plus what
the
apiserver cannot check and the Go ResourceSlice controller checks client-side: unique device names and counter
set
names per pool, counter references that resolve, one generation and a matching `resourceSliceCount` per pool.
Each problem is one message naming the slice, the device and the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dra_gpu.config.quantity import QuantityError, parse_quantity
from dra_gpu.slices.slice_builder import (
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_DEVICES,
    MAX_DEVICES_WITH_COUNTERS,
    MAX_TAINTS_PER_DEVICE,
    MAX_TAINTS_PER_DEVICE_134,
    uses_split_layout,
)

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# semver 2.0.0, as apimachinery's semverRe: no "v" prefix, no leading zeros
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUE_BYTES = 64
MAX_COUNTERS_PER_SET = 32
MAX_SHARED_COUNTERS_134 = 32
MAX_CONSUMED_COUNTERS_PER_DEVICE_134 = 32
MAX_CONSUMED_COUNTERS_PER_SLICE_134 = 1024
MAX_CONSUMES_ENTRIES = 2
MAX_VALID_VALUES = 10
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


class SliceValidationError(ValueError):
    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("invalid ResourceSlices:\n  " + "\n  ".join(problems))
        self.problems = list(problems)


def _is_dns_subdomain(value: str, max_len: int = 253) -> bool:
    return 0 < len(value) <= max_len and DNS_SUBDOMAIN.match(value) is not None


def is_dns_label(value: str) -> bool:
    return 0 < len(value) <= 63 and DNS_LABEL.match(value) is not None


def _qualified_name_problem(name: str) -> str | None:
    parts = name.split("/")
    if len(parts) > 2:
        return "has more than one '/'"
    identifier = parts[-1]
    if len(parts) == 2 and (len(parts[0]) > 63 or not _is_dns_subdomain(parts[0].lower(), 63)):
        return f"domain {parts[0]!r} is not a DNS subdomain of at most 63 characters"
    if len(identifier) > 32 or not C_IDENTIFIER.match(identifier):
        return f"{identifier!r} is not a C identifier of at most 32 characters"
    return None


def _quantity(value: Any, where: str, problems: list[str]) -> int | None:
    if not isinstance(value, str):
        problems.append(f"{where}: quantity must be a string, got {value!r}")
        return None
    try:
        return parse_quantity(value)
    except QuantityError as err:
        problems.append(f"{where}: {err}")
        return None


LIST_ATTRIBUTE_KINDS = {"ints": "int", "bools": "bool", "strings": "string", "versions": "version"}
MAX_ATTRIBUTE_VALUES_PER_DEVICE = 48  # 1.36+: scalars count 1, list items one by one


def _attribute_values(value: Any) -> int:
    """How many values an attribute holds, for the per-device limit."""
    if isinstance(value, Mapping) and len(value) == 1:
        ((kind, item),) = value.items()
        if kind in LIST_ATTRIBUTE_KINDS and isinstance(item, list):
            return len(item)
    return 1


def _check_attribute(where: str, value: Any, problems: list[str], lists: bool = False) -> None:
    if not isinstance(value, Mapping) or len(value) != 1:
        problems.append(f"{where}: must set exactly one of int, bool, string, version")
        return
    ((kind, item),) = value.items()
    if kind in LIST_ATTRIBUTE_KINDS:
        if not lists:
            problems.append(
                f"{where}.{kind}: list attributes need Kubernetes >= 1.36 with the DRAListTypeAttributes gate"
            )
        elif not isinstance(item, list) or not item:
            problems.append(f"{where}.{kind}: must be a non-empty list")
        else:
            for index, element in enumerate(item):
                _check_attribute(f"{where}.{kind}[{index}]", {LIST_ATTRIBUTE_KINDS[kind]: element}, problems)
        return
    if kind == "int":
        if not isinstance(item, int) or isinstance(item, bool):
            problems.append(f"{where}.int: {item!r} is not an integer")
    elif kind == "bool":
        if not isinstance(item, bool):
            problems.append(f"{where}.bool: {item!r} is not a boolean")
    elif kind in ("string", "version"):
        if not isinstance(item, str):
            problems.append(f"{where}.{kind}: {item!r} is not a string")
            return
        if len(item.encode()) > MAX_ATTRIBUTE_VALUE_BYTES:
            problems.append(
                f"{where}.{kind}: {len(item.encode())} bytes, at most {MAX_ATTRIBUTE_VALUE_BYTES}"
            )
        if kind == "version" and not SEMVER.match(item):
            problems.append(
                f"{where}.version: {item!r} is not strict semver (MAJOR.MINOR.PATCH, no leading zeros)"
            )
    else:
        problems.append(f"{where}: unknown attribute type {kind!r} (int, bool, string, version)")


def _check_request_policy(
    where: str, policy: Mapping[str, Any], capacity: int | None, problems: list[str]
) -> None:
    default = _quantity(policy["default"], f"{where}.default", problems) if "default" in policy else None
    if "validValues" in policy and "validRange" in policy:
        problems.append(f"{where}: set validValues or validRange, not both")
    if "validValues" in policy:
        values = [
            _quantity(v, f"{where}.validValues[{i}]", problems) for i, v in enumerate(policy["validValues"])
        ]
        if len(values) > MAX_VALID_VALUES:
            problems.append(f"{where}.validValues: {len(values)} entries, at most {MAX_VALID_VALUES}")
        known = [v for v in values if v is not None]
        if known != sorted(set(known)):
            problems.append(f"{where}.validValues: must be strictly ascending")
        if capacity is not None and any(v > capacity for v in known):
            problems.append(f"{where}.validValues: entries must not exceed the capacity value")
        if default is not None and default not in known:
            problems.append(f"{where}.default: must be one of validValues")
    if "validRange" in policy:
        rng = policy["validRange"]
        low = _quantity(rng.get("min"), f"{where}.validRange.min", problems)
        high = _quantity(rng["max"], f"{where}.validRange.max", problems) if "max" in rng else None
        step = _quantity(rng["step"], f"{where}.validRange.step", problems) if "step" in rng else None
        if low is None:
            return
        if capacity is not None and low > capacity:
            problems.append(f"{where}.validRange.min: exceeds the capacity value")
        if default is not None and default < low:
            problems.append(f"{where}.default: below validRange.min")
        if high is not None:
            if high < low or (capacity is not None and high > capacity):
                problems.append(f"{where}.validRange.max: must be between min and the capacity value")
            if default is not None and default > high:
                problems.append(f"{where}.default: above validRange.max")
        if step is not None:
            if step <= 0:
                problems.append(f"{where}.validRange.step: must be positive")
            elif capacity is not None and low + step > capacity:
                problems.append(f"{where}.validRange.step: min + step exceeds the capacity value")
            else:
                for label, value in (("default", default), ("validRange.max", high)):
                    if value is not None and (value - low) % step:
                        problems.append(f"{where}.{label}: must equal min + n*step")


def _is_label_name(key: str) -> bool:
    """A Kubernetes label key: optional DNS-subdomain prefix and '/', then a name of <= 63."""
    prefix, _, name = key.rpartition("/")
    if prefix and not _is_dns_subdomain(prefix):
        return False
    return len(name) <= 63 and bool(_LABEL_VALUE.fullmatch(name)) and bool(name)


def _check_taints(where: str, device: Mapping[str, Any], split: bool, problems: list[str]) -> None:
    taints = device.get("taints") or []
    limit = MAX_TAINTS_PER_DEVICE if split else MAX_TAINTS_PER_DEVICE_134
    if len(taints) > limit:
        problems.append(f"{where}.taints: {len(taints)} taints, at most {limit}")
    effects = ("NoSchedule", "NoExecute", "None") if split else ("NoSchedule", "NoExecute")
    for i, taint in enumerate(taints):
        key, value = taint.get("key", ""), taint.get("value", "")
        if not _is_label_name(key):
            problems.append(f"{where}.taints[{i}].key: {key!r} is not a label name")
        if len(value) > 63 or (value and not _LABEL_VALUE.fullmatch(value)):
            problems.append(f"{where}.taints[{i}].value: {value!r} is not a label value (<= 63)")
        if taint.get("effect") not in effects:
            problems.append(f"{where}.taints[{i}].effect: {taint.get('effect')!r}, expected one of {effects}")


def _check_device(where: str, device: Mapping[str, Any], problems: list[str], lists: bool = False) -> None:
    name = device.get("name", "")
    if not is_dns_label(name):
        problems.append(
            f"{where}.name: {name!r} is not a DNS label (lower-case alphanumerics and '-', <= 63)"
        )
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        problems.append(
            f"{where}: {len(attributes)} attributes + {len(capacity)} capacities, at most "
            f"{MAX_ATTRIBUTES_AND_CAPACITIES}"
        )
    for key, value in attributes.items():
        problem = _qualified_name_problem(key)
        if problem:
            problems.append(f"{where}.attributes[{key!r}]: name {problem}")
        _check_attribute(f"{where}.attributes[{key!r}]", value, problems, lists)
    values = sum(_attribute_values(v) for v in attributes.values())
    if lists and values > MAX_ATTRIBUTE_VALUES_PER_DEVICE:
        problems.append(f"{where}: {values} attribute values, at most {MAX_ATTRIBUTE_VALUES_PER_DEVICE}")
    multiple = device.get("allowMultipleAllocations") is True
    for key, value in capacity.items():
        problem = _qualified_name_problem(key)
        if problem:
            problems.append(f"{where}.capacity[{key!r}]: name {problem}")
        amount = _quantity(value.get("value"), f"{where}.capacity[{key!r}].value", problems)
        if "requestPolicy" in value:
            if not multiple:
                problems.append(
                    f"{where}.capacity[{key!r}].requestPolicy: allowMultipleAllocations must be true"
                )
            _check_request_policy(
                f"{where}.capacity[{key!r}].requestPolicy", value["requestPolicy"], amount, problems
            )
    consumes = device.get("consumesCounters") or []
    if len(consumes) > MAX_CONSUMES_ENTRIES:
        problems.append(f"{where}.consumesCounters: {len(consumes)} entries, at most {MAX_CONSUMES_ENTRIES}")
    sets = [c.get("counterSet") for c in consumes]
    if len(sets) != len(set(sets)):
        problems.append(f"{where}.consumesCounters: counterSet names must be unique")
    for i, entry in enumerate(consumes):
        counters = entry.get("counters") or {}
        if len(counters) > MAX_COUNTERS_PER_SET:
            problems.append(
                f"{where}.consumesCounters[{i}]: {len(counters)} counters, at most {MAX_COUNTERS_PER_SET}"
            )
        for counter, value in counters.items():
            _quantity(value.get("value"), f"{where}.consumesCounters[{i}].counters[{counter!r}]", problems)


def validate_slices(
    slices: Sequence[Mapping[str, Any]], kubernetes_version: tuple[int, int] = (1, 36)
) -> list[str]:
    """Every problem found, as messages; an empty list means the slices can be published."""
    problems: list[str] = []
    split = uses_split_layout(kubernetes_version)
    device_names: dict[tuple[str, str], str] = {}
    counter_sets: dict[tuple[str, str], tuple[str, dict[str, int]]] = {}
    references: list[tuple[str, str, str, str, dict[str, int]]] = []  # where, pool, slice, set, counters
    pools: dict[str, list[tuple[int, int]]] = {}
    for s_index, item in enumerate(slices):
        name = (item.get("metadata") or {}).get("name", "")
        where = f"slice {name or s_index}"
        if not _is_dns_subdomain(name):
            problems.append(f"{where}: metadata.name {name!r} is not a DNS subdomain (<= 253)")
        spec = item.get("spec") or {}
        driver = spec.get("driver", "")
        if len(driver) > 63 or not _is_dns_subdomain(driver, 63):
            problems.append(f"{where}: spec.driver {driver!r} must be a lower-case DNS subdomain of <= 63")
        pool = spec.get("pool") or {}
        pool_name = pool.get("name", "")
        if (
            len(pool_name) > 253
            or not pool_name
            or not all(_is_dns_subdomain(p) for p in pool_name.split("/"))
        ):
            problems.append(
                f"{where}: spec.pool.name {pool_name!r} must be '/'-separated DNS subdomains (<= 253)"
            )
        generation, count = pool.get("generation", 0), pool.get("resourceSliceCount", 0)
        if not isinstance(generation, int) or generation < 0:
            problems.append(f"{where}: spec.pool.generation must be >= 0")
        if not isinstance(count, int) or count <= 0:
            problems.append(f"{where}: spec.pool.resourceSliceCount must be > 0")
        pools.setdefault(pool_name, []).append((generation, count))
        selectors = [
            k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)
        ]
        if len(selectors) != 1:
            problems.append(
                f"{where}: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection "
                f"must be set (got {selectors or 'none'})"
            )
        devices = spec.get("devices") or []
        shared = spec.get("sharedCounters") or []
        if split and devices and shared:
            problems.append(
                f"{where}: on Kubernetes >= 1.35 a slice holds devices or sharedCounters, not both"
            )
        advanced = any(
            d.get("consumesCounters")
            or d.get("taints")
            or any(set(v) & set(LIST_ATTRIBUTE_KINDS) for v in (d.get("attributes") or {}).values())
            for d in devices
        )
        limit = MAX_DEVICES_WITH_COUNTERS if (advanced and split) else MAX_DEVICES
        if len(devices) > limit:
            problems.append(f"{where}: {len(devices)} devices, at most {limit}")
        if split and len(shared) > MAX_COUNTER_SETS_PER_SLICE:
            problems.append(f"{where}: {len(shared)} counter sets, at most {MAX_COUNTER_SETS_PER_SLICE}")
        total_shared = 0
        for c_index, counter_set in enumerate(shared):
            set_name = counter_set.get("name", "")
            set_where = f"{where}.sharedCounters[{c_index}] {set_name!r}"
            if not is_dns_label(set_name):
                problems.append(f"{set_where}: name is not a DNS label")
            counters = counter_set.get("counters") or {}
            total_shared += len(counters)
            if len(counters) > MAX_COUNTERS_PER_SET:
                problems.append(f"{set_where}: {len(counters)} counters, at most {MAX_COUNTERS_PER_SET}")
            values: dict[str, int] = {}
            for counter, value in counters.items():
                if not is_dns_label(counter):
                    problems.append(f"{set_where}: counter name {counter!r} is not a DNS label")
                amount = _quantity(value.get("value"), f"{set_where}.counters[{counter!r}]", problems)
                values[counter] = amount or 0
            if (pool_name, set_name) in counter_sets:
                problems.append(f"{set_where}: counter set name used twice in pool {pool_name!r}")
            counter_sets[(pool_name, set_name)] = (name, values)
        if not split and total_shared > MAX_SHARED_COUNTERS_134:
            problems.append(
                f"{where}: {total_shared} shared counters, at most {MAX_SHARED_COUNTERS_134} on 1.34"
            )
        consumed_in_slice = 0
        for d_index, device in enumerate(devices):
            device_where = f"{where}.devices[{d_index}] {device.get('name', '')!r}"
            _check_device(device_where, device, problems, tuple(kubernetes_version) >= (1, 36))
            _check_taints(device_where, device, split, problems)
            key = (pool_name, device.get("name", ""))
            if key in device_names:
                problems.append(f"{device_where}: device name also in {device_names[key]} (unique per pool)")
            device_names[key] = where
            consumed = 0
            for entry in device.get("consumesCounters") or []:
                amounts = {
                    k: parse_quantity(v["value"])
                    for k, v in (entry.get("counters") or {}).items()
                    if isinstance(v.get("value"), str)
                }
                consumed += len(amounts)
                references.append((device_where, pool_name, name, entry.get("counterSet", ""), amounts))
            consumed_in_slice += consumed
            if not split and consumed > MAX_CONSUMED_COUNTERS_PER_DEVICE_134:
                problems.append(
                    f"{device_where}: consumes {consumed} counters, at most "
                    f"{MAX_CONSUMED_COUNTERS_PER_DEVICE_134} on 1.34"
                )
        if not split and consumed_in_slice > MAX_CONSUMED_COUNTERS_PER_SLICE_134:
            problems.append(
                f"{where}: devices consume {consumed_in_slice} counters, at most "
                f"{MAX_CONSUMED_COUNTERS_PER_SLICE_134} on 1.34"
            )
    for device_where, pool_name, slice_name, set_name, amounts in references:
        found = counter_sets.get((pool_name, set_name))
        if found is None:
            problems.append(
                f"{device_where}: consumes from counter set {set_name!r}, which pool {pool_name!r} "
                "does not define"
            )
            continue
        defined_in, values = found
        if not split and defined_in != slice_name:
            problems.append(
                f"{device_where}: counter set {set_name!r} is in slice {defined_in}; on 1.34 it must be "
                "in the device's own slice"
            )
        for counter, amount in amounts.items():
            if counter not in values:
                problems.append(f"{device_where}: counter {counter!r} is not in counter set {set_name!r}")
            elif amount > values[counter]:
                problems.append(
                    f"{device_where}: consumes {amount} of {set_name}/{counter}, which has only "
                    f"{values[counter]} (the device could never be allocated)"
                )
    for pool_name, entries in pools.items():
        generations = {g for g, _ in entries}
        counts = {c for _, c in entries}
        if len(generations) > 1:
            problems.append(f"pool {pool_name!r}: slices have different generations {sorted(generations)}")
        if counts != {len(entries)}:
            problems.append(
                f"pool {pool_name!r}: resourceSliceCount {sorted(counts)} but {len(entries)} slices"
            )
    return problems


def check_slices(slices: Sequence[Mapping[str, Any]], kubernetes_version: tuple[int, int] = (1, 36)) -> None:
    """Raise SliceValidationError listing every problem."""
    problems = validate_slices(slices, kubernetes_version)
    if problems:
        raise SliceValidationError(problems)
