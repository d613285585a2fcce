"""Compile-time checks, as far as they can be known without cel-go's full type checker.

Reported like Kubernetes does at validation time: undeclared references, unknown functions, calls with no
matching overload, unknown fields of `device`, and a result that is not bool. Types that cannot be inferred
here are `None` ("unknown") and never cause an error, so the checker only rejects what cel-go would reject as
well. Attribute values have the static type `any` (Kubernetes declares them as AnyType).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dra_gpu.cel.errors import CelCompileError, CelEvalError
from dra_gpu.cel.library import FUNCTIONS, TYPE_NAMES, Overload, compile_regex
from dra_gpu.cel.release import NEWEST, CelRelease
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
from dra_gpu.cel.values import type_name

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
    "timestamp": "google.protobuf.Timestamp",
    "duration": "google.protobuf.Duration",
    "ip": "net.IP",
    "cidr": "net.CIDR",
    "url": "kubernetes.URL",
    "format": "kubernetes.NamedFormat",
}
_LITERAL_CHECKS: Mapping[str, Callable[[object], object]] = {
    "matches": lambda value: compile_regex(value) if isinstance(value, str) else None,
    "timestamp": FUNCTIONS["timestamp"].impl,
    "duration": FUNCTIONS["duration"].impl,
}
_TEMPORAL = {"timestamp", "duration"}
# Types whose values can be ordered: what sort() and the keys of sortBy() accept.
_COMPARABLE = {"int", "uint", "double", "bool", "string", "bytes"}


def display(t: StaticType) -> str:
    if t is None:
        return "dyn"
    return _DISPLAY.get(t, t)


class Checker:
    def __init__(self, expression: str, variables: Mapping[str, str], release: CelRelease = NEWEST):
        self.expression = expression
        self.variables = dict(variables)
        self.release = release
        self.body_types: dict[int, StaticType] = {}  # comprehension node id -> type of its body
        self.format_literals: set[int] = set()  # ids of literals inside a format() call

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
            items = _Homogeneous(self, id(node) in self.format_literals)
            for position, item in enumerate(node.items):
                item_type = self.check(item, scope)
                if position in node.optional:
                    self._need_optional_entry(item, item_type)
                    item_type = None  # the contained type of an optional is not tracked
                items.add(item, item_type)
            return "list"
        if isinstance(node, MapLit):
            exempt = id(node) in self.format_literals
            keys, values = _Homogeneous(self, exempt), _Homogeneous(self, exempt)
            for position, (key, value) in enumerate(node.entries):
                key_type = self.check(key, scope)
                if key_type not in _LOOSE and key_type not in ("string", "int", "uint", "bool"):
                    raise self.fail(key, f"unsupported map key type: {display(key_type)}")
                keys.add(key, key_type)
                value_type = self.check(value, scope)
                if position in node.optional:
                    self._need_optional_entry(value, value_type)
                    value_type = None
                values.add(value, value_type)
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

    def _check_literal_argument(self, function: str, argument: Literal) -> None:
        """cel-go's literal validators (on in Kubernetes since 1.29): a constant first argument of
        matches() must be a valid regular expression, of timestamp()/duration() a valid value."""
        try:
            _LITERAL_CHECKS[function](argument.value)
        except CelEvalError:
            raise self.fail(argument, f"invalid {function} argument") from None

    def _exempt_literals(self, node: Node) -> None:
        """Mark a list/map literal argument of format(), and the literals nested directly in it."""
        if isinstance(node, ListLit):
            self.format_literals.add(id(node))
            for item in node.items:
                self._exempt_literals(item)
        elif isinstance(node, MapLit):
            self.format_literals.add(id(node))
            for key, value in node.entries:
                self._exempt_literals(key)
                self._exempt_literals(value)

    def _need_optional_entry(self, node: Node, entry_type: StaticType) -> None:
        """`[?x]` and `{?k: x}` need an optional x (cel-go checks this at compile time)."""
        if entry_type not in _LOOSE and entry_type != "optional":
            raise self.fail(node, f"expected type 'optional_type(dyn)' but found '{display(entry_type)}'")

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
                if side not in _LOOSE and side not in _NUMERIC | {"string", "bytes", "bool"} | _TEMPORAL:
                    raise mismatch
            if known and not (left in _NUMERIC and right in _NUMERIC) and left != right:
                raise mismatch
            return "bool"
        if op in ("_+_", "_-_") and (left in _TEMPORAL or right in _TEMPORAL):
            return self._temporal(node, op, left, right, mismatch)
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

    def _temporal(
        self, node: Binary, op: str, left: StaticType, right: StaticType, mismatch: CelCompileError
    ) -> StaticType:
        results = {
            ("_+_", "timestamp", "duration"): "timestamp",
            ("_+_", "duration", "timestamp"): "timestamp",
            ("_+_", "duration", "duration"): "duration",
            ("_-_", "timestamp", "duration"): "timestamp",
            ("_-_", "timestamp", "timestamp"): "duration",
            ("_-_", "duration", "duration"): "duration",
        }
        if left in _LOOSE or right in _LOOSE:
            candidates = {
                r
                for (o, lt, rt), r in results.items()
                if o == op and left in (lt, None) and right in (rt, None)
            }
            if not candidates:
                raise mismatch
            return candidates.pop() if len(candidates) == 1 else None
        result = results.get((op, str(left), str(right)))
        if result is None:
            raise mismatch
        return result

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
        self.body_types[id(node)] = body
        if node.macro in ("all", "exists", "exists_one", "filter") or node.transform is not None:
            self._need(node.body, node.macro, [body], ("bool",))
        if node.transform is not None:
            self.check(node.transform, inner)
        return "bool" if node.macro in ("all", "exists", "exists_one") else "list"

    def _call(self, node: Call, scope: Mapping[str, StaticType]) -> StaticType:
        function = FUNCTIONS.get(node.function)
        target = self.check(node.target, scope) if node.target is not None else None
        if node.function == "format":
            for arg in node.args:
                self._exempt_literals(arg)
        args = [self.check(a, scope) for a in node.args]
        missing = self.release.unavailable(node.function)
        if function is None or missing:
            # the scheduler's message; for a function of a newer release, what it needs
            why = f": {missing} ({self.release.label} is checked)" if missing else ""
            raise self.fail(node, f"undeclared reference to '{node.function}' (in container ''){why}")
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
        if node.function in _LITERAL_CHECKS and node.args and isinstance(node.args[0], Literal):
            self._check_literal_argument(node.function, node.args[0])
        if node.function == "@sortByAssociatedKeys" and isinstance(node.args[0], Comprehension):
            key_type = self.body_types.get(id(node.args[0]))
            if key_type not in _LOOSE and key_type not in _COMPARABLE:
                raise self.fail(
                    node,
                    f"found no matching overload for '@sortByAssociatedKeys' applied to "
                    f"'list(dyn).(list({display(key_type)}))'",
                )
        results = {o.result for o in matching}
        result = results.pop() if len(results) == 1 else None
        return None if result == "dyn" else result


class _Homogeneous:
    """Kubernetes turns on cel-go's homogeneous-aggregate-literal validation: the elements of a list literal
    (and the keys, and the values, of a map literal) must all have the same type, so `[1, 'a']` and
    `[1, 2.0]` are rejected; literals inside a string `format()` call are exempt. cel-go compares every
    element with the first; two elements whose types are known here and differ always break that rule,
    whichever the first is, so that is what is rejected (types not inferred here never are)."""

    def __init__(self, checker: Checker, exempt: bool):
        self.checker = checker
        self.exempt = exempt
        self.first: StaticType = None

    def add(self, node: Node, element: StaticType) -> None:
        if self.exempt or element in _LOOSE:
            return
        if self.first is None:
            self.first = element
        elif _base(element) != _base(self.first):
            raise self.checker.fail(
                node, f"expected type '{display(self.first)}' but found '{display(element)}'"
            )


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
    # A literal holds null, bool, int, uint, double, string or bytes; static types spell null "null".
    return "null" if value is None else type_name(value)
