"""Data the allocator works on, parsed from wire-format (`resource.k8s.io/v1`) objects.

Quantities are Decimals. Parsing of a device's counters and capacities is lazy because a 1,000-node inventory
has hundreds of thousands of devices and most of them are never considered for allocation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from dra_gpu.cel.device import device_value
from dra_gpu.cel.environment import CompiledExpression
from dra_gpu.cel.quantity import QuantityError, parse_quantity_strict
from dra_gpu.cel.values import DeviceValue

DeviceId = tuple[str, str, str]  # (driver, pool, device)


class InputError(ValueError):
    """Bad input object: the message names the object and field."""


def quantity_of(raw: Any, where: str) -> Decimal:
    try:
        return parse_quantity_strict(str(raw))
    except QuantityError as error:
        raise InputError(f"{where}: {error}") from None


class Candidate:
    """One device of a ResourceSlice, in the scheduler's order (pool, slice name, list position).

    A plain slots class: a thousand-node inventory creates hundreds of thousands of these.
    """

    __slots__ = (
        "_capacity",
        "_cel",
        "_consumes",
        "data",
        "driver",
        "id",
        "label",
        "name",
        "node_name",
        "pool",
        "slice_name",
    )

    def __init__(
        self,
        driver: str,
        pool: str,
        slice_name: str,
        name: str,
        data: Mapping[str, Any],
        node_name: str | None,
    ):
        self.driver = driver
        self.pool = pool
        self.slice_name = slice_name
        self.name = name
        self.data = data
        self.node_name = node_name
        self.id: DeviceId = (driver, pool, name)
        self.label = f"{pool}/{name}"
        self._cel: DeviceValue | None = None
        self._capacity: dict[str, Decimal] | None = None
        self._consumes: tuple[tuple[str, dict[str, Decimal]], ...] | None = None

    def __repr__(self) -> str:
        return f"Candidate({self.driver}/{self.label})"

    @property
    def allow_multiple(self) -> bool:
        return bool(self.data.get("allowMultipleAllocations", False))

    def cel(self) -> DeviceValue:
        if self._cel is None:
            self._cel = device_value(self.driver, self.data)
        return self._cel

    def capacity(self) -> dict[str, Decimal]:
        """Capacity values by the name as published (qualified or not)."""
        if self._capacity is None:
            self._capacity = {
                name: quantity_of((entry or {}).get("value"), f"device {self.label} capacity {name}")
                for name, entry in (self.data.get("capacity") or {}).items()
            }
        return self._capacity

    def consumes(self) -> tuple[tuple[str, dict[str, Decimal]], ...]:
        if self._consumes is None:
            out = []
            for entry in self.data.get("consumesCounters") or ():
                counters = {
                    name: quantity_of(
                        (value or {}).get("value"), f"device {self.label} consumesCounters {name}"
                    )
                    for name, value in (entry.get("counters") or {}).items()
                }
                out.append((str(entry.get("counterSet", "")), counters))
            self._consumes = tuple(out)
        return self._consumes


@dataclass
class Pool:
    driver: str
    name: str
    generation: int
    slice_count: int
    slices: list[Mapping[str, Any]]
    candidates: list[Candidate]
    counter_sets: dict[str, dict[str, Decimal]]
    incomplete: bool = False
    invalid_reason: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.driver, self.name)


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str


@dataclass
class DeviceRequestSpec:
    """An `exactly` request or one `firstAvailable` subrequest."""

    name: str  # "req" or "req/sub"
    class_name: str
    selectors: list[CompiledExpression]
    all_devices: bool
    count: int
    admin_access: bool
    tolerations: list[Toleration]
    capacity_requests: dict[str, Decimal]
    raw_tolerations: list[Mapping[str, Any]]
    class_selectors: list[CompiledExpression] = field(default_factory=list)


@dataclass
class Request:
    name: str
    alternatives: list[DeviceRequestSpec]  # one entry for `exactly`, the subrequests for `firstAvailable`
    first_available: bool


@dataclass
class Constraint:
    requests: list[str]  # empty: all requests
    match_attribute: str | None
    distinct_attribute: str | None


@dataclass
class ClaimSpec:
    namespace: str
    name: str
    requests: list[Request]
    constraints: list[Constraint]
    configs: list[Mapping[str, Any]]
    source: str = ""  # where it came from (file, template)


@dataclass(slots=True)
class Rejection:
    device: str  # "<pool>/<device>"
    reason: str
    kind: str  # selector, cel-error, taint, capacity, allocated, counter, pool, constraint


@dataclass
class AllocatedDevice:
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    share_id: str | None = None
    consumed_capacity: dict[str, Decimal] | None = None
    tolerations: list[Mapping[str, Any]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.pool}/{self.device}"
