from __future__ import annotations

import pytest

from dra_gpu.config.quantity import QuantityError, format_bytes, format_mib, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("10Gi", 10 * 2**30),
        ("512Mi", 512 * 2**20),
        ("1Ki", 1024),
        ("4G", 4 * 10**9),
        ("1.5Gi", 3 * 2**29),
        ("1e3", 1000),
        ("100m", 1),  # rounded up like Quantity.Value()
        ("0", 0),
        ("-1Gi", -(2**30)),
        (".5k", 500),
        ("7", 7),
    ],
)
def test_parse(text: str, value: int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text", ["", "Gi", "10 Gi", "10GB", "1.2.3", "ten", "1e999", "0x10", "1gi", "9" * 70]
)
def test_parse_rejects(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_format() -> None:
    assert format_mib(10 * 2**30) == "10240M"
    assert format_mib(2**20 + 5) == "1M"
    assert format_bytes(80 * 2**30) == "80Gi"
    assert format_bytes(1000) == "1000"
