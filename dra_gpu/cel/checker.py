"""Compile-time checks, as far as they can be known without cel-go's full type checker.

Reported like Kubernetes does at validation time: undeclared references, unknown functions, calls with no
matching overload, unknown fields of `device`, and a result that is not bool. Types that cannot be inferred
here are `None` ("unknown") and never cause an error, so the checker only rejects what cel-go would reject as
well. Attribute values have the static type `any` (Kubernetes declares them as AnyType).
"""

from __future__ import annotations

from collections.abc import Mapping

from dra_gpu.cel.errors import CelCompileError
from dra_gpu.cel.library import FUNCTIONS, TYPE_NAMES, Overload
from dra_gpu.cel.syntax import (
    Binary,
    Bind,
    Call,
    Comprehension,
    Conditional,
    Ident,
    Index,
    ListLit,
    Literal,
    Logical,
    MapLit,
    Node,
    Select,
    Unary,
)
from dra_gpu.cel.values import Uint

StaticType = str | None  # None: unknown

DEVICE_FIELDS: Mapping[str, str] = {
    "driver": "string",
    "attributes": "attrs_outer",
    "capacity": "cap_outer",
    "allowMultipleAllocations": "bool",
}
_MAP_LIKE = {"map", "attrs_outer", "attrs_inner", "cap_outer", "cap_inner"}
_NUMERIC = {"int", "uint", "double"}
_LOOSE = {None, "any", "dyn"}
_DISPLAY = {
    "attrs_outer": "map(string, map(string, any))",
    "attrs_inner": "map(string, any)",
    "cap_outer": "map(string, map(string, kubernetes.Quantity))",
    "cap_inner": "map(string, kubernetes.Quantity)",
    "quantity": "kubernetes.Quantity",
    "semver": "kubernetes.Semver",
    "device": "kubernetes.DRADevice",
    "null": "null_type",
    "optional": "optional_type(dyn)",
}


def display(t: StaticType) -> str:
    if t is None:
        return "dyn"
    return _DISPLAY.get(t, t)


class Checker:
    def __init__(self, expression: str, variables: Mapping[str, str]):
        self.expression = expression
        self.variables = dict(variables)

    def fail(self, node: Node, message: str) -> CelCompileError:
        return CelCompileError(message, self.expression, node.line, node.column)

    def check_selector(self, node: Node) -> StaticType:
        result = self.check(node, {})
        if result not in _LOOSE and result != "bool":
            raise self.fail(node, f"must evaluate to bool or the unknown type, not {display(result)}")
        return result

    def check(self, node: Node, scope: Mapping[str, StaticType]) -> StaticType:
        if isinstance(node, Literal):
            return _literal_type(node.value)
        if isinstance(node, Ident):
            return self._ident(node, scope)
        if isinstance(node, Select):
            return self._select(node, scope)
        if isinstance(node, Index):
            return self._index(node, scope)
        if isinstance(node, Call):
            return self._call(node, scope)
        if isinstance(node, ListLit):
            for item in node.items:
                self.check(item, scope)
            return "list"
        if isinstance(node, MapLit):
            for key, value in node.entries:
                key_type = self.check(key, scope)
                if key_type not in _LOOSE and key_type not in ("string", "int", "uint", "bool"):
                    raise self.fail(key, f"unsupported map key type: {display(key_type)}")
                self.check(value, scope)
            return "map"
        if isinstance(node, Unary):
            operand = self.check(node.operand, scope)
            if node.op == "!_":
                self._need(node, "!_", [operand], ("bool",))
                return "bool"
            self._need(node, "-_", [operand], ("int", "double"))
            return operand if operand in ("int", "double") else None
        if isinstance(node, Logical):
            for side in (node.left, node.right):
                side_type = self.check(side, scope)
                self._need(side, node.op, [side_type], ("bool",))
            return "bool"
        if isinstance(node, Conditional):
            condition = self.check(node.condition, scope)
            self._need(node.condition, "_?_:_", [condition], ("bool",))
            if_true = self.check(node.if_true, scope)
            if_false = self.check(node.if_false, scope)
            return if_true if if_true == if_false else None
        if isinstance(node, Binary):
            return self._binary(node, scope)
        if isinstance(node, Comprehension):
            return self._comprehension(node, scope)
        if isinstance(node, Bind):
            init = self.check(node.init, scope)
            inner = dict(scope)
            inner[node.var] = init
            return self.check(node.body, inner)
        raise self.fail(node, f"unsupported expression {type(node).__name__}")

    def _need(self, node: Node, op: str, types: list[StaticType], allowed: tuple[str, ...]) -> None:
        for t in types:
            if t not in _LOOSE and t not in allowed:
                raise self.fail(
                    node,
                    f"found no matching overload for '{op}' applied to "
                    f"'({', '.join(display(x) for x in types)})'",
                )

    def _ident(self, node: Ident, scope: Mapping[str, StaticType]) -> StaticType:
        if node.name in scope:
            return scope[node.name]
        if node.name in self.variables:
            return self.variables[node.name]
        if node.name in TYPE_NAMES:
            return "type"
        raise self.fail(node, f"undeclared reference to '{node.name}' (in container '')")

    def _select(self, node: Select, scope: Mapping[str, StaticType]) -> StaticType:
        operand = self.check(node.operand, scope)
        if operand == "optional":
            return "optional"  # optional chaining; the contained type is not tracked
        if node.optional:
            if operand == "device" and node.name not in DEVICE_FIELDS:
                raise self.fail(node, f"undefined field '{node.name}'")
            if operand not in _LOOSE and operand not in _MAP_LIKE and operand != "device":
                raise self.fail(node, f"type '{display(operand)}' does not support field selection")
            return "optional"
        if operand == "device":
            if node.name not in DEVICE_FIELDS:
                raise self.fail(node, f"undefined field '{node.name}'")
            return "bool" if node.test_only else DEVICE_FIELDS[node.name]
        if operand not in _LOOSE and operand not in _MAP_LIKE:
            raise self.fail(node, f"type '{display(operand)}' does not support field selection")
        if node.test_only:
            return "bool"
        return _element_of(operand)

    def _index(self, node: Index, scope: Mapping[str, StaticType]) -> StaticType:
        operand = self.check(node.operand, scope)
        index = self.check(node.index, scope)
        if operand == "optional" or node.optional:
            return "optional"
        if operand == "list":
            self._need(node, "_[_]", [index], ("int", "uint"))
            return None
        if operand in _MAP_LIKE:
            if operand in ("attrs_outer", "attrs_inner", "cap_outer", "cap_inner"):
                self._need(node, "_[_]", [index], ("string",))
            return _element_of(operand)
        if operand not in _LOOSE:
            raise self.fail(
                node,
                f"found no matching overload for '_[_]' applied to '({display(operand)}, {display(index)})'",
            )
        return None

    def _binary(self, node: Binary, scope: Mapping[str, StaticType]) -> StaticType:
        left = self.check(node.left, scope)
        right = self.check(node.right, scope)
        op = node.op
        mismatch = self.fail(
            node, f"found no matching overload for '{op}' applied to '({display(left)}, {display(right)})'"
        )
        known = left not in _LOOSE and right not in _LOOSE
        if op in ("_==_", "_!=_"):
            if known and left != "null" and right != "null" and _base(left) != _base(right):
                raise mismatch
            return "bool"
        if op == "_in_":
            if right not in _LOOSE and right != "list" and right not in _MAP_LIKE:
                raise mismatch
            return "bool"
        if op in ("_<_", "_<=_", "_>_", "_>=_"):
            for side in (left, right):
                if side not in _LOOSE and side not in _NUMERIC | {"string", "bytes", "bool"}:
                    raise mismatch
            if known and not (left in _NUMERIC and right in _NUMERIC) and left != right:
                raise mismatch
            return "bool"
        # arithmetic
        allowed = {
            "_+_": _NUMERIC | {"string", "bytes", "list"},
            "_-_": _NUMERIC,
            "_*_": _NUMERIC,
            "_/_": _NUMERIC,
            "_%_": {"int", "uint"},
        }[op]
        for side in (left, right):
            if side not in _LOOSE and side not in allowed:
                raise mismatch
        if known and left != right:
            raise mismatch
        if left not in _LOOSE:
            return left
        return right if right not in _LOOSE else None

    def _comprehension(self, node: Comprehension, scope: Mapping[str, StaticType]) -> StaticType:
        range_type = self.check(node.range, scope)
        if range_type not in _LOOSE and range_type != "list" and range_type not in _MAP_LIKE:
            raise self.fail(
                node,
                f"expression of type '{display(range_type)}' cannot be range of a comprehension "
                f"(must be list, map, or dynamic)",
            )
        inner = dict(scope)
        if node.var2 is None:
            inner[node.var] = "string" if range_type in _MAP_LIKE else None
        else:
            inner[node.var] = (
                "int" if range_type == "list" else ("string" if range_type in _MAP_LIKE else None)
            )
            inner[node.var2] = _element_of(range_type) if range_type in _MAP_LIKE else None
        body = self.check(node.body, inner)
        if node.macro in ("all", "exists", "exists_one", "filter") or node.transform is not None:
            self._need(node.body, node.macro, [body], ("bool",))
        if node.transform is not None:
            self.check(node.transform, inner)
        return "bool" if node.macro in ("all", "exists", "exists_one") else "list"

    def _call(self, node: Call, scope: Mapping[str, StaticType]) -> StaticType:
        function = FUNCTIONS.get(node.function)
        target = self.check(node.target, scope) if node.target is not None else None
        args = [self.check(a, scope) for a in node.args]
        if function is None:
            raise self.fail(node, f"undeclared reference to '{node.function}' (in container '')")
        member = node.target is not None
        types = ([target] if member else []) + args
        candidates = [o for o in function.overloads if o.member == member and len(o.params) == len(types)]
        if not candidates:
            if not [o for o in function.overloads if o.member == member]:
                style = "a method" if member else "a global function"
                raise self.fail(
                    node, f"undeclared reference to '{node.function}' (it is not {style}) (in container '')"
                )
            raise self.fail(node, _overload_message(node.function, member, types))
        matching = [o for o in candidates if _matches(o, types)]
        if not matching:
            raise self.fail(node, _overload_message(node.function, member, types))
        results = {o.result for o in matching}
        result = results.pop() if len(results) == 1 else None
        return None if result == "dyn" else result


def _overload_message(name: str, member: bool, types: list[StaticType]) -> str:
    if member:
        receiver, rest = types[0], types[1:]
        return (
            f"found no matching overload for '{name}' applied to "
            f"'{display(receiver)}.({', '.join(display(t) for t in rest)})'"
        )
    return f"found no matching overload for '{name}' applied to '({', '.join(display(t) for t in types)})'"


def _matches(overload: Overload, types: list[StaticType]) -> bool:
    for param, actual in zip(overload.params, types, strict=True):
        if param == "dyn" or actual in _LOOSE:
            continue
        if param == "map" and actual in _MAP_LIKE:
            continue
        if param != _base(actual):
            return False
    return True


def _base(t: StaticType) -> StaticType:
    return "map" if t in _MAP_LIKE else t


def _element_of(t: StaticType) -> StaticType:
    return {
        "attrs_outer": "attrs_inner",
        "attrs_inner": "any",
        "cap_outer": "cap_inner",
        "cap_inner": "quantity",
    }.get(t or "")


def _literal_type(value: object) -> StaticType:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Uint):
        return "uint"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes):
        return "bytes"
    return None
