"""The one quantity parser/formatter, against the cases apimachinery's own quantity tests pin down."""

from __future__ import annotations

from decimal import Decimal

import pytest

from dra_gpu.cel.quantity import Quantity
from dra_gpu.config.quantity import (
    INT64_MAX,
    QuantityError,
    format_bytes,
    format_mib,
    format_quantity,
    parse_quantity,
    parse_quantity_exact,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("10Gi", 10 * 2**30),
        ("512Mi", 512 * 2**20),
        ("1Ki", 1024),
        ("4G", 4 * 10**9),
        ("1.5Gi", 3 * 2**29),
        ("1e3", 1000),
        ("1E3", 1000),
        ("100m", 1),  # rounded up like Quantity.Value()
        ("0", 0),
        ("-1Gi", -(2**30)),
        (".5k", 500),
        ("5.", 5),
        ("+7", 7),
        ("7", 7),
        ("8Ei", INT64_MAX),  # binary SI caps at 2^63-1 in Kubernetes
        ("1e18", 10**18),
    ],
)
def test_parse(text: str, value: int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    ("text", "exact"),
    [
        ("1e40", Decimal("1e40")),  # decimal values are not capped (only binary SI is)
        ("9999999999999999999999999999999999999G", Decimal("9999999999999999999999999999999999999e9")),
        ("1.1e-10", Decimal("1e-9")),  # finer than 1n rounds up to 1n
        ("-1.1e-10", Decimal("-1e-9")),  # ... away from zero
        ("1n", Decimal("1e-9")),
        ("1500m", Decimal("1.5")),
        ("100Ei", Decimal(INT64_MAX)),
        ("-100Ei", Decimal(-INT64_MAX)),
        ("1e2147483647", Decimal("1e2147483647")),  # the largest int32 exponent
    ],
)
def test_parse_exact(text: str, exact: Decimal) -> None:
    assert parse_quantity_exact(text) == exact


@pytest.mark.parametrize(
    "text",
    [
        "",
        " 10Gi",  # Kubernetes does not trim; neither do we (config and CEL used to disagree here)
        "10Gi ",
        "Gi",
        "10 Gi",
        "10GB",
        "1.2.3",
        "ten",
        "0x10",
        "1gi",
        "1ki",
        "200K",  # kubernetes.utils.parse_quantity alone accepts these four; Kubernetes does not
        "1_000",
        "NaN",
        "Infinity",
        "1e",
        "1e2147483648",  # exponent beyond int32
        "9" * 200,
    ],
)
def test_parse_rejects(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity_exact(text)
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_leading_space_error_says_how_to_fix() -> None:
    with pytest.raises(QuantityError, match=r"remove the spaces"):
        parse_quantity(" 10Gi")


def test_integer_view_rejects_values_beyond_int64() -> None:
    with pytest.raises(QuantityError, match="out of range"):
        parse_quantity("1e40")
    assert parse_quantity("9223372036854775807") == INT64_MAX


def test_config_cel_and_slices_agree() -> None:
    """Same text, same value, whichever part of dra-gpu reads it."""
    for text in ("10Gi", "1e40", "1.1e-10", "8Ei", "1500m"):
        assert Quantity.parse(text).value == parse_quantity_exact(text)
    for text in (" 10Gi", "200K", "NaN"):
        with pytest.raises(QuantityError):
            Quantity.parse(text)


def test_format() -> None:
    assert format_quantity(81559 * 2**20, binary_si=True) == "81559Mi"
    assert format_quantity(80 * 2**30, binary_si=True) == "80Gi"
    assert format_quantity(2**60, binary_si=True) == "1Ei"
    assert format_quantity(1000) == "1000"
    assert format_quantity(1024) == "1024"  # binary SI only when asked for
    assert format_quantity(0, binary_si=True) == "0"
    assert format_quantity(Decimal("1.50")) == "1.5"
    assert format_quantity(Decimal("2048"), binary_si=True) == "2Ki"
    assert format_bytes(80 * 2**30) == "80Gi"
    assert format_bytes(1000) == "1000"
    assert format_mib(10 * 2**30) == "10240M"
    assert format_mib(2**20 + 5) == "1M"


@pytest.mark.parametrize("value", [0, 1, 1024, 10 * 2**30, 81559 * 2**20, 3 * 10**9, INT64_MAX])
def test_format_round_trips(value: int) -> None:
    for binary_si in (False, True):
        assert parse_quantity(format_quantity(value, binary_si)) == value
