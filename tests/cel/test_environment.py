"""The CEL environment beyond the table: positions, caching keys, cost, value types."""

from __future__ import annotations

from decimal import Decimal

import pytest

from dra_gpu.cel.device import device_value, raw_path_value
from dra_gpu.cel.environment import compile_expression, compile_selector
from dra_gpu.cel.errors import CelCompileError, CelEvalError, CostLimitExceededError
from dra_gpu.cel.quantity import Quantity, QuantityError, parse_quantity_strict
from dra_gpu.cel.semver import Semver, SemverError


def test_syntax_error_has_line_and_column() -> None:
    with pytest.raises(CelCompileError) as error:
        compile_selector("device.driver == 'x' &&\n  device.attributes[")
    assert error.value.line == 2
    assert error.value.column is not None
    assert error.value.describe().startswith("<input>:2:")


def test_undeclared_reference_points_at_the_name() -> None:
    with pytest.raises(CelCompileError) as error:
        compile_selector("device.driver == 'x' && nope")
    assert (error.value.line, error.value.column) == (1, 25)


def test_expression_length_limit() -> None:
    with pytest.raises(CelCompileError, match="longer than"):
        compile_selector("true || " * 2000 + "true")


def test_version_attribute_that_does_not_parse_is_a_runtime_error() -> None:
    with pytest.raises(CelEvalError, match="parse semantic version"):
        device_value("gpu.nvidia.com", {"name": "d", "attributes": {"v": {"version": "1.2"}}})


def test_device_value_splits_domains() -> None:
    device = device_value(
        "gpu.nvidia.com",
        {
            "name": "d",
            "attributes": {"type": {"string": "gpu"}, "example.com/x": {"int": 3}},
            "capacity": {"memory": {"value": "1Gi"}},
        },
    )
    assert device.attributes["gpu.nvidia.com"] == {"type": "gpu"}
    assert device.attributes["example.com"] == {"x": 3}
    assert device.capacity["gpu.nvidia.com"]["memory"] == Quantity(Decimal(2**30))


def test_paths_read_by_a_selector() -> None:
    selector = compile_selector(
        "device.driver == 'gpu.nvidia.com' && "
        "cel.bind(a, device.attributes['gpu.nvidia.com'], a.type == 'gpu')"
    )
    assert selector.paths == {("driver",), ("attributes", "gpu.nvidia.com", "type")}
    whole = compile_selector("device.attributes['gpu.nvidia.com'].exists(k, k == 'uuid')")
    assert whole.paths == {("attributes", "gpu.nvidia.com")}


def test_raw_path_value_accepts_qualified_driver_attributes() -> None:
    data = {"attributes": {"gpu.nvidia.com/type": {"string": "gpu"}}}
    assert raw_path_value("gpu.nvidia.com", data, ("attributes", "gpu.nvidia.com", "type")) == (
        ("string", "gpu"),
    )


def test_cost_limit_is_configurable_and_not_absorbed_by_or() -> None:
    selector = compile_selector("lists.range(100).all(x, lists.range(100).all(y, true)) || true")
    device = device_value("d", {"name": "x"})
    assert selector.matches(device) is True
    with pytest.raises(CostLimitExceededError):
        selector.matches(device, cost_limit=500)


def test_general_expressions_return_any_type() -> None:
    assert compile_expression("[1, 2].map(x, x * 2)").evaluate({}) == [2, 4]
    assert compile_expression("'a' + 'b'").evaluate({}) == "ab"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("40Gi", 40 * 2**30),
        ("1500m", Decimal("1.5")),
        ("2e3", 2000),
        ("1E", 10**18),
        (".5", Decimal("0.5")),
        ("-1k", -1000),
        ("+3", 3),
        ("1n", Decimal("1e-9")),
        ("0.0000000001", Decimal("1e-9")),
    ],
)
def test_quantity_values(text: str, value: Decimal | int) -> None:
    assert parse_quantity_strict(text) == value


@pytest.mark.parametrize(
    "text", ["200K", "1_000", "NaN", "Infinity", " 1", "1 ", "Mi", "", "1.2.3", "10Mo", "0x10"]
)
def test_quantity_rejects_what_kubernetes_rejects(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity_strict(text)


@pytest.mark.parametrize(
    "text", ["1.2", "v1.2.3", "01.2.3", "1.02.3", "1.2.3-", "1.2.3-01", "1.2.3+", "1.2.3-a..b", "1.2.3-ä", ""]
)
def test_semver_is_strict(text: str) -> None:
    with pytest.raises(SemverError):
        Semver.parse(text)


def test_semver_ordering_follows_semver_2() -> None:
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "2.0.0",
        "10.0.0",
    ]
    versions = [Semver.parse(v) for v in ordered]
    assert sorted(reversed(versions)) == versions
