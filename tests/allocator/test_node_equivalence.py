"""Identical nodes are searched once: the explanation is exactly the one of searching every node."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from dra_gpu.allocator.explain import ClaimExplanation
from dra_gpu.allocator.replicate import replicate_slices
from dra_gpu.allocator.search import NodeAllocator, NodeResult
from tests.allocator.builders import allocated, claim, consumes, device, exactly, resource_slice, result, run

NODES = ["node-1", "node-10", "node-2", "node-7"]  # node-1 is a prefix of node-10: names must not bleed


def _template() -> list[dict[str, Any]]:
    """Two GPUs of four memory slices; devices that need 3 slices each, and a whole GPU."""
    devices = []
    for gpu in range(2):
        counter_set = f"gpu-{gpu}-counter-set"
        devices.append(device(f"gpu-{gpu}", consumes=[consumes(counter_set, memory_slice_0="1", s1="1")]))
        for start in (0, 1):
            devices.append(
                device(
                    f"gpu-{gpu}-mig-3g-{start}",
                    "mig",
                    attributes={"parentUUID": f"GPU-{gpu}", "profile": "3g"},
                    consumes=[consumes(counter_set, s1="1")],
                )
            )
    counters = {f"gpu-{g}-counter-set": {"memory-slice-0": "1", "s1": "1"} for g in range(2)}
    return [resource_slice("template-gpus", "template", devices, counters=counters)]


def _unsatisfiable() -> dict[str, Any]:
    """Two 3g devices on one parent: each GPU has one s1 counter, so no node fits."""
    mig = "device.attributes['gpu.nvidia.com'].profile == '3g'"
    return claim(
        "two-on-one",
        exactly("a", "mig.nvidia.com", selectors=[mig]),
        exactly("b", "mig.nvidia.com", selectors=[mig]),
        constraints=[{"requests": ["a", "b"], "matchAttribute": "gpu.nvidia.com/parentUUID"}],
    )


def _as_json(explanations: list[ClaimExplanation]) -> str:
    return json.dumps([dataclasses.asdict(e) for e in explanations], sort_keys=True, default=str)


def test_identical_nodes_explained_once_read_as_if_each_was_searched(monkeypatch: pytest.MonkeyPatch) -> None:
    searches: list[str] = []
    search = NodeAllocator.run

    def counted(self: NodeAllocator) -> NodeResult:
        searches.append(self.node)
        return search(self)

    monkeypatch.setattr(NodeAllocator, "run", counted)
    shared = replicate_slices(_template(), "template", NODES)  # device entries shared: searched once
    separate = json.loads(json.dumps(shared))  # the same content in objects of their own: all searched
    assert shared[0]["spec"]["devices"] is shared[1]["spec"]["devices"]
    deduplicated = run([_unsatisfiable()], shared)
    assert searches == ["node-1"]
    searched = run([_unsatisfiable()], separate)
    assert searches[1:] == sorted(NODES)
    assert _as_json(deduplicated) == _as_json(searched)
    (explained,) = deduplicated
    assert not explained.allocatable and sorted(explained.node_failures) == sorted(NODES)
    for node, reason in explained.node_failures.items():
        other_nodes = [n for n in NODES if n != node]
        assert all(f"{n}/" not in reason for n in other_nodes), (node, reason)
    rejected = {r.device for r in explained.requests[0].rejected}
    assert {f"{n}/gpu-0" for n in NODES} <= rejected  # every node's own devices, by their own names


def test_a_node_with_a_held_device_is_searched_on_its_own() -> None:
    """Another claim holds both GPUs of node-1: its devices are the shared objects of every node, but node-1
    is not like the others. It fails on its own, and node-10, next in name order, gets the claim."""
    shared = replicate_slices(_template(), "template", NODES)
    one = claim("one", exactly("a", "mig.nvidia.com"))
    holder = allocated("holder", result("gpu-0", "node-1"), result("gpu-1", "node-1"))
    explained = run([one], shared, existing=[holder])
    assert _as_json(explained) == _as_json(run([one], json.loads(json.dumps(shared)), existing=[holder]))
    assert explained[0].allocatable and explained[0].node == "node-10"
    assert list(explained[0].node_failures) == ["node-1"]
