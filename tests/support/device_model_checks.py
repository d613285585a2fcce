"""Checks on a built `DeviceModel` that several test packages make the way the scheduler would."""

from __future__ import annotations

from collections.abc import Sequence

from dra_gpu.inventory.model import Device, DeviceModel


def fit_together(model: DeviceModel, devices: Sequence[Device]) -> bool:
    """Pure counter arithmetic, as the scheduler does it: can all `devices` be allocated together?"""
    available = {c.name: dict(c.counters) for c in model.counter_sets}
    for device in devices:
        for consumption in device.consumes_counters:
            for counter, amount in consumption.counters.items():
                available[consumption.counter_set][counter] -= amount
    return all(v >= 0 for counters in available.values() for v in counters.values())


def memory_slices(device: Device) -> set[int]:
    """The memory slices a MIG device's placement covers."""
    assert device.mig is not None
    return set(range(device.mig.placement_start, device.mig.placement_start + device.mig.placement_size))
