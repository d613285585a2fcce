"""Kubernetes `resource.Quantity` strings ("10Gi", "512M", "1.5e9") as integers, without the apimachinery.

Only what the opaque config needs: parse a quantity into an integer number of base units (bytes for memory),
rounding up like `Quantity.Value()` does, and format byte counts as the `<N>M` strings MPS expects.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

# Same grammar as apimachinery's `parseQuantityString`: sign, digits with optional fraction, then either a
# binary suffix (Ki..Ei), a decimal SI suffix (n, u, m, "", k, M, G, T, P, E) or a decimal exponent (e3, E-2).
_QUANTITY_RE = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}

QUANTITY_HELP = 'a Kubernetes quantity such as "10Gi", "512Mi" or "4G"'
MIB = 2**20


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity."""


def parse_quantity(text: str) -> int:
    """Return the quantity as an integer, rounded up (like `Quantity.Value()`). Raises QuantityError."""
    match = _QUANTITY_RE.match(text.strip()) if len(text) <= 64 else None
    if match is None:
        raise QuantityError(f"{text!r} is not {QUANTITY_HELP}")
    try:
        number = Decimal(match.group("number"))
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only valid decimals
        raise QuantityError(f"{text!r} is not {QUANTITY_HELP}") from exc
    suffix = match.group("suffix") or ""
    if suffix in _BINARY:
        value = number * _BINARY[suffix]
    elif suffix in _DECIMAL:
        value = number * _DECIMAL[suffix]
    elif suffix:
        exponent = int(suffix[1:])
        if abs(exponent) > 30:  # apimachinery caps exponents too; keeps Decimal from building huge numbers
            raise QuantityError(f"{text!r}: exponent out of range")
        value = number.scaleb(exponent)
    else:
        value = number
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def format_mib(num_bytes: int) -> str:
    """`<N>M` with N = whole MiB, the unit `set_default_device_pinned_mem_limit` and the client env take."""
    return f"{num_bytes // MIB}M"


def format_bytes(num_bytes: int) -> str:
    """Short human form for messages: the largest binary unit that divides the value exactly."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if num_bytes and num_bytes % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    return str(num_bytes)
