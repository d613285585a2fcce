"""Kubernetes `resource.Quantity` strings ("10Gi", "512M", "1.5e9"): the one parser and formatter of dra-gpu.

Opaque config, the CEL `quantity()` type, ResourceSlice capacities and the CLI all go through here, so a value
means the same everywhere and the same as in the apiserver (`k8s.io/apimachinery/pkg/api/resource`):
- the text must match Kubernetes' grammar exactly: no surrounding spaces (`" 10Gi"` is rejected, as
  `ParseQuantity` does), no `K`/`200KB`/`1_000`/`NaN` (which `kubernetes.utils.parse_quantity` alone accepts);
- the numeric value comes from `kubernetes.utils.parse_quantity`; decimal exponents are applied here, exactly;
- values finer than 1n round up (away from zero) to 1n, binary-SI values cap at 2^63-1 (`Quantity` does both;
  decimal values such as `1e40` are kept exact, as in Kubernetes), exponents must fit an int32.

The kubernetes package is imported on first use only: it costs ~0.2 s and ~30 MB, and modules that merely
import this one (the kubelet plugin's config code) should not pay for it before they parse anything.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import (
    MAX_EMAX,
    MIN_EMIN,
    ROUND_CEILING,
    ROUND_UP,
    Context,
    Decimal,
    InvalidOperation,
    localcontext,
)
from functools import lru_cache

# Same grammar as apimachinery's `parseQuantityString`: sign, digits with optional fraction, then either a
# binary suffix (Ki..Ei), a decimal SI suffix (n, u, m, "", k, M, G, T, P, E) or a decimal exponent (e3, E-2).
_QUANTITY_RE = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_BINARY_SUFFIXES = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
_NANO = Decimal("1e-9")
_INT32_MAX = 2**31 - 1
_MAX_TEXT = 128  # longer strings are not quantities anyone means; keeps the cache and Decimal work bounded

# Exact for any quantity text we accept (128 characters of digits, exponents up to int32): the kubernetes
# parser multiplies in the current context, whose default 28 digits would round "9999...9G".
_WIDE = Context(prec=_MAX_TEXT + 40, Emax=MAX_EMAX, Emin=MIN_EMIN)

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
QUANTITY_HELP = 'a Kubernetes quantity such as "10Gi", "512Mi" or "4G"'
MIB = 2**20


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity."""


def _kubernetes_parser() -> Callable[[str], Decimal]:
    from kubernetes.utils.quantity import parse_quantity as kubernetes_parse_quantity

    return kubernetes_parse_quantity


@lru_cache(maxsize=65536)
def parse_quantity_exact(text: str) -> Decimal:
    """The exact value of a Kubernetes quantity string, as `resource.ParseQuantity` keeps it. Raises
    QuantityError naming the text and the expected form."""
    if not isinstance(text, str):
        raise QuantityError(f"{text!r} is not {QUANTITY_HELP} (got {type(text).__name__}, want a string)")
    match = _QUANTITY_RE.match(text) if len(text) <= _MAX_TEXT else None
    if match is None:
        hint = " (remove the spaces)" if text.strip() != text and _QUANTITY_RE.match(text.strip()) else ""
        raise QuantityError(
            f"{text!r} is not {QUANTITY_HELP}{hint}: quantities must match the regular expression "
            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )
    number, suffix = match.group("number"), match.group("suffix") or ""
    try:
        if suffix[:1] in ("e", "E") and len(suffix) > 1 and suffix != "Ei":
            exponent = int(suffix[1:])
            if abs(exponent) > _INT32_MAX:  # apimachinery parses the exponent as an int32
                raise QuantityError(f"{text!r}: the exponent must fit in 32 bits")
            value = Decimal(number).scaleb(exponent, _WIDE)
        else:
            with localcontext(_WIDE):
                value = Decimal(_kubernetes_parser()(number + suffix))
    except (ValueError, InvalidOperation) as error:
        if isinstance(error, QuantityError):
            raise
        raise QuantityError(f"unable to parse quantity {text!r}: {error}") from None
    exponent_of = value.as_tuple().exponent
    if isinstance(exponent_of, int) and exponent_of < -9:  # finer than 1n: Kubernetes rounds up (away from 0)
        value = value.quantize(_NANO, rounding=ROUND_UP, context=_WIDE)
    if suffix.endswith("i") and value.copy_abs() > INT64_MAX:  # Kubernetes caps binary-SI amounts at int64
        value = Decimal(INT64_MAX).copy_sign(value)
    return value


def parse_quantity(text: str) -> int:
    """The quantity as an integer number of base units (bytes for memory), rounded up like `Quantity.Value()`.
    Raises QuantityError, also when the value does not fit an int64."""
    value = parse_quantity_exact(text)
    if value.copy_abs() > INT64_MAX:
        raise QuantityError(f"{text!r} is out of range: quantities used as integers must be at most 2^63-1")
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def format_quantity(value: int | Decimal, binary_si: bool = False) -> str:
    """A value as a Kubernetes quantity: "80Gi"/"9984Mi" for binary-SI values that divide evenly, else plain
    digits ("1000", "0.5")."""
    if isinstance(value, Decimal):
        if value != value.to_integral_value():
            return format(value.normalize(), "f")
        value = int(value)
    if binary_si and value:
        for suffix, factor in _BINARY_SUFFIXES:
            if value % factor == 0:
                return f"{value // factor}{suffix}"
    return str(value)


def format_bytes(num_bytes: int) -> str:
    """A byte count for messages: the largest binary unit that divides it exactly ("80Gi")."""
    return format_quantity(num_bytes, binary_si=True)


def format_mib(num_bytes: int) -> str:
    """`<N>M` with N = whole MiB: not a Kubernetes quantity but the notation of MPS
    (`set_default_device_pinned_mem_limit`, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`), where M means MiB."""
    return f"{num_bytes // MIB}M"
