"""The fault schedule (no node): it knows every named fault point the plugin has, arms the unreached ones
first, only where the node's claim kinds can reach them, and cycles once all are reached."""

from __future__ import annotations

import re
from pathlib import Path

from tests.soak.fault_schedule import FAULT_POINTS, REACHED_BY, next_point
from tests.soak.profiles import PROFILES

REPO = Path(__file__).resolve().parents[2]
POINT_CALL = re.compile(r"""(?:faults\.reached|_faults)\(f?"([^"]+)\"""")


def test_the_schedule_knows_every_fault_point_in_the_plugin() -> None:
    found: set[str] = set()
    for path in (REPO / "dra_gpu").rglob("*.py"):
        for name in POINT_CALL.findall(path.read_text()):
            # the group points are numbered: the soak's claims have one or two config groups
            found |= {name.replace("{group_index}", "0").replace("{len(remaining)}", "0")}
            if "{" in name:
                found.add(name.replace("{group_index}", "1").replace("{len(remaining)}", "1"))
    assert found == set(FAULT_POINTS)


def test_every_point_is_reachable_on_some_soak_node() -> None:
    kinds = {kind for profile in PROFILES.values() for kind in profile.kinds}
    assert all(REACHED_BY[p].kinds & kinds for p in FAULT_POINTS)


def test_the_next_point_is_the_first_unreached_one_the_node_can_reach() -> None:
    h100, a100 = PROFILES["dgx-h100"].kinds, PROFILES["dgx-a100"].kinds
    assert next_point(h100, {}, 0) == FAULT_POINTS[0]
    reached = dict.fromkeys(FAULT_POINTS[:3], 1)
    assert next_point(h100, reached, 7) == FAULT_POINTS[3]
    # the A100 node has no claim with two config groups: those points wait for an H100 node
    assert next_point(a100, reached, 7) == "prepare-cdi-written"


def test_once_every_point_is_reached_the_schedule_cycles() -> None:
    kinds = PROFILES["dgx-h100"].kinds
    everything = dict.fromkeys(FAULT_POINTS, 1)
    assert [next_point(kinds, everything, n) for n in range(len(FAULT_POINTS))] == list(FAULT_POINTS)
