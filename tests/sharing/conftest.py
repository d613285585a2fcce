"""Fixtures: `node` (a simulated H100), `make_node(hardware)` for other layouts; both check for leftovers."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sim_node import SimNode


@pytest.fixture
def make_node() -> Iterator[Callable[[str], SimNode]]:
    nodes: list[SimNode] = []

    def make(hardware: str) -> SimNode:
        node = SimNode(hardware)
        nodes.append(node)
        return node

    yield make
    left = [item for node in nodes for item in node.cleanup()]
    assert not left, f"the test left things behind: {left}"


@pytest.fixture
def node(make_node: Callable[[str], SimNode]) -> SimNode:
    return make_node("h100-80gb")
