"""Allocate soak claims as kube-scheduler would, with the project's allocator: each claim sees what the
claims allocated before it hold (exclusive devices, counters, shares), so only allocatable combinations reach
the plugin."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dra_gpu.allocator.builtin_classes import builtin_device_classes
from dra_gpu.allocator.claims import claim_from_object, parse_device_class
from dra_gpu.allocator.explain import explain, result_json
from dra_gpu.allocator.pools import Node, SliceIndex
from dra_gpu.allocator.search import Existing


class SchedulerModel:
    def __init__(self, node_name: str, slices: Sequence[Mapping[str, Any]]) -> None:
        self.node = Node(node_name)
        self.index = SliceIndex(slices)
        self.classes = {c.name: c for c in (parse_device_class(o) for o in builtin_device_classes())}

    def allocate(
        self, claim: Mapping[str, Any], allocated: Iterable[Mapping[str, Any]]
    ) -> list[dict[str, Any]] | None:
        """The claim's `status.allocation.devices.results`, or None when it does not fit beside `allocated`
        (claims as the API server holds them, with status.allocation)."""
        [explanation] = explain(
            [[claim_from_object(claim)]],
            self.classes,
            self.index,
            [self.node],
            Existing.from_claims(allocated),
        )
        if not explanation.allocatable:
            return None
        return [result_json(r) for r in explanation.results]
