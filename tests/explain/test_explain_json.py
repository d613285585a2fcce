"""`explain -o json` over a fleet streams the rejections of nodes carried over from an identical node from one
encoding of the searched node's list: the text must be what json.dumps writes for the whole document."""

from __future__ import annotations

import io
import json
from typing import Any

from dra_gpu.allocator.explain import ClaimExplanation
from dra_gpu.allocator.node_equivalence import RenamedRejections
from dra_gpu.allocator.replicate import replicate_slices
from dra_gpu.cli.explain_json import rejection_json, write_json
from tests.allocator.builders import claim, consumes, device, exactly, resource_slice, run

# node-1 is a prefix of node-10 and of node-1-extra (a second pool of node-1): names must not bleed
NODES = ["node-1", "node-10", "node-2", "node-1.x", "node-7"]
MIG = "device.attributes['gpu.nvidia.com'].profile == '3g'"


def _template(*, complete: bool = True) -> list[dict[str, Any]]:
    """Per node two pools: its own (two GPUs, 3g devices that need the one s1 counter of their GPU) and
    `<node>-extra` with one more GPU; `complete=False` declares a slice of the first pool that is missing."""
    devices = []
    for gpu in range(2):
        counter_set = f"gpu-{gpu}-counter-set"
        devices.append(device(f"gpu-{gpu}", consumes=[consumes(counter_set, s1="1")]))
        for start in (0, 1):
            mig = device(
                f"gpu-{gpu}-mig-3g-{start}",
                "mig",
                attributes={"parentUUID": f"GPU-{gpu}", "profile": "3g"},
                consumes=[consumes(counter_set, s1="1")],
            )
            devices.append(mig)
    counters = {f"gpu-{g}-counter-set": {"s1": "1"} for g in range(2)}
    own = resource_slice("template-gpus", "template", devices, counters=counters, count=1 if complete else 2)
    extra = resource_slice("template-extra", "template", [device("gpu-9")], pool="template-extra")
    return [own, extra]


def _two_on_one() -> dict[str, Any]:
    return claim(
        "two-on-one",
        exactly("a", "mig.nvidia.com", selectors=[MIG]),
        exactly("b", "mig.nvidia.com", selectors=[MIG]),
        constraints=[{"requests": ["a", "b"], "matchAttribute": "gpu.nvidia.com/parentUUID"}],
    )


def _document(explanations: list[ClaimExplanation]) -> dict[str, Any]:
    return {
        "claims": [
            {"name": e.name, "requests": [{"name": r.name, "rejected": r.rejected} for r in e.requests]}
            for e in explanations
        ]
    }


def _materialized(explanations: list[ClaimExplanation]) -> dict[str, Any]:
    return {
        "claims": [
            {
                "name": e.name,
                "requests": [
                    {"name": r.name, "rejected": [rejection_json(x) for x in r.rejected]} for r in e.requests
                ],
            }
            for e in explanations
        ]
    }


def _written(document: dict[str, Any], indent: int | None) -> str:
    out = io.StringIO()
    write_json(document, out, indent=indent)
    return out.getvalue()


def _check(explanations: list[ClaimExplanation]) -> list[dict[str, str]]:
    runs = [run for e in explanations for r in e.requests for run in r.rejected.runs]
    assert any(isinstance(run, RenamedRejections) for run in runs), "no node was carried over"
    expected = _materialized(explanations)
    streamed = _written(_document(explanations), indent=None)
    assert streamed == json.dumps(expected) + "\n"
    assert json.loads(_written(_document(explanations), indent=2)) == expected
    rejected: list[dict[str, str]] = expected["claims"][0]["requests"][0]["rejected"]
    return rejected


def test_carried_over_rejections_are_written_as_each_node_names_its_own_devices() -> None:
    explained = run([_two_on_one()], replicate_slices(_template(), "template", NODES))
    assert not explained[0].allocatable
    rejected = _check(explained)
    devices = {r["device"] for r in rejected}
    for node in NODES:
        assert {f"{node}/gpu-0", f"{node}/gpu-1", f"{node}-extra/gpu-9"} <= devices, node


def test_reasons_that_name_the_node_name_each_node_in_its_own_entries() -> None:
    explained = run([_two_on_one()], replicate_slices(_template(complete=False), "template", NODES))
    rejected = _check(explained)
    reasons = {r["device"]: r["reason"] for r in rejected}
    for node in NODES:
        assert reasons[f"{node}/gpu-0"] == f"pool {node} is incomplete (1 of 2 slices)"
