"""The one interface through which the driver touches GPU hardware.

`dra_gpu.hardware.nvml_hardware.NvmlHardware` implements it on top of a `pynvml`-shaped module: the real
`pynvml` from `nvidia-ml-py`, or `dra_gpu.hardware.simulator` which stands in at the same function boundary.
Everything that needs the hardware (inventory discovery, the sharing actions) takes a `GpuHardware`.
"""

from __future__ import annotations

from typing import Protocol

from dra_gpu.hardware.types import ComputeMode, DiscoveryResult, MigInstance


class HardwareError(Exception):
    """A hardware operation failed. `message` names the GPU and the cause in words a user can act on."""

    def __init__(self, message: str, *, nvml_code: int | None = None) -> None:
        super().__init__(message)
        self.nvml_code = nvml_code

    @property
    def gpu_gone(self) -> bool:
        """The GPU is not there to be changed (lost, or no longer enumerated): what it needs waits for it."""
        return self.nvml_code in GPU_GONE_CODES


GPU_GONE_CODES = frozenset({6, 15})  # NVML_ERROR_NOT_FOUND, NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus


class GpuHardware(Protocol):
    def discover(self) -> DiscoveryResult:
        """Enumerate every GPU; a GPU that fails is reported in `errors`, never raised."""
        ...

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> None:
        """Raise HardwareError when the change needs a GPU reset (Ampere) instead of waiting for one."""
        ...

    def create_mig_device(self, gpu_uuid: str, gi_profile_id: int, placement_start: int) -> MigInstance:
        """Create GPU instance + compute instance at exactly this placement (enabling MIG mode where allowed).

        On failure nothing is left behind (a created GPU instance is destroyed again).
        """
        ...

    def destroy_mig_device(self, gpu_uuid: str, gi_id: int, ci_id: int) -> None:
        """Destroy compute instance then GPU instance. Already gone counts as success."""
        ...

    def list_mig_devices(self, gpu_uuid: str) -> list[MigInstance]: ...

    def set_compute_mode(self, gpu_uuid: str, mode: ComputeMode) -> None: ...

    def get_compute_mode(self, gpu_uuid: str) -> ComputeMode: ...

    def set_time_slice(self, gpu_uuid: str, interval: int) -> None:
        """`nvidia-smi compute-policy -i <uuid> --set-timeslice <interval>` (0=Default .. 3=Long)."""
        ...

    def driver_root(self) -> str:
        """Host path of the driver root (binaries, libraries, device nodes) used for CDI and tools."""
        ...
