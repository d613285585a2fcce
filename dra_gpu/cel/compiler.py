"""Turn a checked syntax tree into nested Python closures and run them with a step (cost) counter.

Semantics follow cel-go as configured by Kubernetes: `&&`/`||` absorb an error when the other side decides the
result, `all`/`exists` likewise, heterogeneous equality (`1 == 1.0` is true at runtime, `'1' == 1` is false),
ordering across int/uint/double, int64/uint64 overflow errors, truncating integer division. The cost counter
approximates cel-go's runtime cost (one unit per operation, call and comprehension step; string functions add
one unit per 10 characters); exceeding the limit aborts the whole evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from dra_gpu.cel.errors import CelEvalError, CostLimitExceededError
from dra_gpu.cel.library import FUNCTIONS, TYPE_NAMES
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
from dra_gpu.cel.temporal import Duration, TemporalError, Timestamp
from dra_gpu.cel.values import (
    INT64_MIN,
    NONE,
    CelOptional,
    CelType,
    DeviceValue,
    DomainMap,
    Uint,
    cel_equal,
    check_int,
    check_uint,
    map_find,
    no_overload,
    ordering,
    to_display,
    type_name,
)

DEFAULT_COST_LIMIT = 1_000_000  # CELSelectorExpressionMaxCost


class Context:
    """Variables and the cost counter of one evaluation."""

    __slots__ = ("cost", "limit", "vars")

    def __init__(self, variables: dict[str, Any], limit: int = DEFAULT_COST_LIMIT):
        self.vars = variables
        self.cost = 0
        self.limit = limit

    def charge(self, units: int) -> None:
        self.cost += units
        if self.cost > self.limit:
            raise CostLimitExceededError("operation cancelled: actual cost limit exceeded")


Program = Callable[[Context], Any]
_MISSING = object()


def compile_node(node: Node) -> Program:
    compiler = _COMPILERS.get(type(node))
    if compiler is None:
        raise TypeError(f"cannot compile {type(node).__name__}")
    return compiler(node)


def _literal(node: Literal) -> Program:
    value = node.value
    return lambda ctx: value


def _ident(node: Ident) -> Program:
    name = node.name
    type_value = CelType(TYPE_NAMES[name]) if name in TYPE_NAMES else None

    def run(ctx: Context) -> Any:
        value = ctx.vars.get(name, _MISSING)
        if value is _MISSING:
            if type_value is not None:
                return type_value
            raise CelEvalError(f"undeclared reference to '{name}'")
        return value

    return run


def _select_value(value: Any, name: str, test_only: bool) -> Any:
    if isinstance(value, DomainMap):
        # Kubernetes' wrapper answers every lookup: unknown domains are empty maps.
        return True if test_only else value.lookup(name)
    if isinstance(value, dict):
        if test_only:
            return name in value
        try:
            return value[name]
        except KeyError:
            raise CelEvalError(f"no such key: {name}") from None
    if isinstance(value, DeviceValue):
        if name not in DeviceValue.FIELDS:
            raise CelEvalError(f"no such field: {name}")
        return True if test_only else getattr(value, name)
    raise CelEvalError(f"type '{type_name(value)}' does not support field selection")


def _select_optional(value: Any, name: str) -> CelOptional:
    """`value.?name`: the field if present, else optional.none()."""
    if isinstance(value, DomainMap):
        return CelOptional(value.lookup(name), True)
    if isinstance(value, dict):
        return CelOptional(value[name], True) if name in value else NONE
    if isinstance(value, DeviceValue) and name in DeviceValue.FIELDS:
        return CelOptional(getattr(value, name), True)
    raise CelEvalError(f"type '{type_name(value)}' does not support field selection")


def _select(node: Select) -> Program:
    operand = compile_node(node.operand)
    name = node.name
    test_only = node.test_only
    optional = node.optional

    def run(ctx: Context) -> Any:
        value = operand(ctx)
        if isinstance(value, CelOptional):
            # Optional chaining: selecting from an optional gives an optional.
            if not value.present:
                return NONE
            if optional:
                return _select_optional(value.value, name)
            return CelOptional(_select_value(value.value, name, test_only), True)
        if optional:
            return _select_optional(value, name)
        return _select_value(value, name, test_only)

    return run


def _index_value(container: Any, key: Any) -> Any:
    if isinstance(container, list | tuple):
        if isinstance(key, float) and key.is_integer():
            key = int(key)
        if isinstance(key, bool) or not isinstance(key, int):
            raise no_overload("_[_]", container, key)
        if not 0 <= key < len(container):
            raise CelEvalError(f"index out of bounds: {key}")
        return container[key]
    if isinstance(container, DomainMap):
        if not isinstance(key, str):
            raise no_overload("_[_]", container, key)
        return container.lookup(key)
    if isinstance(container, dict):
        found, value = map_find(container, key)
        if not found:
            raise CelEvalError(f"no such key: {key}")
        return value
    raise no_overload("_[_]", container, key)


def _index_optional(container: Any, key: Any) -> CelOptional:
    if isinstance(container, list | tuple):
        if isinstance(key, bool) or not isinstance(key, int | float):
            raise no_overload("_[?_]", container, key)
        if isinstance(key, float) and not key.is_integer():
            return NONE
        position = int(key)
        return CelOptional(container[position], True) if 0 <= position < len(container) else NONE
    if isinstance(container, DomainMap) and isinstance(key, str):
        return CelOptional(container.lookup(key), True)
    if isinstance(container, dict):
        found, value = map_find(container, key)
        return CelOptional(value, True) if found else NONE
    raise no_overload("_[?_]", container, key)


def _index(node: Index) -> Program:
    operand = compile_node(node.operand)
    index = compile_node(node.index)
    optional = node.optional

    def run(ctx: Context) -> Any:
        container = operand(ctx)
        key = index(ctx)
        if isinstance(container, CelOptional):
            if not container.present:
                return NONE
            if optional:
                return _index_optional(container.value, key)
            return CelOptional(_index_value(container.value, key), True)
        if optional:
            return _index_optional(container, key)
        return _index_value(container, key)

    return run


def _call(node: Call) -> Program:
    function = FUNCTIONS.get(node.function)
    if function is None:
        name = node.function

        def undeclared(ctx: Context) -> Any:
            raise CelEvalError(f"undeclared reference to '{name}'")

        return undeclared
    impl = function.impl
    name = node.function
    parts = ([compile_node(node.target)] if node.target is not None else []) + [
        compile_node(a) for a in node.args
    ]

    def run(ctx: Context) -> Any:
        args = [part(ctx) for part in parts]
        units = 1
        for arg in args:
            if isinstance(arg, str | bytes | list | tuple):
                units += len(arg) // 10
        ctx.charge(units)
        try:
            return impl(*args)
        except CelEvalError:
            raise
        except (TypeError, ValueError, AttributeError, OverflowError, RecursionError) as error:
            raise CelEvalError(f"no such overload: {name}: {error}") from None

    return run


def _list(node: ListLit) -> Program:
    items = [compile_node(item) for item in node.items]
    if not node.optional:
        return lambda ctx: [item(ctx) for item in items]
    optional = node.optional

    def run(ctx: Context) -> Any:
        out: list[Any] = []
        for position, item in enumerate(items):
            value = item(ctx)
            if position not in optional:
                out.append(value)
            elif _present(value, "list element"):
                out.append(value.value)
        return out

    return run


def _present(entry: Any, what: str) -> bool:
    """For `?x` entries: whether the optional holds a value (a non-optional is an error, as in cel-go)."""
    if not isinstance(entry, CelOptional):
        raise CelEvalError(f"cannot initialize optional {what} from non-optional value {to_display(entry)}")
    return entry.present


def _map(node: MapLit) -> Program:
    entries = [(compile_node(k), compile_node(v)) for k, v in node.entries]
    optional = node.optional

    def run(ctx: Context) -> Any:
        out: dict[Any, Any] = {}
        for position, (key_program, value_program) in enumerate(entries):
            key = key_program(ctx)
            if isinstance(key, float) or key is None or not isinstance(key, str | int):
                raise CelEvalError(f"unsupported key type: {type_name(key)}")
            if map_find(out, key)[0]:
                raise CelEvalError(f"Failed with repeated key: {key}")
            value = value_program(ctx)
            if position not in optional:
                out[key] = value
            elif _present(value, f"entry '{key}'"):
                out[key] = value.value
        return out

    return run


def _unary(node: Unary) -> Program:
    operand = compile_node(node.operand)
    if node.op == "!_":

        def negate(ctx: Context) -> Any:
            value = operand(ctx)
            if value is True:
                return False
            if value is False:
                return True
            raise no_overload("!_", value)

        return negate

    def minus(ctx: Context) -> Any:
        value = operand(ctx)
        if isinstance(value, bool | Uint):
            raise no_overload("-_", value)
        if isinstance(value, int):
            if value == INT64_MIN:
                raise CelEvalError("integer overflow")
            return -value
        if isinstance(value, float):
            return -value
        raise no_overload("-_", value)

    return minus


def _bool_or_error(value: Any, op: str) -> tuple[bool | None, CelEvalError | None]:
    if value is True or value is False:
        return value, None
    return None, no_overload(op, value)


def _logical(node: Logical) -> Program:
    left = compile_node(node.left)
    right = compile_node(node.right)
    op = node.op
    decisive = op == "_||_"  # || is decided by true, && by false

    def run(ctx: Context) -> Any:
        error: CelEvalError | None = None
        try:
            value, error = _bool_or_error(left(ctx), op)
        except CostLimitExceededError:
            raise
        except CelEvalError as caught:
            value, error = None, caught
        if value is decisive:
            return decisive
        try:
            other, other_error = _bool_or_error(right(ctx), op)
        except CostLimitExceededError:
            raise
        except CelEvalError as caught:
            other, other_error = None, caught
        if other is decisive:
            return decisive
        if error is not None:
            raise error
        if other_error is not None:
            raise other_error
        return not decisive

    return run


def _conditional(node: Conditional) -> Program:
    condition = compile_node(node.condition)
    if_true = compile_node(node.if_true)
    if_false = compile_node(node.if_false)

    def run(ctx: Context) -> Any:
        value = condition(ctx)
        if value is True:
            return if_true(ctx)
        if value is False:
            return if_false(ctx)
        raise no_overload("_?_:_", value)

    return run


_TEMPORAL = ("google.protobuf.Timestamp", "google.protobuf.Duration")


def _temporal_arith(op: str, a: Any, b: Any) -> Any:
    """timestamp ± duration, duration + timestamp, timestamp - timestamp, duration ± duration."""
    try:
        if op == "_+_":
            if isinstance(a, Timestamp) and isinstance(b, Duration):
                return Timestamp(a.nanos + b.nanos, a.offset)
            if isinstance(a, Duration) and isinstance(b, Timestamp):
                return Timestamp(a.nanos + b.nanos, b.offset)
            if isinstance(a, Duration) and isinstance(b, Duration):
                return Duration(a.nanos + b.nanos)
        if op == "_-_":
            if isinstance(a, Timestamp) and isinstance(b, Duration):
                return Timestamp(a.nanos - b.nanos, a.offset)
            if isinstance(a, Timestamp) and isinstance(b, Timestamp):
                return Duration(a.nanos - b.nanos)
            if isinstance(a, Duration) and isinstance(b, Duration):
                return Duration(a.nanos - b.nanos)
    except TemporalError as error:
        raise CelEvalError(str(error)) from None
    raise no_overload(op, a, b)


def _arith(op: str, a: Any, b: Any) -> Any:
    kind = type_name(a)
    if kind in _TEMPORAL or type_name(b) in _TEMPORAL:
        return _temporal_arith(op, a, b)
    if kind != type_name(b):
        raise no_overload(op, a, b)
    if kind == "int":
        if op == "_+_":
            return check_int(a + b)
        if op == "_-_":
            return check_int(a - b)
        if op == "_*_":
            return check_int(a * b)
        if b == 0:
            raise CelEvalError("division by zero" if op == "_/_" else "modulus by zero")
        quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
        if op == "_/_":
            return check_int(quotient)
        return a - b * quotient
    if kind == "uint":
        if op == "_+_":
            return check_uint(a + b)
        if op == "_-_":
            return check_uint(a - b)
        if op == "_*_":
            return check_uint(a * b)
        if b == 0:
            raise CelEvalError("division by zero" if op == "_/_" else "modulus by zero")
        return Uint(a // b) if op == "_/_" else Uint(a % b)
    if kind == "double":
        if op == "_+_":
            return a + b
        if op == "_-_":
            return a - b
        if op == "_*_":
            return a * b
        if op == "_/_":
            if b == 0:
                if a == 0 or math.isnan(a):
                    return math.nan
                return math.copysign(math.inf, a) * math.copysign(1.0, b)
            return a / b
        raise no_overload(op, a, b)
    if op == "_+_" and kind in ("string", "bytes"):
        return a + b
    if op == "_+_" and kind == "list":
        return [*a, *b]
    raise no_overload(op, a, b)


def _binary(node: Binary) -> Program:
    left = compile_node(node.left)
    right = compile_node(node.right)
    op = node.op
    if op == "_==_":
        return lambda ctx: cel_equal(left(ctx), right(ctx))
    if op == "_!=_":
        return lambda ctx: not cel_equal(left(ctx), right(ctx))
    if op in ("_<_", "_<=_", "_>_", "_>=_"):
        return lambda ctx: ordering(left(ctx), right(ctx), op)
    if op == "_in_":

        def contains(ctx: Context) -> Any:
            item = left(ctx)
            container = right(ctx)
            if isinstance(container, list | tuple):
                ctx.charge(1 + len(container) // 10)
                return any(cel_equal(item, element) for element in container)
            if isinstance(container, dict):
                return map_find(container, item)[0]
            raise no_overload("_in_", item, container)

        return contains

    def arithmetic(ctx: Context) -> Any:
        a = left(ctx)
        b = right(ctx)
        ctx.charge(1)
        return _arith(op, a, b)

    return arithmetic


def _comprehension(node: Comprehension) -> Program:
    range_program = compile_node(node.range)
    body = compile_node(node.body)
    transform = compile_node(node.transform) if node.transform is not None else None
    var, var2, macro = node.var, node.var2, node.macro

    def pairs(container: Any) -> list[tuple[Any, Any]]:
        if isinstance(container, list | tuple):
            return list(enumerate(container))
        if isinstance(container, dict):
            return [(key, value) for key, value in container.items()]
        raise CelEvalError(f"expression of type '{type_name(container)}' cannot be range of a comprehension")

    def run(ctx: Context) -> Any:
        container = range_program(ctx)
        items = pairs(container)
        is_list = isinstance(container, list | tuple)
        saved = {name: ctx.vars.get(name, _MISSING) for name in (var, var2) if name is not None}
        try:
            return _iterate(ctx, items, is_list)
        finally:
            for name, old in saved.items():
                if old is _MISSING:
                    ctx.vars.pop(name, None)
                else:
                    ctx.vars[name] = old

    def _iterate(ctx: Context, items: list[tuple[Any, Any]], is_list: bool) -> Any:
        error: CelEvalError | None = None
        count = 0
        out: list[Any] = []
        for first, second in items:
            ctx.charge(1)
            if var2 is None:
                ctx.vars[var] = second if is_list else first
            else:
                ctx.vars[var] = first
                ctx.vars[var2] = second
            if macro in ("all", "exists"):
                try:
                    value = body(ctx)
                except CostLimitExceededError:
                    raise
                except CelEvalError as caught:
                    error = error or caught
                    continue
                if value is not True and value is not False:
                    error = error or no_overload(macro, value)
                    continue
                if macro == "all" and value is False:
                    return False
                if macro == "exists" and value is True:
                    return True
                continue
            value = body(ctx)
            if macro == "exists_one":
                if value is not True and value is not False:
                    raise no_overload(macro, value)
                count += value is True
            elif macro == "filter":
                if value is not True and value is not False:
                    raise no_overload(macro, value)
                if value:
                    out.append(second if is_list else first)
            elif transform is not None:  # map with a filter
                if value is not True and value is not False:
                    raise no_overload(macro, value)
                if value:
                    out.append(transform(ctx))
            else:
                out.append(value)
        if macro in ("all", "exists"):
            if error is not None:
                raise error
            return macro == "all"
        if macro == "exists_one":
            return count == 1
        return out

    return run


def _bind(node: Bind) -> Program:
    init = compile_node(node.init)
    body = compile_node(node.body)
    var = node.var

    def run(ctx: Context) -> Any:
        value = init(ctx)
        old = ctx.vars.get(var, _MISSING)
        ctx.vars[var] = value
        try:
            return body(ctx)
        finally:
            if old is _MISSING:
                ctx.vars.pop(var, None)
            else:
                ctx.vars[var] = old

    return run


_COMPILERS: dict[type, Callable[[Any], Program]] = {
    Literal: _literal,
    Ident: _ident,
    Select: _select,
    Index: _index,
    Call: _call,
    ListLit: _list,
    MapLit: _map,
    Unary: _unary,
    Logical: _logical,
    Conditional: _conditional,
    Binary: _binary,
    Comprehension: _comprehension,
    Bind: _bind,
}
