"""Sharing problems -> device taints (pure).

The kubelet plugin's MPS reconcile loop reports, per physical GPU, what it could not fix: a prepared claim's
MPS control daemon that cannot be restarted, or cleanup left for later because the GPU was gone when its
claim was unprepared (a compute mode to restore). Every device of that GPU gets a `NoSchedule` taint, so no
new claim lands there, and the kubelet's health stream reports it unhealthy (`health_status`).

| taint key | value | effect |
|---|---|---|
| `gpu.nvidia.com/sharing` | `mps-daemon-failed` | `NoSchedule` |
| `gpu.nvidia.com/sharing` | `cleanup-pending` | `NoSchedule` |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from dra_gpu.inventory.device_health import format_time
from dra_gpu.inventory.model import DeviceModel, DeviceTaint

SHARING_TAINT_KEY = "gpu.nvidia.com/sharing"
MPS_DAEMON_FAILED = "mps-daemon-failed"
CLEANUP_PENDING = "cleanup-pending"


@dataclass(frozen=True)
class SharingProblem:
    value: str  # MPS_DAEMON_FAILED or CLEANUP_PENDING
    since: float  # unix seconds, first seen (the taint's timeAdded)
    detail: str = ""


def apply_sharing_problems(
    model: DeviceModel, problems: Mapping[str, tuple[SharingProblem, ...]]
) -> DeviceModel:
    """`model` with a sharing taint on every device of each GPU (uuid) that has problems; the same object
    when there are none."""
    if not problems:
        return model
    devices = []
    for device in model.devices:
        found = problems.get(device.parent_uuid, ())
        if not found:
            devices.append(device)
            continue
        added = tuple(
            DeviceTaint(
                key=SHARING_TAINT_KEY, value=p.value, effect="NoSchedule", time_added=format_time(p.since)
            )
            for p in sorted(found, key=lambda p: (p.since, p.value))
        )
        devices.append(replace(device, taints=(*device.taints, *added)))
    return replace(model, devices=tuple(devices))
