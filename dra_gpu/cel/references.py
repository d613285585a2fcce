"""Which parts of `device` an expression reads: the key for caching selector results per device shape.

All nodes built from one hardware profile publish identical devices except for a few identity attributes
(uuid, pciBusID). When a selector only reads `device.driver` and `device.attributes["gpu.nvidia.com"].type`,
its result is the same for every device with the same values there, so it is evaluated once per distinct tuple
of values. A path is a tuple: `()` (the whole device), `("driver",)`, `("attributes",)`, `("attributes",
domain)`, `("attributes", domain, name)`, and the same for `capacity`; `("allowMultipleAllocations",)`.
"""

from __future__ import annotations

from collections.abc import Mapping

from dra_gpu.cel.syntax import Bind, Comprehension, Ident, Index, Literal, Node, Select, children

Path = tuple[str, ...]


def device_paths(root: Node) -> frozenset[Path]:
    found: set[Path] = set()
    _collect(root, {"device": ()}, found)
    return frozenset(found)


def _path_of(node: Node, aliases: Mapping[str, Path]) -> Path | None:
    if isinstance(node, Ident):
        return aliases.get(node.name)
    if isinstance(node, Select):
        key: str | None = node.name
        parent = node.operand
    elif isinstance(node, Index) and isinstance(node.index, Literal) and isinstance(node.index.value, str):
        key = node.index.value
        parent = node.operand
    else:
        return None
    base = _path_of(parent, aliases)
    if base is None:
        return None
    if len(base) >= 3 or base == ("driver",) or base == ("allowMultipleAllocations",):
        return base  # deeper than a value: the value itself decides
    return (*base, str(key))


def _collect(node: Node, aliases: dict[str, Path], found: set[Path]) -> None:
    path = _path_of(node, aliases)
    if path is not None:
        found.add(path)
        return
    if isinstance(node, Bind):
        inner = dict(aliases)
        init_path = _path_of(node.init, aliases)
        if init_path is not None:
            inner[node.var] = init_path
            if len(init_path) >= 3:
                found.add(init_path)  # reading a value can fail, so it matters even when the body ignores it
        else:
            _collect(node.init, aliases, found)
            inner.pop(node.var, None)
        _collect(node.body, inner, found)
        return
    if isinstance(node, Comprehension):
        _collect(node.range, aliases, found)
        inner = dict(aliases)
        for var in (node.var, node.var2):
            if var is not None:
                inner.pop(var, None)
        _collect(node.body, inner, found)
        if node.transform is not None:
            _collect(node.transform, inner, found)
        return
    for child in children(node):
        _collect(child, aliases, found)
