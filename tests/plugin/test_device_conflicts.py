"""Which pairs of allocated devices share hardware (the plugin's last-line-of-defence check)."""

from __future__ import annotations

import pytest

from dra_gpu.inventory.model import Device, DeviceKind, MigSpec
from dra_gpu.plugin.device_conflicts import devices_conflict


def gpu(minor: int) -> Device:
    return Device(f"gpu-{minor}", DeviceKind.GPU, f"GPU-{minor}", minor, {}, {})


def share(minor: int) -> Device:
    return Device(
        f"gpu-{minor}-shared",
        DeviceKind.GPU_SHARE,
        f"GPU-{minor}",
        minor,
        {},
        {},
        allow_multiple_allocations=True,
    )


def mig(minor: int, start: int, size: int, kind: DeviceKind = DeviceKind.MIG_DYNAMIC) -> Device:
    return Device(
        f"gpu-{minor}-mig-{start}-{size}",
        kind,
        f"GPU-{minor}",
        minor,
        {},
        {},
        mig=MigSpec("p", 19, start, size),
    )


@pytest.mark.parametrize(
    ("a", "b", "conflict"),
    [
        (gpu(0), gpu(0), True),
        (gpu(0), gpu(1), False),
        (gpu(0), mig(0, 3, 1), True),
        (gpu(0), share(0), True),
        (share(0), share(0), False),  # allowMultipleAllocations
        (share(0), mig(0, 0, 1), True),
        (share(0), share(1), False),
        (mig(0, 0, 4), mig(0, 2, 2), True),  # overlapping memory slices
        (mig(0, 0, 4), mig(0, 4, 4), False),
        (mig(0, 2, 1), mig(0, 2, 1, DeviceKind.MIG_STATIC), True),
        (mig(0, 2, 1), mig(1, 2, 1), False),
    ],
)
def test_devices_conflict(a: Device, b: Device, conflict: bool) -> None:
    assert devices_conflict(a, b) is conflict
    assert devices_conflict(b, a) is conflict
