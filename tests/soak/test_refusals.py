"""Explaining a refusal (no node): a fault explains it only while it was in force during the call (with the
grace the plugin needs to see it end), a conflict only with a live claim it conflicts with, and a text that
names no known cause is never explained."""

from __future__ import annotations

import time

from tests.soak.fault_timeline import FaultTimeline
from tests.soak.kubelet_view import DeviceFacts, SoakClaim
from tests.soak.refusals import explain

FACTS = {
    "gpu-0": DeviceFacts("gpu-0", "gpu", "GPU-0", None),
    "gpu-1": DeviceFacts("gpu-1", "gpu", "GPU-1", None),
}
API = "claim soak/c1: reading ResourceClaim soak/c1: HTTPSConnectionPool(host='::1'): Max retries exceeded"
CONFLICT = (
    "claim soak/c1: requested device gpu-0 has conflicting configuration with already prepared claim soak/c2"
)
MPS_A = {
    "opaque": {
        "parameters": {"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25}}}
    }
}
MPS_B = {
    "opaque": {
        "parameters": {"sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}}
    }
}


def claim(index: int, device: str, configs: list[dict[str, object]] | None = None) -> SoakClaim:
    results = [{"request": "gpu", "device": device}]
    return SoakClaim(index, "consumable-mps", f"c{index}", "soak", f"uid-{index}", results, configs or [])


def test_a_fault_explains_a_refusal_only_while_it_was_in_force() -> None:
    timeline = FaultTimeline()
    before = time.monotonic()
    assert explain(API, claim(1, "gpu-0"), [], FACTS, timeline, (before, before + 0.1)) is None
    timeline.begin("api")
    now = time.monotonic()
    assert explain(API, claim(1, "gpu-0"), [], FACTS, timeline, (now, now + 0.1)) == "api"
    timeline.end("api")
    later = time.monotonic() + 5  # past the API server's grace
    assert explain(API, claim(1, "gpu-0"), [], FACTS, timeline, (later, later + 0.1)) is None
    assert explain("disk full", claim(1, "gpu-0"), [], FACTS, timeline, (now, now + 0.1)) is None


def test_a_config_conflict_needs_a_live_claim_on_the_same_device_with_another_config() -> None:
    timeline = FaultTimeline()
    mine = claim(1, "gpu-0", [MPS_A])
    window = (time.monotonic(), time.monotonic())
    assert explain(CONFLICT, mine, [claim(2, "gpu-0", [MPS_B])], FACTS, timeline, window) == "config-conflict"
    assert explain(CONFLICT, mine, [claim(2, "gpu-0", [MPS_A])], FACTS, timeline, window) is None
    assert explain(CONFLICT, mine, [claim(2, "gpu-1", [MPS_B])], FACTS, timeline, window) is None


def test_an_error_that_names_no_known_cause_is_never_explained() -> None:
    timeline = FaultTimeline()
    for kind in ("api", "disk", "gpu", "mps-daemon"):
        timeline.begin(kind)
    window = (time.monotonic(), time.monotonic())
    assert (
        explain("sharing setup failed: KeyError('x')", claim(1, "gpu-0"), [], FACTS, timeline, window) is None
    )
