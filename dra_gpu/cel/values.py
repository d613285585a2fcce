"""CEL runtime values as plain Python objects, and the operations every part of the evaluator shares.

Representation: bool -> bool, int -> int, uint -> `Uint` (an int subclass), double -> float, string -> str,
bytes -> bytes, list -> list/tuple, map -> dict, null -> None, plus `Quantity`, `Semver`, `IPAddr`, `CIDR`,
`URL`, `Timestamp`, `Duration`, `NamedFormat`, `CelType` and the `DeviceValue` object. Plain Python values
keep evaluation fast; `bool` must always be tested before `int`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dra_gpu.cel.errors import CelEvalError
from dra_gpu.cel.formats import NamedFormat
from dra_gpu.cel.network import CIDR, IPAddr
from dra_gpu.cel.quantity import Quantity
from dra_gpu.cel.semver import Semver
from dra_gpu.cel.temporal import Duration, Timestamp
from dra_gpu.cel.urls import URL

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1


class Uint(int):
    """A CEL uint (Python has no unsigned int type)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{int(self)}u"


class CelType:
    """A type value, as returned by `type(x)` or named by `int`, `string`, ..."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CelType) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("type", self.name))

    def __repr__(self) -> str:
        return self.name


class CelOptional:
    """An optional value (`optional.of(x)`, `optional.none()`, the result of `x.?f` and `x[?k]`)."""

    __slots__ = ("present", "value")

    def __init__(self, value: Any = None, present: bool = False):
        self.value = value
        self.present = present

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CelOptional) or self.present != other.present:
            return False
        return not self.present or cel_equal(self.value, other.value)

    def __hash__(self) -> int:
        return hash(("optional", self.present))

    def __repr__(self) -> str:
        return f"optional.of({self.value!r})" if self.present else "optional.none()"


NONE = CelOptional()


class DomainMap(dict[str, Any]):
    """`device.attributes` / `device.capacity`: looking up an unknown domain gives an empty map, not an
    error.

    Kubernetes wraps these maps so that `Find` returns an empty map for a missing key; `in` (Contains)
    still only sees the domains that exist.
    """

    __slots__ = ()

    def lookup(self, key: Any) -> Any:
        value = self.get(key) if isinstance(key, str) else None
        return EMPTY_MAP if value is None else value


EMPTY_MAP: Mapping[str, Any] = {}


class DeviceValue:
    """The `device` variable (`kubernetes.DRADevice`)."""

    __slots__ = ("allowMultipleAllocations", "attributes", "capacity", "driver")

    FIELDS = ("driver", "attributes", "capacity", "allowMultipleAllocations")

    def __init__(self, driver: str, attributes: DomainMap, capacity: DomainMap, allow_multiple: bool = False):
        self.driver = driver
        self.attributes = attributes
        self.capacity = capacity
        self.allowMultipleAllocations = allow_multiple


def type_name(value: Any) -> str:
    if value is None:
        return "null_type"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Uint):
        return "uint"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes):
        return "bytes"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, dict):
        return "map"
    if isinstance(value, Quantity):
        return "kubernetes.Quantity"
    if isinstance(value, Semver):
        return "kubernetes.Semver"
    if isinstance(value, Timestamp):
        return "google.protobuf.Timestamp"
    if isinstance(value, Duration):
        return "google.protobuf.Duration"
    if isinstance(value, IPAddr):
        return "net.IP"
    if isinstance(value, CIDR):
        return "net.CIDR"
    if isinstance(value, URL):
        return "kubernetes.URL"
    if isinstance(value, NamedFormat):
        return "kubernetes.NamedFormat"
    if isinstance(value, CelType):
        return "type"
    if isinstance(value, DeviceValue):
        return "kubernetes.DRADevice"
    if isinstance(value, CelOptional):
        return "optional_type"
    return type(value).__name__


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def no_overload(function: str, *args: Any) -> CelEvalError:
    kinds = ", ".join(type_name(a) for a in args)
    return CelEvalError(f"no such overload: {function}({kinds})")


def cel_equal(a: Any, b: Any) -> bool:
    """Heterogeneous equality: values of different types are unequal, numbers compare by value."""
    if is_number(a) and is_number(b):
        return bool(a == b)  # Python compares int and float exactly; NaN != NaN
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if isinstance(a, list | tuple):
        if not isinstance(b, list | tuple) or len(a) != len(b):
            return False
        return all(cel_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        if not isinstance(b, dict) or len(a) != len(b):
            return False
        for key, value in a.items():
            found, other = map_find(b, key)
            if not found or not cel_equal(value, other):
                return False
        return True
    if type_name(a) != type_name(b):
        return False
    return bool(a == b)


def map_find(mapping: Mapping[Any, Any], key: Any) -> tuple[bool, Any]:
    """Look a key up with CEL key equality (1 == 1u == 1.0 as map keys, true is not 1)."""
    if isinstance(key, str):
        if key in mapping:
            return True, mapping[key]
        return False, None
    if isinstance(key, bool):
        for k, v in mapping.items():
            if isinstance(k, bool) and k == key:
                return True, v
        return False, None
    if is_number(key):
        for k, v in mapping.items():
            if is_number(k) and k == key:
                return True, v
    return False, None


def compare(a: Any, b: Any, op: str) -> int:
    """-1/0/1 for the ordering operators; numbers compare across int, uint and double."""
    if is_number(a) and is_number(b):
        if (isinstance(a, float) and math.isnan(a)) or (isinstance(b, float) and math.isnan(b)):
            raise NanCompareError()
        return int((a > b) - (a < b))
    if isinstance(a, bool) and isinstance(b, bool):
        return int(a) - int(b)
    if isinstance(a, str) and isinstance(b, str):
        return (a > b) - (a < b)
    if isinstance(a, bytes) and isinstance(b, bytes):
        return (a > b) - (a < b)
    if (isinstance(a, Timestamp) and isinstance(b, Timestamp)) or (
        isinstance(a, Duration) and isinstance(b, Duration)
    ):
        return (a.nanos > b.nanos) - (a.nanos < b.nanos)
    raise no_overload(op, a, b)


class NanCompareError(Exception):
    """Any ordering with NaN is false."""


def ordering(a: Any, b: Any, op: str) -> bool:
    try:
        result = compare(a, b, op)
    except NanCompareError:
        return False
    if op == "_<_":
        return result < 0
    if op == "_<=_":
        return result <= 0
    if op == "_>_":
        return result > 0
    return result >= 0


def check_int(value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise CelEvalError("integer overflow")
    return value


def check_uint(value: int) -> Uint:
    if not 0 <= value <= UINT64_MAX:
        raise CelEvalError("unsigned integer overflow")
    return Uint(value)


def to_display(value: Any) -> str:
    """A CEL-like rendering of a value for messages and the conformance table."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(to_display(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{to_display(k)}: {to_display(v)}" for k, v in value.items()) + "}"
    return repr(value)
