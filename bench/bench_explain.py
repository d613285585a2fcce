"""`explain` of one claim over a 1,000-node cluster of simulated DGX H100 nodes (8 GPUs each, every MIG
placement, one share device per GPU: 216 devices per node, 216,000 in all). Target: under 2 s on 2 cores.

The inventory is made once from the hardware profile with `build_slices` for a template node and renamed per
node (all nodes of one profile are identical apart from names); that setup is timed separately. The timed part
is what `dra-gpu explain --hardware dgx-h100 --nodes 1000` does after building its inventory: index the
slices, evaluate the selectors (cached per device shape), search the first node that fits, and report the
matching and rejected devices of every node.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from functools import lru_cache
from typing import Any

from dra_gpu.allocator.builtin_classes import builtin_device_classes
from dra_gpu.allocator.claims import claim_from_object, parse_device_class
from dra_gpu.allocator.explain import explain
from dra_gpu.allocator.pools import Node, SliceIndex
from dra_gpu.allocator.replicate import replicate_slices
from dra_gpu.allocator.search import Existing

NODES = 1000
PROFILE = "dgx-h100"


@lru_cache(maxsize=1)
def _model() -> Any:
    from dra_gpu.hardware.loader import open_hardware
    from dra_gpu.inventory.device_model import ModelOptions, build_device_model

    root = tempfile.mkdtemp(prefix="bench-explain-", dir="/tmp")
    try:
        hardware = open_hardware(PROFILE, root, seed="bench")
        try:
            discovery = hardware.discover()
        finally:
            hardware.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return build_device_model(discovery, ModelOptions())


def template_slices(node: str) -> list[dict[str, Any]]:
    from dra_gpu.slices.slice_builder import build_slices

    return build_slices(_model(), node, (1, 36))


def inventory(count: int, shared: bool = True) -> tuple[list[dict[str, Any]], list[Node]]:
    """Slices of `count` identical nodes; `shared=False` gives every node its own copy of every device."""
    names = [f"node-{i:04d}" for i in range(count)]
    template = template_slices("node-template")
    if shared:
        slices = replicate_slices(template, "node-template", names)
    else:
        text = json.dumps(template)
        slices = [s for name in names for s in json.loads(text.replace("node-template", name))]
    return slices, [Node(name) for name in names]


def _claim(name: str, request: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}},
    }


CLAIMS = {
    "mig_1g10gb": _claim(
        "mig",
        {
            "name": "mig",
            "exactly": {
                "deviceClassName": "mig.nvidia.com",
                "selectors": [
                    {"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}}
                ],
            },
        },
    ),
    "eight_gpus": _claim(
        "gpus", {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 8}}
    ),
}


def _explain(figures: dict[str, Any], prefix: str, slices: list[dict[str, Any]], nodes: list[Node]) -> None:
    classes = {c.name: c for c in (parse_device_class(o) for o in builtin_device_classes())}
    for label, claim in CLAIMS.items():
        started = time.perf_counter()
        index = SliceIndex(slices)
        [result] = explain([[claim_from_object(claim)]], classes, index, nodes, Existing())
        elapsed = time.perf_counter() - started
        request = result.requests[0]
        figures[f"{prefix}{label}_explain_s"] = round(elapsed, 3)
        figures[f"{prefix}{label}_node"] = result.node
        figures[f"{prefix}{label}_matching"] = len(request.matching)
        figures[f"{prefix}{label}_rejected"] = len(request.rejected)


def run() -> dict[str, Any]:
    figures: dict[str, Any] = {"nodes": NODES}
    # As `explain --hardware` builds it: one template node, device entries shared by all nodes.
    started = time.perf_counter()
    slices, nodes = inventory(NODES)
    figures["shared_inventory_setup_s"] = round(time.perf_counter() - started, 2)
    figures["devices"] = sum(len(s["spec"].get("devices") or ()) for s in slices)
    _explain(figures, "", slices, nodes)
    # As from a live cluster or slice files: every device its own object (selector cache keyed by content).
    del slices
    started = time.perf_counter()
    slices, nodes = inventory(NODES, shared=False)
    figures["separate_inventory_setup_s"] = round(time.perf_counter() - started, 2)
    _explain(figures, "separate_objects_", slices, nodes)
    return figures


if __name__ == "__main__":
    for key, value in run().items():
        print(f"{key:40s} {value}")
