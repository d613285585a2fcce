"""Build the CEL `device` variable from a ResourceSlice device (`resource.k8s.io/v1` wire format).

Attributes and capacities are split by domain like Kubernetes' `parseQualifiedName`: a name without `/`
belongs to the driver's domain. Version attributes become `Semver` values (a version that does not parse is an
error that aborts evaluation, as in the scheduler); capacities become `Quantity` values (only `value` is
exposed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_gpu.cel.errors import CelEvalError
from dra_gpu.cel.quantity import Quantity, QuantityError
from dra_gpu.cel.semver import Semver, SemverError
from dra_gpu.cel.values import DeviceValue, DomainMap


def split_qualified_name(name: str, driver: str) -> tuple[str, str]:
    domain, sep, ident = name.partition("/")
    if not sep:
        return driver, name
    return domain, ident


def attribute_value(name: str, attribute: Mapping[str, Any]) -> Any:
    if "string" in attribute:
        return str(attribute["string"])
    if "bool" in attribute:
        return bool(attribute["bool"])
    if "int" in attribute:
        return int(attribute["int"])
    if "version" in attribute:
        try:
            return Semver.parse(str(attribute["version"]))
        except SemverError as error:
            raise CelEvalError(f"attribute {name}: parse semantic version: {error}") from None
    # List attributes (DRAListTypeAttributes, alpha in 1.36).
    if "strings" in attribute:
        return [str(v) for v in attribute["strings"]]
    if "ints" in attribute:
        return [int(v) for v in attribute["ints"]]
    if "bools" in attribute:
        return [bool(v) for v in attribute["bools"]]
    if "versions" in attribute:
        try:
            return [Semver.parse(str(v)) for v in attribute["versions"]]
        except SemverError as error:
            raise CelEvalError(f"attribute {name}: parse semantic version: {error}") from None
    raise CelEvalError(f"attribute {name}: unsupported attribute value")


def capacity_value(name: str, capacity: Mapping[str, Any]) -> Quantity:
    raw = capacity.get("value")
    try:
        return Quantity.parse(str(raw))
    except QuantityError as error:
        raise CelEvalError(f"capacity {name}: {error}") from None


def device_value(driver: str, device: Mapping[str, Any]) -> DeviceValue:
    """`device` is one entry of `spec.devices` of a v1 ResourceSlice."""
    attributes = DomainMap()
    for name, attribute in (device.get("attributes") or {}).items():
        domain, ident = split_qualified_name(name, driver)
        attributes.setdefault(domain, {})[ident] = attribute_value(name, attribute)
    capacity = DomainMap()
    for name, entry in (device.get("capacity") or {}).items():
        domain, ident = split_qualified_name(name, driver)
        capacity.setdefault(domain, {})[ident] = capacity_value(name, entry)
    return DeviceValue(driver, attributes, capacity, bool(device.get("allowMultipleAllocations", False)))


def raw_path_value(driver: str, device: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    """A hashable stand-in for what `path` reads in `device`, straight from the wire data (for cache keys)."""
    if not path:
        return _freeze(device)
    head = path[0]
    if head == "driver":
        return driver
    if head == "allowMultipleAllocations":
        return bool(device.get("allowMultipleAllocations", False))
    entries = device.get(head) or {}
    if len(path) == 1:
        return _freeze(entries)
    domain = path[1]
    if len(path) == 2:
        return _freeze(
            {
                name: value
                for name, value in entries.items()
                if split_qualified_name(name, driver)[0] == domain
            }
        )
    name = path[2] if domain == driver else f"{domain}/{path[2]}"
    if domain == driver and name not in entries:
        name = f"{domain}/{path[2]}"  # a driver-domain attribute may also be written fully qualified
    value = entries.get(name)
    return _freeze(value) if value is not None else None


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value
