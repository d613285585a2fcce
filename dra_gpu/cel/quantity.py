"""The CEL `kubernetes.Quantity` type: a resource quantity (`40Gi`, `1500m`, `2e3`).

Parsing accepts exactly the Kubernetes grammar (`k8s.io/apimachinery/pkg/api/resource`): the numeric value
comes from `kubernetes.utils.quantity.parse_quantity`, but that function is more lenient than Kubernetes (it
takes `200K`, `1_000`, `NaN`), so the text is first checked against the Kubernetes grammar.
"""

from __future__ import annotations

import re
from decimal import ROUND_UP, Decimal, InvalidOperation
from functools import lru_cache

from kubernetes.utils.quantity import parse_quantity

# <signedNumber><suffix>, suffix one of: binarySI (Ki..Ei), decimalSI (n u m "" k M G T P E),
# decimalExponent (e|E<int>).
_QUANTITY_RE = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_NANO = Decimal("1e-9")
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class QuantityError(ValueError):
    pass


@lru_cache(maxsize=65536)
def parse_quantity_strict(text: str) -> Decimal:
    """The exact value of a Kubernetes quantity string, rounded up to 1n as Kubernetes does."""
    match = _QUANTITY_RE.match(text)
    if match is None:
        raise QuantityError(
            f"quantities must match the regular expression "
            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}"
        )
    suffix = match.group("suffix") or ""
    number = match.group("number")
    try:
        if suffix[:1] in ("e", "E") and len(suffix) > 1:
            value = Decimal(number) * (Decimal(10) ** int(suffix[1:]))
        else:
            value = Decimal(parse_quantity(number + suffix))  # type: ignore[no-untyped-call]
    except (ValueError, InvalidOperation) as error:
        raise QuantityError(f"unable to parse quantity {text!r}: {error}") from None
    exponent = value.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -9:  # finer than 1n: Kubernetes rounds up (away from zero)
        value = value.quantize(_NANO, rounding=ROUND_UP)
    return value


class Quantity:
    """An immutable quantity value; equality is by amount (`quantity('1k') == quantity('1000')`)."""

    __slots__ = ("text", "value")

    def __init__(self, value: Decimal, text: str | None = None):
        self.value = value
        self.text = text if text is not None else _format(value)

    @classmethod
    def parse(cls, text: str) -> Quantity:
        return cls(parse_quantity_strict(text), text)

    def compare(self, other: Quantity) -> int:
        return (self.value > other.value) - (self.value < other.value)

    def sign(self) -> int:
        return (self.value > 0) - (self.value < 0)

    def as_int64(self) -> int | None:
        """The value as int64 when it is a whole number within range, else None (Quantity.AsInt64)."""
        if self.value != self.value.to_integral_value():
            return None
        as_int = int(self.value)
        if not INT64_MIN <= as_int <= INT64_MAX:
            return None
        return as_int

    def add(self, other: Quantity) -> Quantity:
        return Quantity(self.value + other.value)

    def sub(self, other: Quantity) -> Quantity:
        return Quantity(self.value - other.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"

    def __str__(self) -> str:
        return self.text


def _format(value: Decimal) -> str:
    """A canonical-enough text form for messages (not Kubernetes' canonical form)."""
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")
