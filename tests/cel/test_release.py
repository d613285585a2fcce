"""What the CEL environment accepts per Kubernetes minor (dra_gpu/cel/release.py)."""

from __future__ import annotations

import pytest

from dra_gpu.cel.environment import compile_selector
from dra_gpu.cel.errors import CelCompileError
from dra_gpu.cel.release import MODELED_RELEASE, NEWEST, CelRelease, ReleaseError, parse_minor

INCLUDES = "device.attributes['resource.kubernetes.io'].numaNode.includes(0)"


def test_the_default_models_the_newest_release_with_list_attributes() -> None:
    assert CelRelease((1, 37), True) == NEWEST
    assert MODELED_RELEASE == (1, 37)
    assert compile_selector(INCLUDES).expression == INCLUDES


@pytest.mark.parametrize(
    ("version", "gate", "available"),
    [
        ((1, 37), False, True),  # Kubernetes' lists library v1 has it in every environment
        ((1, 37), True, True),
        ((1, 36), True, True),  # only the DRA environment with the gate
        ((1, 36), False, False),
        ((1, 35), True, False),
        ((1, 34), False, False),
    ],
)
def test_includes_exists_from_1_37_or_on_1_36_with_the_gate(
    version: tuple[int, int], gate: bool, available: bool
) -> None:
    release = CelRelease(version, gate)
    if available:
        compile_selector(INCLUDES, release)
        return
    with pytest.raises(CelCompileError) as error:
        compile_selector(INCLUDES, release)
    assert "undeclared reference to 'includes'" in error.value.message
    assert "needs Kubernetes 1.37" in error.value.message


def test_other_functions_do_not_depend_on_the_release() -> None:
    old = CelRelease((1, 34), False)
    compile_selector("device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA')", old)
    with pytest.raises(CelCompileError, match="undeclared reference to 'nope'"):
        compile_selector("nope(1)", old)


@pytest.mark.parametrize(("text", "expected"), [("1.34", (1, 34)), ("v1.37.2", (1, 37)), ("1.36", (1, 36))])
def test_parse_minor(text: str, expected: tuple[int, int]) -> None:
    assert parse_minor(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"), [("1.33", "supported are 1.34 to 1.37"), ("1.38", "1.37"), ("x", "MAJOR.MINOR")]
)
def test_parse_minor_refuses_with_the_supported_range(text: str, fragment: str) -> None:
    with pytest.raises(ReleaseError, match=fragment):
        parse_minor(text)
