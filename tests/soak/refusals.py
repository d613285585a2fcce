"""Why the plugin refused a prepare or failed a call: each error is matched to what can cause it, and is
explained only when that cause was there while the call ran: a fault in force (the API server away, a full
directory, a GPU off the bus, an MPS daemon killed: tests/soak/fault_timeline.py) or a documented conflict
with another claim that is prepared or in doubt (a shared device given another config; a GPU's shares used
the other way: an MPS client beside the bare device). Anything else is a violation: a refusal nobody can
explain is a bug that only looks like bad luck."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from tests.soak.fault_timeline import FaultTimeline
from tests.soak.kubelet_view import DeviceFacts, SoakClaim

# cause -> what its error says (from the plugin's messages; several may match one error)
CAUSES: dict[str, re.Pattern[str]] = {
    "api": re.compile(
        r"reading ResourceClaim|Max retries exceeded|Connection refused|Connection reset|RemoteDisconnected|"
        r"HTTPSConnectionPool|timed out"
    ),
    "disk": re.compile(r"disk full|No space left|Errno 28"),
    "gpu": re.compile(
        r"which node \S+ does not|is gone|not present on this node|GPU_IS_LOST|GPU is lost|fallen off|"
        r"off the bus|Unknown Error"
    ),
    "mps-daemon": re.compile(r"Cannot find MPS control daemon|did not become ready|MPS control command"),
    "config-conflict": re.compile(r"has conflicting configuration with already prepared claim"),
    "mode-mix": re.compile(r"shares of one GPU cannot mix the two"),
}
FAULT_CAUSES = ("api", "disk", "gpu", "mps-daemon")


def causes_of(error: str) -> list[str]:
    return [cause for cause, pattern in CAUSES.items() if pattern.search(error)]


def explain(
    error: str,
    claim: SoakClaim,
    others: Sequence[SoakClaim],
    facts: Mapping[str, DeviceFacts],
    timeline: FaultTimeline,
    window: tuple[float, float],
) -> str | None:
    """The cause that explains `error` for `claim` (a call from window[0] to window[1]), or None.
    `others`: the claims prepared or in doubt beside it."""
    for cause in causes_of(error):
        if cause in FAULT_CAUSES:
            # a daemon killed, a GPU gone or a full disk can each make an MPS daemon fail to answer
            kinds = ("mps-daemon", "gpu", "disk") if cause == "mps-daemon" else (cause,)
            if any(timeline.overlaps(kind, *window) for kind in kinds):
                return cause
        elif cause == "config-conflict":
            mine = {r["device"] for r in claim.results}
            if any(o.configs != claim.configs and mine & {r["device"] for r in o.results} for o in others):
                return cause
        elif cause == "mode-mix":
            gpus = claim.gpu_uuids(facts)
            if any(o.kind != "admin" and o.gpu_uuids(facts) & gpus for o in others):
                return cause
    return None
