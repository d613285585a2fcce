"""Hints for common mistakes in DRA selectors for `gpu.nvidia.com`, found in the syntax tree.

These run even when the expression does not compile, because the hint is usually the fix for the compile
error.
"""

from __future__ import annotations

from collections.abc import Iterator

from dra_gpu.cel.syntax import Binary, Index, Literal, Node, Select, children

DRIVER = "gpu.nvidia.com"
CAPACITY_NAMES = {
    "memory",
    "multiprocessors",
    "copyEngines",
    "decoders",
    "encoders",
    "jpegEngines",
    "ofaEngines",
    "compute",
}
VERSION_ATTRIBUTES = {"driverVersion", "cudaDriverVersion", "cudaComputeCapability"}
REMOVED_ATTRIBUTES = {"index", "minor"}
# Attributes that live in another domain than the user wrote: (domain, name) -> where they are now. dra-gpu
# once published gpu.nvidia.com/numaNode; NVIDIA's driver (and now dra-gpu) publishes only the standard one.
MOVED_ATTRIBUTES = {(DRIVER, "numaNode"): "resource.kubernetes.io/numaNode"}


def _device_path(node: Node) -> tuple[str, ...] | None:
    """("attributes", key, key...) for `device.attributes[...]...` chains with literal keys."""
    keys: list[str] = []
    current = node
    while True:
        if isinstance(current, Select):
            keys.append(current.name)
            current = current.operand
        elif (
            isinstance(current, Index)
            and isinstance(current.index, Literal)
            and isinstance(current.index.value, str)
        ):
            keys.append(current.index.value)
            current = current.operand
        else:
            break
    from dra_gpu.cel.syntax import Ident

    if isinstance(current, Ident) and current.name == "device" and keys:
        return tuple(reversed(keys))
    return None


def _walk(node: Node) -> Iterator[Node]:
    yield node
    for child in children(node):
        yield from _walk(child)


def hints(tree: Node) -> list[str]:
    found: list[str] = []

    def add(text: str) -> None:
        if text not in found:
            found.append(text)

    for node in _walk(tree):
        if isinstance(node, Binary) and node.op in ("_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_"):
            _comparison_hints(node, add)
        path = _device_path(node)
        if path is None or len(path) < 2:
            continue
        if path[0] == "attributes":
            domain = path[1]
            if domain in CAPACITY_NAMES or (len(path) >= 3 and path[2] in CAPACITY_NAMES):
                name = domain if domain in CAPACITY_NAMES else path[2]
                add(
                    f"{name} is a capacity, not an attribute: use "
                    f"device.capacity['{DRIVER}'].{name}.compareTo(quantity('40Gi')) >= 0"
                )
            elif "." not in domain:
                add(
                    f"attribute {domain!r} has no domain: device.attributes is keyed by domain first, e.g. "
                    f"device.attributes['{DRIVER}'].{domain}"
                )
            moved = MOVED_ATTRIBUTES.get((domain, path[2])) if len(path) >= 3 else None
            if moved is not None:
                moved_domain, moved_name = moved.split("/")
                add(
                    f"attribute {domain}/{path[2]} is not published (as in NVIDIA's driver): use "
                    f"device.attributes['{moved_domain}'].{moved_name}"
                )
            if len(path) >= 3 and path[2] in REMOVED_ATTRIBUTES and domain == DRIVER:
                add(
                    f"attribute {path[2]!r} was removed by NVIDIA's driver (device indexes are not stable): "
                    f"select by uuid or resource.kubernetes.io/pciBusID, or use a matchAttribute constraint"
                )
        if path[0] == "capacity" and "." not in path[1] and path[1] in CAPACITY_NAMES:
            add(f"capacity {path[1]!r} has no domain: use device.capacity['{DRIVER}'].{path[1]}")
    return found


def _comparison_hints(node: Binary, add: object) -> None:
    assert callable(add)
    for side, other in ((node.left, node.right), (node.right, node.left)):
        path = _device_path(side)
        if path is None or len(path) < 3:
            continue
        name = path[2]
        if (
            path[0] == "attributes"
            and name in VERSION_ATTRIBUTES
            and isinstance(other, Literal)
            and isinstance(other.value, str)
        ):
            op = node.op.strip("_")
            add(
                f"{name} is a version attribute; comparing it to a string is never true (== gives false, "
                f"ordering is an error): use device.attributes['{DRIVER}'].{name}.compareTo(semver("
                f"'{other.value}', true)) {op} 0"
            )
        if (
            path[0] == "capacity"
            and isinstance(other, Literal)
            and isinstance(other.value, int | float)
            and not isinstance(other.value, bool)
        ):
            op = node.op.strip("_")
            add(
                f"capacities are quantities, not numbers: use device.capacity['{path[1]}'].{name}"
                f".compareTo(quantity('{other.value}')) {op} 0"
            )
