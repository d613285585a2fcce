"""The Kubernetes DRA device-selector CEL environment: compile once, evaluate per device.

    selector = compile_selector('device.driver == "gpu.nvidia.com"')   # CelCompileError if rejected
    selector.matches(device_value(driver, slice_device))              # CelEvalError on runtime errors

Built on cel-python's grammar and parser (`celpy.celparser`, `celpy.evaluation.celstr`); checking and
evaluation are done here because celpy's evaluator lacks what Kubernetes has (compile-time checking,
`cel.bind`, a cost limit, cross-type numeric comparison, the Kubernetes libraries) and costs about 1 ms per
evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from dra_gpu.cel.checker import Checker, StaticType
from dra_gpu.cel.compiler import DEFAULT_COST_LIMIT, Context, Program, compile_node
from dra_gpu.cel.errors import CelCompileError, CelEvalError
from dra_gpu.cel.references import Path, device_paths
from dra_gpu.cel.release import NEWEST, CelRelease
from dra_gpu.cel.syntax import Node, parse
from dra_gpu.cel.values import DeviceValue, type_name

SELECTOR_VARIABLES = {"device": "device"}

__all__ = [
    "CelCompileError",
    "CelEvalError",
    "CompiledExpression",
    "compile_expression",
    "compile_selector",
]


@dataclass
class CompiledExpression:
    expression: str
    tree: Node
    result_type: StaticType
    program: Program
    paths: frozenset[Path]
    # Results per device-shape key (see references.py): True/False, or the error message.
    results: dict[tuple[Any, ...], bool | str] = field(default_factory=dict, repr=False)

    def evaluate(self, variables: Mapping[str, Any], cost_limit: int = DEFAULT_COST_LIMIT) -> Any:
        """The raw value (any CEL type); raises CelEvalError."""
        context = Context(dict(variables), cost_limit)
        try:
            return self.program(context)
        except RecursionError:
            raise CelEvalError("expression nesting too deep") from None

    def matches(self, device: DeviceValue, cost_limit: int = DEFAULT_COST_LIMIT) -> bool:
        """A selector's verdict for one device; a non-bool result is an error, as in the scheduler."""
        value = self.evaluate({"device": device}, cost_limit)
        if value is True or value is False:
            return value
        raise CelEvalError(f"CEL result of type {type_name(value)} could not be converted to bool")


def _build(
    expression: str, variables: Mapping[str, str], selector: bool, release: CelRelease = NEWEST
) -> CompiledExpression:
    tree = parse(expression)
    checker = Checker(expression, variables, release)
    result_type = checker.check_selector(tree) if selector else checker.check(tree, {})
    return CompiledExpression(expression, tree, result_type, compile_node(tree), device_paths(tree))


@lru_cache(maxsize=4096)
def compile_selector(expression: str, release: CelRelease = NEWEST) -> CompiledExpression:
    """Compile a device selector for `release` (default: the newest modeled, MODELED_RELEASE, with
    DRAListTypeAttributes on); raises CelCompileError with position and reason."""
    return _build(expression, SELECTOR_VARIABLES, selector=True, release=release)


def compile_expression(expression: str, variables: Mapping[str, str] | None = None) -> CompiledExpression:
    """Compile a general expression (any result type); used by the conformance tests."""
    return _build(expression, variables or SELECTOR_VARIABLES, selector=False)
