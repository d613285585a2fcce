"""Health taints in ResourceSlices: wire form, per-device limits per release, the 64-device slice limit."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_gpu.hardware.loader import open_hardware
from dra_gpu.inventory.device_model import build_device_model
from dra_gpu.inventory.model import Device, DeviceKind, DeviceModel, DeviceTaint
from dra_gpu.slices.slice_builder import build_slices
from dra_gpu.slices.slice_validation import validate_slices


@pytest.fixture(scope="module")
def model() -> Iterator[DeviceModel]:
    root = Path(tempfile.mkdtemp(prefix="slt-", dir="/tmp"))
    try:
        hardware = open_hardware("dgx-h100", str(root))
        yield build_device_model(hardware.discover())
        hardware.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _taints(count: int) -> tuple[DeviceTaint, ...]:
    return tuple(
        DeviceTaint("gpu.nvidia.com/xid", str(40 + i), "NoSchedule", "2026-11-21T18:00:00Z")
        for i in range(count)
    )


def _with_taints(model: DeviceModel, minor: int, taints: tuple[DeviceTaint, ...]) -> DeviceModel:
    devices = tuple(replace(d, taints=taints) if d.parent_minor == minor else d for d in model.devices)
    return replace(model, devices=devices)


def _devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def test_taints_on_the_wire(model: DeviceModel) -> None:
    tainted = _with_taints(
        model,
        3,
        (
            DeviceTaint("gpu.nvidia.com/gpu-lost", "", "NoSchedule", "2026-11-21T18:00:00Z"),
            DeviceTaint("gpu.nvidia.com/xid", "13", "None", "2026-11-21T18:00:01Z"),
        ),
    )
    slices = build_slices(tainted, "node-a", (1, 36))
    assert validate_slices(slices, (1, 36)) == []
    devices = _devices(slices)
    assert devices["gpu-3"]["taints"] == [
        {"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule", "timeAdded": "2026-11-21T18:00:00Z"},
        {"key": "gpu.nvidia.com/xid", "value": "13", "effect": "None", "timeAdded": "2026-11-21T18:00:01Z"},
    ]
    assert "taints" in devices["gpu-3-shared"] and "taints" not in devices["gpu-2"]
    # 1.34 knows no effect None and allows 4 taints per device
    old = build_slices(tainted, "node-a", (1, 34))
    assert validate_slices(old, (1, 34)) == []
    assert [t["key"] for t in _devices(old)["gpu-3"]["taints"]] == ["gpu.nvidia.com/gpu-lost"]


@pytest.mark.parametrize(("version", "limit"), [((1, 36), 16), ((1, 35), 16), ((1, 34), 4)])
def test_taints_per_device_are_capped(model: DeviceModel, version: tuple[int, int], limit: int) -> None:
    slices = build_slices(_with_taints(model, 0, _taints(20)), "node-a", version)
    assert validate_slices(slices, version) == []
    assert len(_devices(slices)["gpu-0"]["taints"]) == limit
    too_many = build_slices(model, "node-a", version)
    for item in too_many:
        for device in item["spec"].get("devices") or []:
            if device["name"] == "gpu-0":
                device["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "1", "effect": "NoSchedule"}] * (
                    limit + 1
                )
    assert any(f"{limit + 1} taints, at most {limit}" in p for p in validate_slices(too_many, version))


def test_validation_rejects_bad_taints(model: DeviceModel) -> None:
    slices = build_slices(_with_taints(model, 0, _taints(1)), "node-a", (1, 36))
    device = _devices(slices)["gpu-0"]
    device["taints"] = [{"key": "bad key", "value": "-x", "effect": "Sometimes"}]
    problems = " ".join(validate_slices(slices, (1, 36)))
    assert "'bad key' is not a label name" in problems
    assert "'-x' is not a label value" in problems
    assert "'Sometimes'" in problems
    old = build_slices(model, "node-a", (1, 34))
    _devices(old)["gpu-0"]["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "13", "effect": "None"}]
    assert any("effect: 'None'" in p for p in validate_slices(old, (1, 34)))


def test_tainted_devices_split_at_64_per_slice() -> None:
    # one GPU with 100 devices and no counters: 128 fit one slice, but with taints only 64 do
    devices = tuple(Device(f"gpu-0-part-{i}", DeviceKind.GPU, "GPU-0", 0, {}, {}) for i in range(100))
    plain = DeviceModel(devices)
    assert [len(s["spec"]["devices"]) for s in build_slices(plain, "node-a")] == [100]
    tainted = replace(plain, devices=(replace(devices[0], taints=_taints(1)), *devices[1:]))
    slices = build_slices(tainted, "node-a")
    assert [len(s["spec"]["devices"]) for s in slices] == [64, 36]
    assert validate_slices(slices) == []
