"""Which kubelet call reaches each of the plugin's named fault points (dra_gpu/plugin/fault_injection.py, the
sharing manager's and MPS's), and the schedule that arms them in turn, so that a soak reaches every point by
design, not by chance: the next point armed is the first in FAULT_POINTS' order that this soak has not reached
yet and this node's claim kinds can reach (once all are reached, the cycle starts over)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from tests.soak.claim_kinds import KINDS

ANY = frozenset(KINDS) - {"admin"}
SHARES = frozenset({"fraction", "consumable-mps", "consumable-memory"})
OWN_DAEMON = frozenset({"mps", "mig-mps"})  # each prepare starts a daemon, each unprepare stops it
TWO_GROUPS = frozenset({"mixed"})
TIME_SLICED = frozenset({"time-slicing", "mixed"})


@dataclass(frozen=True)
class Reach:
    """A point is reached by `method` ("prepare" or "unprepare") on a claim of one of `kinds`; with
    `caps_change`, only where that call changes its GPU's shares server caps (a share leaving while a smaller
    one stays)."""

    method: str
    kinds: frozenset[str]
    caps_change: bool = False


REACHED_BY: Mapping[str, Reach] = {
    "prepare-started": Reach("prepare", ANY),
    "prepare-group-0-applied": Reach("prepare", ANY),
    "prepare-group-0": Reach("prepare", ANY),
    "prepare-group-1-applied": Reach("prepare", TWO_GROUPS),
    "prepare-group-1": Reach("prepare", TWO_GROUPS),
    "prepare-cdi-written": Reach("prepare", ANY),
    "prepare-completed": Reach("prepare", ANY),
    "unprepare-group-0": Reach("unprepare", ANY),
    "unprepare-group-1": Reach("unprepare", TWO_GROUPS),
    "unprepare-cdi-removed": Reach("unprepare", ANY),
    "time-slice-recorded": Reach("prepare", TIME_SLICED),
    "shares-client-added": Reach("prepare", SHARES),
    "shares-client-removed": Reach("unprepare", SHARES),
    "mps-record-written": Reach("prepare", OWN_DAEMON),
    "mps-shm-mounted": Reach("prepare", OWN_DAEMON),
    "mps-compute-mode-set": Reach("prepare", OWN_DAEMON),
    "mps-daemon-started": Reach("prepare", OWN_DAEMON),
    "mps-limits-set": Reach("prepare", OWN_DAEMON),
    "mps-daemon-placed": Reach("prepare", OWN_DAEMON),
    "mps-limits-recorded": Reach("unprepare", frozenset({"fraction"}), caps_change=True),
    "mps-quit-sent": Reach("unprepare", OWN_DAEMON),
    "mps-shm-unmounted": Reach("unprepare", OWN_DAEMON),
    "mps-modes-restored": Reach("unprepare", OWN_DAEMON),
}
FAULT_POINTS = tuple(REACHED_BY)


def next_point(kinds: Collection[str], reached: Mapping[str, int], armed_so_far: int) -> str:
    """The point to arm next on a node whose claims can be of `kinds`: the first not yet `reached` that one of
    them can reach; when all such are reached, the cycle goes on from `armed_so_far`."""
    feasible = [p for p in FAULT_POINTS if REACHED_BY[p].kinds & set(kinds)]
    for point in feasible:
        if not reached.get(point):
            return point
    return feasible[armed_so_far % len(feasible)]
