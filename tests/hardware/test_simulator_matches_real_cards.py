"""The simulator stands in for the GPU: its H100 and H200 must publish what the real cards publish.

tests/hardware/data/<profile>-real-slices.json is `dra-gpu slices --hardware real` run on that card (an NVIDIA
H100 80GB HBM3 on 2026-11-25, an NVIDIA H200 on 2026-11-26; driver 580.159.04, MIG disabled; the file's
`_source` says how), with the attributes that belong to one machine removed (UUIDs, PCI bus id, NUMA node,
driver and CUDA versions, addressing mode). The same command on the simulated profile must give the same
devices: names, the remaining attributes, capacities, the counters each MIG placement consumes, and the shared
counter sets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_gpu.cli.slices import main as slices_main

DATA = Path(__file__).parent / "data"
PER_MACHINE = {
    "uuid", "parentUUID", "driverVersion", "cudaDriverVersion", "addressingMode",
    "resource.kubernetes.io/pciBusID", "resource.kubernetes.io/numaNode",
}  # fmt: skip


def _comparable(items: list[dict[str, Any]]) -> dict[str, Any]:
    devices = {}
    counters = []
    for item in items:
        spec = item.get("spec", item)
        counters += spec.get("sharedCounters") or []
        for device in spec.get("devices") or []:
            device = dict(device)
            attributes = device.get("attributes") or {}
            device["attributes"] = {k: v for k, v in attributes.items() if k not in PER_MACHINE}
            devices[device["name"]] = device
    return {"devices": devices, "sharedCounters": counters}


@pytest.mark.parametrize("profile", ["h100-80gb", "h200-141gb"])
def test_the_simulated_card_publishes_what_the_real_card_publishes(
    profile: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(tmp_path / "root")
    argv = ["--hardware", profile, "--driver-root", root, "--node", "real-h100", "-o", "json"]
    assert slices_main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    simulated = _comparable(printed["items"] if isinstance(printed, dict) else printed)
    real = _comparable(json.loads((DATA / f"{profile}-real-slices.json").read_text())["slices"])
    assert sorted(simulated["devices"]) == sorted(real["devices"])
    for name, device in real["devices"].items():
        assert simulated["devices"][name] == device, name
    assert simulated["sharedCounters"] == real["sharedCounters"]
