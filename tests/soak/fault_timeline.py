"""When each fault the soak injected was in force (`FaultTimeline`): the API server away, a directory full, a
GPU off the bus, an MPS daemon killed. A refusal or a failed call is explained only by a fault in force while
the call ran (tests/soak/refusals.py); some faults reach a little past their end, for as long as the plugin
needs to see that they are over (GRACE_S)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# How long after its end a fault may still explain a refusal: a GPU back is seen at the plugin's next
# rediscovery (REDISCOVERY_INTERVAL=2 in the soak), a killed daemon is restarted by the next reconcile passes
# (0.5 s apart, each waiting for the daemon to answer); the API server back is seen at the next request.
GRACE_S = {"gpu": 6.0, "mps-daemon": 6.0, "api": 1.0, "disk": 0.5}


@dataclass
class FaultTimeline:
    # kind ("api", "disk", "gpu", "mps-daemon") -> [start, end or None] of each time it was in force
    spans: dict[str, list[list[float | None]]] = field(default_factory=dict)

    def begin(self, kind: str, lasts_s: float | None = None) -> None:
        """The fault starts now; `lasts_s`: it ends by itself that long after (a killed daemon restarted)."""
        now = time.monotonic()
        self.spans.setdefault(kind, []).append([now, None if lasts_s is None else now + lasts_s])

    def end(self, kind: str) -> None:
        for span in self.spans.get(kind, []):
            if span[1] is None:
                span[1] = time.monotonic()

    def active(self, kind: str) -> bool:
        return self.overlaps(kind, time.monotonic(), time.monotonic())

    def overlaps(self, kind: str, start: float, end: float) -> bool:
        """Whether the fault was in force at any moment from `start` to `end` (its grace included)."""
        grace = GRACE_S.get(kind, 0.0)
        for begun, ended in self.spans.get(kind, []):
            if begun <= end and (ended is None or ended + grace >= start):
                return True
        return False
