"""The conformance table, run through the real compiler and evaluator."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gpu.cel.device import device_value
from dra_gpu.cel.environment import compile_selector
from dra_gpu.cel.errors import CelCompileError, CelEvalError
from tests.cel.conformance_cases import CASES, DEVICE, Compile, Runtime

DEVICE_VALUE = device_value("gpu.nvidia.com", DEVICE)


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 100
    assert len({expression for expression, _ in CASES}) == len(CASES), "duplicate expressions"


@pytest.mark.parametrize(("expression", "expected"), CASES, ids=[c[0][:60] for c in CASES])
def test_case(expression: str, expected: Any) -> None:
    if isinstance(expected, Compile):
        with pytest.raises(CelCompileError) as compile_error:
            compile_selector(expression)
        assert expected.fragment in compile_error.value.message
        return
    selector = compile_selector(expression)
    if isinstance(expected, Runtime):
        with pytest.raises(CelEvalError) as eval_error:
            selector.matches(DEVICE_VALUE)
        assert expected.fragment in eval_error.value.message
        return
    assert selector.matches(DEVICE_VALUE) is expected
