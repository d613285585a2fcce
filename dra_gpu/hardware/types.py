"""Plain values that describe what the hardware layer discovered.

These are the contract between `dra_gpu.hardware` (which fills them from NVML or the simulator) and every
pure module above it (`inventory`, `slices`, `sharing`, `allocator`). They hold no handles and do no I/O, so
they can be built by hand in tests and serialised into checkpoints.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


def normalize_bus_id(raw: str | bytes) -> str:
    """Any spelling of a PCI address -> the sysfs/Kubernetes form, 4-digit domain, lower case: NVML's
    "00000009:01:00.0", "0009:01:00.0" and (domain 0, as NVML and nvidia-smi read a missing one) "07:00.0".
    Text that is not an address comes back lower-cased, equal to no address."""
    text = (raw.decode() if isinstance(raw, bytes) else raw).strip().lower()
    parts = text.split(":")
    try:
        domain = int(parts[0], 16) if len(parts) == 3 else 0
    except ValueError:
        return text
    return f"{domain:04x}:{parts[-2]:0>2}:{parts[-1]}"


class ComputeMode(enum.IntEnum):
    """NVML compute modes (`NVML_COMPUTEMODE_*`)."""

    DEFAULT = 0
    EXCLUSIVE_THREAD = 1  # deprecated by NVIDIA, never set by us
    PROHIBITED = 2
    EXCLUSIVE_PROCESS = 3


@dataclass(frozen=True)
class MigPlacement:
    """A GPU-instance placement, in memory slices: `{start}:size` as `nvidia-smi mig -lgipp` prints it."""

    start: int
    size: int

    @property
    def memory_slices(self) -> range:
        return range(self.start, self.start + self.size)


@dataclass(frozen=True)
class MigProfileInfo:
    """One GPU-instance profile of a MIG-capable GPU (`nvmlDeviceGetGpuInstanceProfileInfo`)."""

    name: str  # "1g.10gb", "1g.10gb+me"
    gi_profile_id: int  # info.id as nvidia-smi prints it (19, 20, 15, 14, 9, 5, 0), not the NVML enum
    compute_slices: int  # sliceCount
    memory_slices: int  # placement size
    memory_mib: int  # memorySizeMB
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    max_instances: int  # instanceCount
    placements: tuple[MigPlacement, ...]  # every valid placement, empty GPU


@dataclass(frozen=True)
class MigInstance:
    """A MIG device that exists now (GPU instance + compute instance)."""

    parent_uuid: str
    parent_minor: int
    uuid: str  # "MIG-..."
    profile: str  # "1g.10gb"
    gi_profile_id: int
    gi_id: int
    ci_id: int
    placement: MigPlacement


@dataclass(frozen=True)
class MigGpuInstance:
    """A GPU instance without any compute instance (`nvidia-smi mig -cgi` without `-C`): no MIG device can be
    used, yet its memory slices are taken."""

    gi_id: int
    gi_profile_id: int
    placement: MigPlacement


@dataclass(frozen=True)
class GpuInfo:
    """Everything the driver needs to know about one physical GPU."""

    index: int  # NVML index: unstable across boots, never used in names
    minor: int  # /dev/nvidia<minor>: used in device names
    uuid: str
    product_name: str
    brand: str  # "Tesla", "NVIDIA", ...
    architecture: str  # "Ampere", "Hopper", "Ada Lovelace", "Turing", ...
    cuda_compute_capability: tuple[int, int]
    memory_bytes: int
    multiprocessors: int
    pci_bus_id: str  # "0000:07:00.0" (lower case, domain included)
    pcie_root: str | None  # "pci0000:00", None when unknown
    numa_node: int | None  # None when the platform reports none
    interconnect: str | None  # NVLink/NVSwitch domain id, e.g. "nvswitch-0"; None for PCIe-only GPUs
    mig_capable: bool
    mig_enabled: bool  # current MIG mode
    mig_pending: bool  # pending MIG mode (differs from current on Ampere until a reset)
    mig_toggle_without_reset: bool  # Hopper and newer
    compute_mode: ComputeMode
    mig_profiles: tuple[MigProfileInfo, ...] = ()
    mig_instances: tuple[MigInstance, ...] = ()
    mig_empty_gpu_instances: tuple[MigGpuInstance, ...] = ()  # GPU instances with no compute instance
    # "HMM", "ATS" or "None" (nvmlDeviceGetAddressingMode); None where the driver or platform reports none
    addressing_mode: str | None = None


@dataclass(frozen=True)
class DiscoveryError:
    """A GPU that could not be read; the others are still published."""

    gpu_index: int | None  # None for a failure that is not tied to one GPU
    message: str  # names the GPU and the cause


@dataclass(frozen=True)
class DiscoveryResult:
    driver_version: str  # as NVML reports it, e.g. "550.54.15"
    cuda_driver_version: tuple[int, int]  # (12, 4)
    gpus: tuple[GpuInfo, ...]
    errors: tuple[DiscoveryError, ...] = field(default=())


ALL_INSTANCES = 0xFFFFFFFF  # NVML's gpuInstanceId / computeInstanceId for an event about the whole GPU


@dataclass(frozen=True)
class XidEvent:
    """One NVML XID critical-error event (nvmlEventTypeXidCriticalError) on a physical GPU."""

    gpu_uuid: str
    xid: int
    gi_id: int = ALL_INSTANCES  # MIG GPU-instance id; ALL_INSTANCES: the whole GPU
    ci_id: int = ALL_INSTANCES
    gi_placement: tuple[int, int] | None = None  # (start, size) of that GPU instance, when it could be read
    time: float = 0.0  # unix seconds when the event was read

    @property
    def whole_gpu(self) -> bool:
        return self.gi_id == ALL_INSTANCES


@dataclass(frozen=True)
class GpuProbe:
    """How one GPU answers right now (the health monitor's recovery check)."""

    gpu_uuid: str
    answering: bool  # False: NVML calls on it fail (GPU_IS_LOST and the like)
    reset_required: bool  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION is not NONE (unknown counts as not required)
    error: str | None = None
    # The driver answered NVML_FI_DEV_GET_GPU_RECOVERY_ACTION. Without it (older drivers) `reset_required`
    # False proves nothing, and an XID taint waits for a reset to be seen instead.
    recovery_known: bool = False
