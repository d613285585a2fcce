"""The CEL `kubernetes.Quantity` type: a resource quantity (`40Gi`, `1500m`, `2e3`).

Parsing is dra-gpu's one quantity parser (`dra_gpu.config.quantity`): Kubernetes' grammar exactly, the value
from `kubernetes.utils.parse_quantity`, rounded and capped as `resource.ParseQuantity` does.
"""

from __future__ import annotations

from decimal import Decimal

from dra_gpu.config.quantity import INT64_MAX, INT64_MIN, QuantityError, format_quantity
from dra_gpu.config.quantity import parse_quantity_exact as parse_quantity_strict

__all__ = ["INT64_MAX", "INT64_MIN", "Quantity", "QuantityError", "parse_quantity_strict"]


class Quantity:
    """An immutable quantity value; equality is by amount (`quantity('1k') == quantity('1000')`)."""

    __slots__ = ("text", "value")

    def __init__(self, value: Decimal, text: str | None = None):
        self.value = value
        self.text = text if text is not None else format_quantity(value)

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
