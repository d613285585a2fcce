"""The function libraries of the Kubernetes CEL environment that DRA selectors run in.

Each function has static overloads (for the compile-time check) and one runtime implementation that dispatches
on the Python types of its arguments. For a member call `x.f(a)` the implementation receives `(x, a)`; the
overload table says whether `f` may be called as a member, as a global, or both (`sign` is global only, as in
Kubernetes).

Libraries: CEL standard functions, ext.Strings v2, Kubernetes lists / regex / quantity, the semver library,
ext.Sets, ext.Lists v3 (`sortBy` is a macro, see syntax.py), optional types (with `first`/`last`/`unwrap`),
and Kubernetes IP / CIDR / URLs / Format (implemented in kubernetes_libraries.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import re2  # type: ignore[import-untyped]

from dra_gpu.cel import kubernetes_libraries as kube
from dra_gpu.cel.errors import CelEvalError
from dra_gpu.cel.formats import FORMATS
from dra_gpu.cel.network import CIDR, IPAddr
from dra_gpu.cel.quantity import Quantity, QuantityError
from dra_gpu.cel.semver import Semver, SemverError
from dra_gpu.cel.temporal import NANOS, Duration, TemporalError, Timestamp, parse_duration, parse_timestamp
from dra_gpu.cel.values import (
    INT64_MAX,
    INT64_MIN,
    NONE,
    UINT64_MAX,
    CelOptional,
    CelType,
    DeviceValue,
    NanCompareError,
    Uint,
    cel_equal,
    check_int,
    compare,
    is_number,
    no_overload,
    type_name,
)


@dataclass(frozen=True)
class Overload:
    member: bool
    params: tuple[str, ...]  # static types; for a member overload params[0] is the receiver
    result: str


@dataclass(frozen=True)
class Function:
    name: str
    overloads: tuple[Overload, ...]
    impl: Callable[..., Any]


def _m(*types: str) -> Overload:
    """Member overload: receiver and args..., result last."""
    return Overload(True, tuple(types[:-1]), types[-1])


def _g(*types: str) -> Overload:
    return Overload(False, tuple(types[:-1]), types[-1])


# ----------------------------------------------------------------------------------------------------
# Regular expressions (RE2, like cel-go)

_RE_OPTIONS = re2.Options()
_RE_OPTIONS.log_errors = False
_regex_cache: dict[str, Any] = {}


def compile_regex(pattern: str) -> Any:
    compiled = _regex_cache.get(pattern)
    if compiled is None:
        try:
            compiled = re2.compile(pattern, _RE_OPTIONS)
        except re2.error as error:
            detail = error.args[0].decode() if error.args and isinstance(error.args[0], bytes) else str(error)
            raise CelEvalError(f"error parsing regexp: {detail}: `{pattern}`") from None  # Go's wording
        _regex_cache[pattern] = compiled
    return compiled


def _matches(text: Any, pattern: Any) -> bool:
    if not isinstance(text, str) or not isinstance(pattern, str):
        raise no_overload("matches", text, pattern)
    return compile_regex(pattern).search(text) is not None


def _find(text: Any, pattern: Any) -> str:
    if not isinstance(text, str) or not isinstance(pattern, str):
        raise no_overload("find", text, pattern)
    match = compile_regex(pattern).search(text)
    return match.group(0) if match else ""


def _find_all(text: Any, pattern: Any, limit: Any = -1) -> list[str]:
    if not isinstance(text, str) or not isinstance(pattern, str) or not _is_int(limit):
        raise no_overload("findAll", text, pattern, limit)
    if limit == 0:
        return []
    found = [m.group(0) for m in compile_regex(pattern).finditer(text)]
    return found if limit < 0 else found[:limit]


# ----------------------------------------------------------------------------------------------------
# Standard functions


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool | Uint)


def _size(value: Any) -> int:
    if isinstance(value, str | bytes | list | tuple | dict):
        return len(value)
    raise no_overload("size", value)


def _contains(text: Any, sub: Any) -> bool:
    if isinstance(text, str) and isinstance(sub, str):
        return sub in text
    raise no_overload("contains", text, sub)


def _starts_with(text: Any, prefix: Any) -> bool:
    if isinstance(text, str) and isinstance(prefix, str):
        return text.startswith(prefix)
    raise no_overload("startsWith", text, prefix)


def _ends_with(text: Any, suffix: Any) -> bool:
    if isinstance(text, str) and isinstance(suffix, str):
        return text.endswith(suffix)
    raise no_overload("endsWith", text, suffix)


def _to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise no_overload("int", value)
    if isinstance(value, Timestamp):
        return value.nanos // NANOS  # seconds since the epoch
    if isinstance(value, int):
        return check_int(int(value))
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value) or not (-(2.0**63) <= value < 2.0**63):
            raise CelEvalError("int() range error converting double")
        return int(value)
    if isinstance(value, str):
        try:
            return check_int(int(value, 10))
        except ValueError:
            raise CelEvalError(f"int() cannot convert string {value!r}") from None
    raise no_overload("int", value)


def _to_uint(value: Any) -> Uint:
    if isinstance(value, bool):
        raise no_overload("uint", value)
    if isinstance(value, int):
        if not 0 <= value <= UINT64_MAX:
            raise CelEvalError("uint() range error")
        return Uint(value)
    if isinstance(value, float):
        if math.isnan(value) or not (0 <= value < 2.0**64):
            raise CelEvalError("uint() range error converting double")
        return Uint(int(value))
    if isinstance(value, str):
        try:
            parsed = int(value, 10)
        except ValueError:
            raise CelEvalError(f"uint() cannot convert string {value!r}") from None
        if not 0 <= parsed <= UINT64_MAX:
            raise CelEvalError("uint() range error")
        return Uint(parsed)
    raise no_overload("uint", value)


def _to_double(value: Any) -> float:
    if isinstance(value, bool):
        raise no_overload("double", value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise CelEvalError(f"double() cannot convert string {value!r}") from None
    raise no_overload("double", value)


def format_double(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    text = repr(value)
    return text


def _to_string(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return format_double(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise CelEvalError("string() invalid UTF-8 in bytes") from None
    if isinstance(value, IPAddr | CIDR | Timestamp | Duration):
        return str(value)
    raise no_overload("string", value)


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        if value in ("true", "True", "TRUE", "t", "1"):
            return True
        if value in ("false", "False", "FALSE", "f", "0"):
            return False
        raise CelEvalError(f"bool() cannot convert string {value!r}")
    raise no_overload("bool", value)


def _to_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise no_overload("bytes", value)


def _type_of(value: Any) -> CelType:
    return CelType(type_name(value))


def _dyn(value: Any) -> Any:
    return value


# ----------------------------------------------------------------------------------------------------
# ext.Strings (version 2)


def _need_str(function: str, *values: Any) -> None:
    for value in values:
        if not isinstance(value, str):
            raise no_overload(function, *values)


def _char_at(text: Any, index: Any) -> str:
    if not isinstance(text, str) or not _is_int(index):
        raise no_overload("charAt", text, index)
    if index < 0 or index > len(text):
        raise CelEvalError(f"index out of range: {index}")
    return text[index : index + 1]


def _index_of(target: Any, item: Any, start: Any = None) -> int:
    if isinstance(target, list | tuple):
        if start is not None:
            raise no_overload("indexOf", target, item, start)
        for position, element in enumerate(target):
            if cel_equal(element, item):
                return position
        return -1
    if not isinstance(target, str) or not isinstance(item, str) or (start is not None and not _is_int(start)):
        raise no_overload("indexOf", target, item)
    if start is None:
        return target.find(item)
    if item == "":
        return int(start)
    if start < 0 or start >= len(target):
        raise CelEvalError(f"index out of range: {start}")
    return target.find(item, start)


def _last_index_of(target: Any, item: Any, last: Any = None) -> int:
    if isinstance(target, list | tuple):
        if last is not None:
            raise no_overload("lastIndexOf", target, item, last)
        for position in range(len(target) - 1, -1, -1):
            if cel_equal(target[position], item):
                return position
        return -1
    if not isinstance(target, str) or not isinstance(item, str) or (last is not None and not _is_int(last)):
        raise no_overload("lastIndexOf", target, item)
    if last is None:
        return target.rfind(item)
    if item == "":
        return int(last)
    if last < 0 or last >= len(target):
        raise CelEvalError(f"index out of range: {last}")
    return target.rfind(item, 0, last + len(item))


def _ascii_case(function: str, upper: bool) -> Callable[[Any], str]:
    def convert(text: Any) -> str:
        _need_str(function, text)
        table = _UPPER if upper else _LOWER
        return str(text).translate(table)

    return convert


_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}
_UPPER = {c: c - 32 for c in range(ord("a"), ord("z") + 1)}


def _replace(text: Any, old: Any, new: Any, count: Any = -1) -> str:
    if not (isinstance(text, str) and isinstance(old, str) and isinstance(new, str) and _is_int(count)):
        raise no_overload("replace", text, old, new, count)
    return text.replace(old, new, count if count >= 0 else -1)


def _split(text: Any, separator: Any, limit: Any = -1) -> list[str]:
    if not (isinstance(text, str) and isinstance(separator, str) and _is_int(limit)):
        raise no_overload("split", text, separator, limit)
    if limit == 0:
        return []
    if separator == "":
        chars = list(text)
        if limit > 0 and len(chars) > limit:
            return [*chars[: limit - 1], "".join(chars[limit - 1 :])]
        return chars
    if limit < 0:
        return text.split(separator)
    return text.split(separator, limit - 1)


def _substring(text: Any, start: Any, end: Any = None) -> str:
    if not isinstance(text, str) or not _is_int(start) or (end is not None and not _is_int(end)):
        raise no_overload("substring", text, start, end)
    stop = len(text) if end is None else end
    if start < 0 or start > len(text):
        raise CelEvalError(f"index out of range: {start}")
    if stop < 0 or stop > len(text):
        raise CelEvalError(f"index out of range: {stop}")
    if start > stop:
        raise CelEvalError(f"invalid substring range. start: {start}, end: {stop}")
    return text[start:stop]


def _trim(text: Any) -> str:
    _need_str("trim", text)
    return str(text).strip()


def _join(items: Any, separator: Any = "") -> str:
    if not isinstance(items, list | tuple) or not isinstance(separator, str):
        raise no_overload("join", items, separator)
    for item in items:
        if not isinstance(item, str):
            raise no_overload("join", items, separator)
    return separator.join(items)


_QUOTE_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


def _quote(text: Any) -> str:
    _need_str("strings.quote", text)
    return '"' + "".join(_QUOTE_ESCAPES.get(c, c) for c in str(text)) + '"'


def _format(template: Any, args: Any) -> str:
    if not isinstance(template, str) or not isinstance(args, list | tuple):
        raise no_overload("format", template, args)
    out: list[str] = []
    position = 0
    index = 0
    while index < len(template):
        char = template[index]
        if char != "%":
            out.append(char)
            index += 1
            continue
        index += 1
        if index >= len(template):
            raise CelEvalError("format: unexpected end of format string")
        if template[index] == "%":
            out.append("%")
            index += 1
            continue
        precision: int | None = None
        if template[index] == ".":
            digits_start = index + 1
            index = digits_start
            while index < len(template) and template[index].isdigit():
                index += 1
            precision = int(template[digits_start:index] or "0")
            if index >= len(template):
                raise CelEvalError("format: unexpected end of format string")
        verb = template[index]
        index += 1
        if position >= len(args):
            raise CelEvalError(f"format: index {position} out of range")
        out.append(_format_one(verb, args[position], precision))
        position += 1
    return "".join(out)


def _format_one(verb: str, value: Any, precision: int | None) -> str:
    if verb == "s":
        return _format_string(value)
    if verb == "d":
        if isinstance(value, bool) or not isinstance(value, int):
            raise CelEvalError(
                f"format: decimal clause can only be used on integers, was given {type_name(value)}"
            )
        return str(int(value))
    if verb in ("f", "e"):
        if not is_number(value):
            raise CelEvalError(
                f"format: fixed-point clause can only be used on doubles, was given {type_name(value)}"
            )
        return f"{float(value):.{6 if precision is None else precision}{verb}}"
    if verb in ("x", "X", "o", "b"):
        if isinstance(value, bool) or not isinstance(value, int | str | bytes):
            raise CelEvalError(f"format: only integers, byte buffers and strings can be formatted as {verb}")
        if isinstance(value, int):
            spec = {"x": "x", "X": "X", "o": "o", "b": "b"}[verb]
            return format(int(value), spec)
        data = value.encode() if isinstance(value, str) else value
        return data.hex() if verb == "x" else data.hex().upper()
    raise CelEvalError(f"format: could not parse formatting clause: unrecognized formatting clause {verb!r}")


def _format_string(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_format_string(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_format_string(k)}: {_format_string(v)}" for k, v in value.items()) + "}"
    if value is None:
        return "null"
    if isinstance(value, CelType):
        return value.name
    return _to_string(value)


# ----------------------------------------------------------------------------------------------------
# Kubernetes lists library


def _need_list(function: str, value: Any) -> Sequence[Any]:
    if not isinstance(value, list | tuple):
        raise no_overload(function, value)
    return value


def _order(a: Any, b: Any, function: str) -> int:
    try:
        return compare(a, b, function)
    except NanCompareError:
        raise CelEvalError("NaN values cannot be ordered") from None


def _is_sorted(items: Any) -> bool:
    values = _need_list("isSorted", items)
    return all(_order(values[i], values[i + 1], "isSorted") <= 0 for i in range(len(values) - 1))


def _sum(items: Any) -> Any:
    values = _need_list("sum", items)
    if not values:
        return 0
    total: Any = values[0]
    for value in values[1:]:
        total = _add_numbers(total, value, "sum")
    if not is_number(total):
        raise no_overload("sum", items)
    return total


def _add_numbers(a: Any, b: Any, function: str) -> Any:
    if isinstance(a, float) and isinstance(b, float):
        return a + b
    if isinstance(a, Uint) and isinstance(b, Uint):
        result = int(a) + int(b)
        if result > UINT64_MAX:
            raise CelEvalError("unsigned integer overflow")
        return Uint(result)
    if _is_int(a) and _is_int(b):
        return check_int(a + b)
    raise no_overload(function, a, b)


def _extreme(function: str, pick_max: bool) -> Callable[[Any], Any]:
    def pick(items: Any) -> Any:
        values = _need_list(function, items)
        if not values:
            raise CelEvalError(f"{function} called on empty list")
        best = values[0]
        for value in values[1:]:
            order = _order(value, best, function)
            if (order > 0 and pick_max) or (order < 0 and not pick_max):
                best = value
        return best

    return pick


# ----------------------------------------------------------------------------------------------------
# ext.Lists (v3, without the optional-returning first/last)


def _slice(items: Any, start: Any, end: Any) -> list[Any]:
    values = _need_list("slice", items)
    if not _is_int(start) or not _is_int(end):
        raise no_overload("slice", items, start, end)
    if start < 0 or end < 0:
        raise CelEvalError(f"cannot slice({start}, {end}), negative indexes not supported")
    if start > end:
        raise CelEvalError(
            f"cannot slice({start}, {end}), start index must be less than or equal to end index"
        )
    if end > len(values):
        raise CelEvalError(f"cannot slice({start}, {end}), list is length {len(values)}")
    return list(values[start:end])


def _flatten(items: Any, depth: Any = 1) -> list[Any]:
    values = _need_list("flatten", items)
    if not _is_int(depth):
        raise no_overload("flatten", items, depth)
    if depth < 0:
        raise CelEvalError("level must be non-negative")
    out: list[Any] = []
    for value in values:
        if isinstance(value, list | tuple) and depth > 0:
            out.extend(_flatten(value, depth - 1))
        else:
            out.append(value)
    return out


def _distinct(items: Any) -> list[Any]:
    out: list[Any] = []
    for value in _need_list("distinct", items):
        if not any(cel_equal(value, seen) for seen in out):
            out.append(value)
    return out


def _reverse(value: Any) -> Any:
    # Only lists: the string overload is ext.Strings v3, and Kubernetes uses ext.Strings v2.
    return list(reversed(_need_list("reverse", value)))


def _sort(items: Any) -> list[Any]:
    values = _need_list("sort", items)
    return _sort_by_keys(values, values)


_COMPARABLE = (
    "int",
    "uint",
    "double",
    "bool",
    "string",
    "bytes",
    "google.protobuf.Timestamp",
    "google.protobuf.Duration",
)


def _sort_by_keys(items: Any, keys: Any) -> list[Any]:
    """cel-go's `@sortByAssociatedKeys` (behind `sort()` and the `sortBy` macro): order `items` by `keys`,
    which must all have one comparable type (`[1, 2.0].sort()` is an error, unlike `1 < 2.0`)."""
    values = _need_list("@sortByAssociatedKeys", items)
    order = _need_list("@sortByAssociatedKeys", keys)
    if len(values) != len(order):
        raise CelEvalError(
            "@sortByAssociatedKeys() expected a list of the same size as the associated keys list, "
            f"but got {len(values)} and {len(order)} elements respectively"
        )
    if not values:
        return []
    kind = type_name(order[0])
    if kind not in _COMPARABLE:
        raise CelEvalError("list elements must be comparable")
    if any(type_name(key) != kind for key in order):
        raise CelEvalError("list elements must have the same type")

    def by_key(i: int, j: int) -> int:
        try:
            return compare(order[i], order[j], "sort")
        except NanCompareError:
            return 0  # cel-go: a NaN is never "less than", so it stays where the sort leaves it

    positions = sorted(range(len(values)), key=functools.cmp_to_key(by_key))
    return [values[i] for i in positions]


def _first(items: Any) -> CelOptional:
    values = _need_list("first", items)
    return CelOptional(values[0], True) if values else NONE


def _last(items: Any) -> CelOptional:
    values = _need_list("last", items)
    return CelOptional(values[-1], True) if values else NONE


def _unwrap(items: Any) -> list[Any]:
    """`optional.unwrap(l)` / `l.unwrapOpt()`: the values of the present optionals."""
    out: list[Any] = []
    for value in _need_list("optional.unwrap", items):
        if not isinstance(value, CelOptional):
            raise no_overload("optional.unwrap", value)
        if value.present:
            out.append(value.value)
    return out


def _lists_range(end: Any) -> list[int]:
    if not _is_int(end):
        raise no_overload("lists.range", end)
    return list(range(max(0, end)))


# ----------------------------------------------------------------------------------------------------
# DRA list attributes (DRAListTypeAttributes, alpha in 1.36)


def _includes(target: Any, item: Any) -> bool:
    """`x.includes(y)`: list membership, or equality for a single value. Like Kubernetes it looks at the
    first 48 list items only (ResourceSliceMaxAttributeValuesPerDevice).
    """
    if isinstance(target, list | tuple):
        return any(cel_equal(element, item) for element in target[:48])
    return cel_equal(target, item)


# ----------------------------------------------------------------------------------------------------
# Optional types (cel-go OptionalTypes)


def _need_optional(function: str, value: Any) -> CelOptional:
    if not isinstance(value, CelOptional):
        raise no_overload(function, value)
    return value


def _has_value(optional: Any) -> bool:
    return _need_optional("hasValue", optional).present


def _value(optional: Any) -> Any:
    checked = _need_optional("value", optional)
    if not checked.present:
        raise CelEvalError("optional.none() dereference")
    return checked.value


def _or_value(optional: Any, default: Any) -> Any:
    checked = _need_optional("orValue", optional)
    return checked.value if checked.present else default


def _or(optional: Any, other: Any) -> Any:
    checked = _need_optional("or", optional)
    _need_optional("or", other)
    return checked if checked.present else other


def _optional_of(value: Any) -> CelOptional:
    return CelOptional(value, True)


def _optional_none() -> CelOptional:
    return NONE


def _is_zero(value: Any) -> bool:
    if value is None or value is False:
        return True
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value == 0
    if isinstance(value, str | bytes | list | tuple | dict):
        return len(value) == 0
    return False


def _optional_of_non_zero(value: Any) -> CelOptional:
    return NONE if _is_zero(value) else CelOptional(value, True)


# ----------------------------------------------------------------------------------------------------
# ext.Sets


def _contains_all(function: str, container: Any, items: Any) -> bool:
    first = _need_list(function, container)
    second = _need_list(function, items)
    return all(any(cel_equal(item, element) for element in first) for item in second)


def _sets_contains(container: Any, items: Any) -> bool:
    return _contains_all("sets.contains", container, items)


def _sets_equivalent(a: Any, b: Any) -> bool:
    return _contains_all("sets.equivalent", a, b) and _contains_all("sets.equivalent", b, a)


def _sets_intersects(a: Any, b: Any) -> bool:
    first = _need_list("sets.intersects", a)
    second = _need_list("sets.intersects", b)
    return any(any(cel_equal(x, y) for y in second) for x in first)


# ----------------------------------------------------------------------------------------------------
# Quantity and semver (Kubernetes libraries); compareTo / isLessThan / isGreaterThan serve both types


def _quantity(text: Any) -> Quantity:
    if not isinstance(text, str):
        raise no_overload("quantity", text)
    try:
        return Quantity.parse(text)
    except QuantityError as error:
        raise CelEvalError(str(error)) from None


def _is_quantity(text: Any) -> bool:
    if not isinstance(text, str):
        raise no_overload("isQuantity", text)
    try:
        Quantity.parse(text)
    except QuantityError:
        return False
    return True


def _semver(text: Any, normalize: Any = False) -> Semver:
    if not isinstance(text, str) or not isinstance(normalize, bool):
        raise no_overload("semver", text, normalize)
    try:
        return Semver.parse(text, normalize)
    except SemverError as error:
        raise CelEvalError(str(error)) from None


def _is_semver(text: Any, normalize: Any = False) -> bool:
    if not isinstance(text, str) or not isinstance(normalize, bool):
        raise no_overload("isSemver", text, normalize)
    try:
        Semver.parse(text, normalize)
    except SemverError:
        return False
    return True


def _ordered_pair(function: str, a: Any, b: Any) -> int:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return a.compare(b)
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a.compare(b)
    raise no_overload(function, a, b)


def _compare_to(a: Any, b: Any) -> int:
    return _ordered_pair("compareTo", a, b)


def _is_less_than(a: Any, b: Any) -> bool:
    return _ordered_pair("isLessThan", a, b) < 0


def _is_greater_than(a: Any, b: Any) -> bool:
    return _ordered_pair("isGreaterThan", a, b) > 0


def _quantity_arith(function: str, subtract: bool) -> Callable[[Any, Any], Quantity]:
    def apply(q: Any, other: Any) -> Quantity:
        if not isinstance(q, Quantity):
            raise no_overload(function, q, other)
        if isinstance(other, Quantity):
            operand = other.value
        elif _is_int(other):
            operand = Decimal(other)
        else:
            raise no_overload(function, q, other)
        return Quantity(q.value - operand if subtract else q.value + operand)

    return apply


def _sign(q: Any) -> int:
    if not isinstance(q, Quantity):
        raise no_overload("sign", q)
    return q.sign()


def _is_integer(q: Any) -> bool:
    if not isinstance(q, Quantity):
        raise no_overload("isInteger", q)
    return q.as_int64() is not None


def _as_integer(q: Any) -> int:
    if not isinstance(q, Quantity):
        raise no_overload("asInteger", q)
    value = q.as_int64()
    if value is None:
        raise CelEvalError("cannot convert value to integer")
    return value


def _as_approximate_float(q: Any) -> float:
    if not isinstance(q, Quantity):
        raise no_overload("asApproximateFloat", q)
    return float(q.value)


def _semver_part(function: str) -> Callable[[Any], int]:
    def part(v: Any) -> int:
        if not isinstance(v, Semver):
            raise no_overload(function, v)
        value = int(getattr(v, function))
        return value if value <= INT64_MAX else INT64_MIN + (value - INT64_MAX - 1)

    return part


# ----------------------------------------------------------------------------------------------------
# Timestamps and durations (see temporal.py)


def _to_timestamp(value: Any) -> Timestamp:
    try:
        if isinstance(value, Timestamp):
            return value
        if isinstance(value, str):
            return parse_timestamp(value)
        if _is_int(value):
            return Timestamp(value * NANOS)
    except TemporalError as error:
        raise CelEvalError(str(error)) from None
    raise no_overload("timestamp", value)


def _to_duration(value: Any) -> Duration:
    if isinstance(value, Duration):
        return value
    if not isinstance(value, str):
        raise no_overload("duration", value)
    try:
        return parse_duration(value)
    except TemporalError:
        # cel-go reports the failed conversion, not Go's parse detail
        raise CelEvalError("type conversion error from 'string' to 'google.protobuf.Duration'") from None


_TIMESTAMP_GETTERS: dict[str, Callable[[Any, int], int]] = {
    "getFullYear": lambda wall, nanos: int(wall.year),
    "getMonth": lambda wall, nanos: int(wall.month) - 1,
    "getDayOfYear": lambda wall, nanos: int(wall.timetuple().tm_yday) - 1,
    "getDayOfMonth": lambda wall, nanos: int(wall.day) - 1,
    "getDate": lambda wall, nanos: int(wall.day),
    "getDayOfWeek": lambda wall, nanos: (int(wall.weekday()) + 1) % 7,  # Sunday is 0
    "getHours": lambda wall, nanos: int(wall.hour),
    "getMinutes": lambda wall, nanos: int(wall.minute),
    "getSeconds": lambda wall, nanos: int(wall.second),
    "getMilliseconds": lambda wall, nanos: nanos // 1_000_000,
}
# Duration getters are totals, truncated toward zero (Go's d.Hours(), d.Minutes(), ...).
_DURATION_GETTERS: dict[str, int] = {
    "getHours": 3600 * NANOS,
    "getMinutes": 60 * NANOS,
    "getSeconds": NANOS,
    "getMilliseconds": 1_000_000,
}


def _time_getter(name: str) -> Callable[..., int]:
    def get(value: Any, zone: Any = None) -> int:
        if isinstance(value, Duration) and zone is None and name in _DURATION_GETTERS:
            return _truncate(value.nanos, _DURATION_GETTERS[name])
        if not isinstance(value, Timestamp) or not (zone is None or isinstance(zone, str)):
            raise no_overload(name, value, *(() if zone is None else (zone,)))
        try:
            wall, nanos = value.local(zone)
        except TemporalError as error:
            raise CelEvalError(str(error)) from None
        return _TIMESTAMP_GETTERS[name](wall, nanos)

    return get


def _truncate(nanos: int, unit: int) -> int:
    quotient = abs(nanos) // unit
    return quotient if nanos >= 0 else -quotient


# ----------------------------------------------------------------------------------------------------
# The table


def _functions() -> dict[str, Function]:
    table: list[Function] = [
        # standard
        Function(
            "size",
            (
                _g("string", "int"),
                _g("bytes", "int"),
                _g("list", "int"),
                _g("map", "int"),
                _m("string", "int"),
                _m("bytes", "int"),
                _m("list", "int"),
                _m("map", "int"),
            ),
            _size,
        ),
        Function("matches", (_g("string", "string", "bool"), _m("string", "string", "bool")), _matches),
        Function("contains", (_m("string", "string", "bool"),), _contains),
        Function("startsWith", (_m("string", "string", "bool"),), _starts_with),
        Function("endsWith", (_m("string", "string", "bool"),), _ends_with),
        Function(
            "int",
            (
                _g("int", "int"),
                _g("uint", "int"),
                _g("double", "int"),
                _g("string", "int"),
                _g("timestamp", "int"),
            ),
            _to_int,
        ),
        Function(
            "uint",
            (_g("int", "uint"), _g("uint", "uint"), _g("double", "uint"), _g("string", "uint")),
            _to_uint,
        ),
        Function(
            "double",
            (_g("int", "double"), _g("uint", "double"), _g("double", "double"), _g("string", "double")),
            _to_double,
        ),
        Function(
            "string",
            (
                _g("int", "string"),
                _g("uint", "string"),
                _g("double", "string"),
                _g("string", "string"),
                _g("bool", "string"),
                _g("bytes", "string"),
                _g("ip", "string"),
                _g("cidr", "string"),
                _g("timestamp", "string"),
                _g("duration", "string"),
            ),
            _to_string,
        ),
        Function("bool", (_g("bool", "bool"), _g("string", "bool")), _to_bool),
        Function("bytes", (_g("bytes", "bytes"), _g("string", "bytes")), _to_bytes),
        Function("type", (_g("dyn", "type"),), _type_of),
        Function("dyn", (_g("dyn", "dyn"),), _dyn),
        # ext.Strings v2
        Function("charAt", (_m("string", "int", "string"),), _char_at),
        Function(
            "indexOf",
            (_m("string", "string", "int"), _m("string", "string", "int", "int"), _m("list", "dyn", "int")),
            _index_of,
        ),
        Function(
            "lastIndexOf",
            (_m("string", "string", "int"), _m("string", "string", "int", "int"), _m("list", "dyn", "int")),
            _last_index_of,
        ),
        Function("lowerAscii", (_m("string", "string"),), _ascii_case("lowerAscii", upper=False)),
        Function("upperAscii", (_m("string", "string"),), _ascii_case("upperAscii", upper=True)),
        Function(
            "replace",
            (_m("string", "string", "string", "string"), _m("string", "string", "string", "int", "string")),
            _replace,
        ),
        Function("split", (_m("string", "string", "list"), _m("string", "string", "int", "list")), _split),
        Function(
            "substring", (_m("string", "int", "string"), _m("string", "int", "int", "string")), _substring
        ),
        Function("trim", (_m("string", "string"),), _trim),
        Function("join", (_m("list", "string"), _m("list", "string", "string")), _join),
        Function("strings.quote", (_g("string", "string"),), _quote),
        Function("format", (_m("string", "list", "string"),), _format),
        # Kubernetes regex
        Function("find", (_m("string", "string", "string"),), _find),
        Function(
            "findAll", (_m("string", "string", "list"), _m("string", "string", "int", "list")), _find_all
        ),
        # Kubernetes lists
        Function("isSorted", (_m("list", "bool"),), _is_sorted),
        Function("sum", (_m("list", "dyn"),), _sum),
        Function("min", (_m("list", "dyn"),), _extreme("min", pick_max=False)),
        Function("max", (_m("list", "dyn"),), _extreme("max", pick_max=True)),
        # ext.Lists v3
        Function("slice", (_m("list", "int", "int", "list"),), _slice),
        Function("flatten", (_m("list", "list"), _m("list", "int", "list")), _flatten),
        Function("distinct", (_m("list", "list"),), _distinct),
        Function("reverse", (_m("list", "list"),), _reverse),
        Function("sort", (_m("list", "list"),), _sort),
        Function("lists.range", (_g("int", "list"),), _lists_range),
        # the expansion of the sortBy macro: list.@sortByAssociatedKeys(list.map(e, key))
        Function("@sortByAssociatedKeys", (_m("list", "list", "list"),), _sort_by_keys),
        # DRA list attributes
        Function("includes", (_m("dyn", "dyn", "bool"),), _includes),
        # optional types
        Function("hasValue", (_m("optional", "bool"),), _has_value),
        Function("value", (_m("optional", "dyn"),), _value),
        Function("orValue", (_m("optional", "dyn", "dyn"),), _or_value),
        Function("or", (_m("optional", "optional", "optional"),), _or),
        Function("optional.of", (_g("dyn", "optional"),), _optional_of),
        Function("optional.none", (_g("optional"),), _optional_none),
        Function("optional.ofNonZeroValue", (_g("dyn", "optional"),), _optional_of_non_zero),
        Function("optional.unwrap", (_g("list", "list"),), _unwrap),
        Function("unwrapOpt", (_m("list", "list"),), _unwrap),
        Function("first", (_m("list", "optional"),), _first),
        Function("last", (_m("list", "optional"),), _last),
        # ext.Sets
        Function("sets.contains", (_g("list", "list", "bool"),), _sets_contains),
        Function("sets.equivalent", (_g("list", "list", "bool"),), _sets_equivalent),
        Function("sets.intersects", (_g("list", "list", "bool"),), _sets_intersects),
        # Kubernetes quantity
        Function("quantity", (_g("string", "quantity"),), _quantity),
        Function("isQuantity", (_g("string", "bool"),), _is_quantity),
        Function("sign", (_g("quantity", "int"),), _sign),
        Function("isInteger", (_m("quantity", "bool"),), _is_integer),
        Function("asInteger", (_m("quantity", "int"),), _as_integer),
        Function("asApproximateFloat", (_m("quantity", "double"),), _as_approximate_float),
        Function(
            "add",
            (_m("quantity", "quantity", "quantity"), _m("quantity", "int", "quantity")),
            _quantity_arith("add", subtract=False),
        ),
        Function(
            "sub",
            (_m("quantity", "quantity", "quantity"), _m("quantity", "int", "quantity")),
            _quantity_arith("sub", subtract=True),
        ),
        Function(
            "compareTo", (_m("quantity", "quantity", "int"), _m("semver", "semver", "int")), _compare_to
        ),
        Function(
            "isLessThan", (_m("quantity", "quantity", "bool"), _m("semver", "semver", "bool")), _is_less_than
        ),
        Function(
            "isGreaterThan",
            (_m("quantity", "quantity", "bool"), _m("semver", "semver", "bool")),
            _is_greater_than,
        ),
        # Kubernetes semver
        Function("semver", (_g("string", "semver"), _g("string", "bool", "semver")), _semver),
        Function("isSemver", (_g("string", "bool"), _g("string", "bool", "bool")), _is_semver),
        Function("major", (_m("semver", "int"),), _semver_part("major")),
        Function("minor", (_m("semver", "int"),), _semver_part("minor")),
        Function("patch", (_m("semver", "int"),), _semver_part("patch")),
        # timestamps and durations (CEL standard)
        Function(
            "timestamp",
            (_g("string", "timestamp"), _g("int", "timestamp"), _g("timestamp", "timestamp")),
            _to_timestamp,
        ),
        Function("duration", (_g("string", "duration"), _g("duration", "duration")), _to_duration),
        *(
            Function(
                name,
                (_m("timestamp", "int"), _m("timestamp", "string", "int"))
                + ((_m("duration", "int"),) if name in _DURATION_GETTERS else ()),
                _time_getter(name),
            )
            for name in _TIMESTAMP_GETTERS
        ),
        # Kubernetes IP and CIDR
        Function("ip", (_g("string", "ip"), _m("cidr", "ip")), kube.to_ip),
        Function("isIP", (_g("string", "bool"),), kube.is_ip),
        Function("ip.isCanonical", (_g("string", "bool"),), kube.ip_is_canonical),
        Function("family", (_m("ip", "int"),), kube.family),
        *(
            Function(name, (_m("ip", "bool"),), kube.ip_predicate(name, test))
            for name, test in (
                ("isUnspecified", IPAddr.is_unspecified),
                ("isLoopback", IPAddr.is_loopback),
                ("isLinkLocalMulticast", IPAddr.is_link_local_multicast),
                ("isLinkLocalUnicast", IPAddr.is_link_local_unicast),
                ("isGlobalUnicast", IPAddr.is_global_unicast),
            )
        ),
        Function("cidr", (_g("string", "cidr"),), kube.to_cidr),
        Function("isCIDR", (_g("string", "bool"),), kube.is_cidr),
        Function("containsIP", (_m("cidr", "string", "bool"), _m("cidr", "ip", "bool")), kube.contains_ip),
        Function(
            "containsCIDR", (_m("cidr", "string", "bool"), _m("cidr", "cidr", "bool")), kube.contains_cidr
        ),
        Function("masked", (_m("cidr", "cidr"),), kube.masked),
        Function("prefixLength", (_m("cidr", "int"),), kube.prefix_length),
        # Kubernetes URLs
        Function("url", (_g("string", "url"),), kube.to_url),
        Function("isURL", (_g("string", "bool"),), kube.is_url),
        *(
            Function(name, (_m("url", "map" if name == "getQuery" else "string"),), impl)
            for name, impl in kube.URL_PARTS.items()
        ),
        # Kubernetes named formats
        Function("format.named", (_g("string", "optional"),), kube.format_named),
        Function("validate", (_m("format", "string", "optional"),), kube.format_validate),
        *(Function(f"format.{name}", (_g("format"),), kube.format_constant(name)) for name in FORMATS),
    ]
    return {function.name: function for function in table}


FUNCTIONS: dict[str, Function] = _functions()

# Namespaces whose members are functions (`strings.quote`), not fields of a variable.
FUNCTION_NAMESPACES = frozenset(name.split(".")[0] for name in FUNCTIONS if "." in name)

# Functions whose name holds a dot (`strings.quote`, `format.named`): `ip.isCanonical(s)` is this function,
# while `ip.family()` on a variable called `ip` is a member call, as in cel-go.
QUALIFIED_FUNCTIONS = frozenset(name for name in FUNCTIONS if "." in name)

# Type identifiers usable as values (`type(x) == int`).
TYPE_NAMES = {
    "int": "int",
    "uint": "uint",
    "double": "double",
    "bool": "bool",
    "string": "string",
    "bytes": "bytes",
    "list": "list",
    "map": "map",
    "null_type": "null_type",
    "type": "type",
    "net.IP": "net.IP",
    "net.CIDR": "net.CIDR",
}

__all__ = [
    "FUNCTIONS",
    "FUNCTION_NAMESPACES",
    "QUALIFIED_FUNCTIONS",
    "TYPE_NAMES",
    "DeviceValue",
    "Function",
    "Overload",
    "compile_regex",
]
