"""Copies of one node's ResourceSlices for many identical nodes, sharing the device entries.

`explain --hardware <profile> --nodes 1000` and the benchmark model a cluster where every node has the same
hardware: the slices differ only in the node name (slice name, pool name, nodeName). Sharing the (read-only)
device and counter entries keeps a 216,000-device cluster at the memory cost of one node, and lets the
selector cache recognise identical devices by identity.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

SHARED_KEYS = ("devices", "sharedCounters")


def _rename(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, Mapping):
        return {k: _rename(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_rename(v, old, new) for v in value]
    return value


def replicate_slices(
    template: Sequence[Mapping[str, Any]], template_node: str, nodes: Sequence[str]
) -> list[Any]:
    """The template node's slices for each of `nodes`, with `template_node` replaced by the node's name."""
    shared_parts = [{k: s.get("spec", {}).get(k) for k in SHARED_KEYS} for s in template]
    if template_node in json.dumps(shared_parts):
        # Devices that mention the node cannot be shared: copy everything.
        text = json.dumps(list(template))
        return [slice_obj for node in nodes for slice_obj in json.loads(text.replace(template_node, node))]
    out: list[Any] = []
    for node in nodes:
        for slice_obj in template:
            spec = slice_obj.get("spec", {})
            copy = {k: _rename(v, template_node, node) for k, v in slice_obj.items() if k != "spec"}
            copy["spec"] = {
                k: (v if k in SHARED_KEYS else _rename(v, template_node, node)) for k, v in spec.items()
            }
            out.append(copy)
    return out
