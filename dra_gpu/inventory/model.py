"""The device model: what one node offers, in DRA terms, independent of the Kubernetes wire format.

Built by `dra_gpu.inventory.device_model.build_device_model` (pure) from a `DiscoveryResult`; turned into
ResourceSlices by `dra_gpu.slices.slice_builder`; read by the plugin to find out what a device name means.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

DRIVER_NAME = "gpu.nvidia.com"

# The list kinds (value: a non-empty tuple of items) are KEP-5491 list-typed attributes
# (DRAListTypeAttributes, alpha since Kubernetes 1.36). The slice builder publishes them as lists only where
# the cluster takes them, and otherwise a one-element list as its scalar (see slices/slice_builder.py).
AttributeKind = Literal["string", "int", "bool", "version", "strings", "ints", "bools", "versions"]


class DeviceKind(enum.Enum):
    GPU = "gpu"  # a whole GPU, exclusive
    MIG_STATIC = "mig-static"  # a MIG device that already exists on the GPU
    MIG_DYNAMIC = "mig-dynamic"  # a (profile, placement) that the plugin creates at prepare time
    GPU_SHARE = "gpu-share"  # a fractional share of one GPU (allowMultipleAllocations, consumable capacity)


@dataclass(frozen=True)
class Attribute:
    kind: AttributeKind
    value: str | int | bool | tuple[str, ...] | tuple[int, ...] | tuple[bool, ...]


@dataclass(frozen=True)
class RequestPolicy:
    """Consumable-capacity request policy (only on GPU_SHARE devices). Values are plain integers."""

    default: int | None = None
    valid_range_min: int | None = None
    valid_range_max: int | None = None
    valid_range_step: int | None = None
    valid_values: tuple[int, ...] = ()


@dataclass(frozen=True)
class Capacity:
    value: int  # bytes for memory, counts otherwise
    binary_si: bool = False  # render as "80Gi"-style quantity when True
    request_policy: RequestPolicy | None = None


@dataclass(frozen=True)
class CounterConsumption:
    counter_set: str  # "gpu-<minor>-counter-set"
    counters: Mapping[str, int]  # DNS-label counter name -> amount


@dataclass(frozen=True)
class CounterSet:
    name: str
    counters: Mapping[str, int]


@dataclass(frozen=True)
class MigSpec:
    """What a MIG device is made of. For static MIG the instance ids and uuid are known."""

    profile: str  # "1g.10gb"
    gi_profile_id: int
    placement_start: int
    placement_size: int
    uuid: str | None = None  # static MIG only
    gi_id: int | None = None  # static MIG only
    ci_id: int | None = None  # static MIG only


TaintEffect = Literal["NoSchedule", "NoExecute", "None"]


@dataclass(frozen=True)
class DeviceTaint:
    """A KEP-5055 device taint (published in `devices[].taints`)."""

    key: str  # label name, e.g. "gpu.nvidia.com/xid"
    value: str  # label value ("" for none), e.g. "79"
    effect: TaintEffect
    time_added: str | None = None  # RFC 3339 UTC, seconds; set by us so the server keeps it across updates


@dataclass(frozen=True)
class Device:
    name: str  # "gpu-0", "gpu-0-mig-1g10gb-19-3", "gpu-0-shared"
    kind: DeviceKind
    parent_uuid: str  # the physical GPU's UUID (the GPU itself for kind GPU)
    parent_minor: int
    attributes: Mapping[str, Attribute]  # published keys: "type", "resource.kubernetes.io/pciBusID", ...
    capacity: Mapping[str, Capacity]
    consumes_counters: tuple[CounterConsumption, ...] = ()
    allow_multiple_allocations: bool = False
    mig: MigSpec | None = None
    taints: tuple[DeviceTaint, ...] = ()  # health taints (`dra_gpu.inventory.device_health`)


@dataclass(frozen=True)
class DeviceModel:
    devices: tuple[Device, ...]
    counter_sets: tuple[CounterSet, ...] = field(default=())
    # what could not be published and why (GPUs that failed discovery, MIG enabled without devices, ...)
    warnings: tuple[str, ...] = field(default=())

    def by_name(self) -> dict[str, Device]:
        return {d.name: d for d in self.devices}
