"""`CdiEdits` <-> JSON (pure), so a sharing group's container edits can be checkpointed and a claim's CDI spec
rebuilt later exactly as it was first written (e.g. when the spec file was deleted by hand)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_gpu.sharing.interface import CdiDeviceNode, CdiEdits, CdiMount


def edits_to_json(edits: CdiEdits) -> dict[str, Any]:
    out: dict[str, Any] = {
        "env": list(edits.env),
        "mounts": [
            {"hostPath": m.host_path, "containerPath": m.container_path, "options": list(m.options)}
            for m in edits.mounts
        ],
    }
    if edits.device_nodes:
        out["deviceNodes"] = [
            {"path": n.path, **({"hostPath": n.host_path} if n.host_path is not None else {})}
            for n in edits.device_nodes
        ]
    return out


def edits_from_json(data: Mapping[str, Any]) -> CdiEdits:
    """The inverse of `edits_to_json`; raises KeyError/TypeError on a malformed document."""
    return CdiEdits(
        env=tuple(str(e) for e in data.get("env") or ()),
        mounts=tuple(
            CdiMount(str(m["hostPath"]), str(m["containerPath"]), tuple(str(o) for o in m["options"]))
            for m in data.get("mounts") or ()
        ),
        device_nodes=tuple(
            CdiDeviceNode(str(n["path"]), None if n.get("hostPath") is None else str(n["hostPath"]))
            for n in data.get("deviceNodes") or ()
        ),
    )
