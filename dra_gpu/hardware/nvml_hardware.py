"""`GpuHardware` on top of a `pynvml`-shaped module.

Only pynvml calls (plus `nvidia-smi` for the time-slice, which NVML cannot set, and sysfs for the PCIe root),
so the
same code runs on real GPUs with `pynvml` and in tests with `dra_gpu.hardware.simulator.SimulatedNvml`.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from collections.abc import Callable
from typing import Any

from dra_gpu.hardware import driver_layout
from dra_gpu.hardware.interface import HardwareError
from dra_gpu.hardware.types import (
    ComputeMode,
    DiscoveryError,
    DiscoveryResult,
    GpuInfo,
    MigGpuInstance,
    MigInstance,
    MigPlacement,
    MigProfileInfo,
    normalize_bus_id,
)

ARCHITECTURE_NAMES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}
ARCH_HOPPER = 9
ARCH_UNKNOWN = 0xFFFFFFFF
# NVML_DEVICE_ADDRESSING_MODE_* -> the strings NVIDIA's driver publishes as `addressingMode` (go-nvlib's
# GetAddressingModeAsString: NONE -> "None", HMM -> "HMM", ATS -> "ATS").
ADDRESSING_MODE_NAMES = {0: "None", 1: "HMM", 2: "ATS"}
BRAND_NAMES = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}
# nvidia-smi's exit code for "the requested operation is not available on target device" (nvidia-smi(1)).
SMI_RC_NOT_SUPPORTED = 3
SMI_RC_GPU_LOST = 15  # nvidia-smi(1) RETURN VALUE: the GPU has fallen off the bus (or is inaccessible)
# CUDA cores per SM by compute capability: NVML reports cores (nvmlDeviceGetNumGpuCores), not SMs.
_CORES_PER_SM_BY_MAJOR = {6: 64, 7: 64, 8: 64, 9: 128, 10: 128, 12: 128}
_CORES_PER_SM_EXCEPTIONS = {(6, 1): 128, (6, 2): 128, (8, 6): 128, (8, 7): 128, (8, 9): 128}
# Compute-instance profile enum whose slice count equals the GPU instance's (one CI spanning the whole GI).
_CI_PROFILE_FOR_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
# NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1: the compute instance that spans a Hopper 1g.24gb (26 SMs, where
# profile 0 has a 1g's 16). `nvidia-smi mig -cgi 15,15,15 -C` on a GH200, driver 550.54.15 (2024-07-27,
# tests/hardware/data/real/nvidia-gh200-96gb-hbm3/cuanschutz-slurm-mig-log) made compute instances of it.
_CI_PROFILE_1_SLICE_REV1 = 7
# Every compute-instance profile a GPU instance's compute instances can have, in the order they are listed.
_CI_PROFILES = (*sorted(set(_CI_PROFILE_FOR_SLICES.values())), _CI_PROFILE_1_SLICE_REV1)


def cores_per_sm(capability: tuple[int, int]) -> int:
    return _CORES_PER_SM_EXCEPTIONS.get(capability, _CORES_PER_SM_BY_MAJOR.get(capability[0], 128))


class NvmlHardware:
    """The driver's view of the GPUs. Thread-safe: calls are serialized, as NVML MIG operations should be."""

    def __init__(
        self,
        nvml_module: Any,
        driver_root: str,
        *,
        sysfs_root: str = "/sys",
        run_command: Callable[[list[str]], subprocess.CompletedProcess[str]] | None = None,
    ) -> None:
        self._nvml = nvml_module
        self._driver_root = driver_root
        self._sysfs_root = sysfs_root
        self._run = run_command or _run_command
        self._lock = threading.RLock()
        self._initialized = False
        self._error_names = {
            getattr(nvml_module, n): n for n in dir(nvml_module) if n.startswith("NVML_ERROR_")
        }
        self._profile_cache: dict[str, tuple[MigProfileInfo, ...]] = {}

    # ---- plumbing ----
    def _ensure_init(self) -> None:
        if not self._initialized:
            self._nvml.nvmlInit()
            self._initialized = True

    def close(self) -> None:
        with self._lock:
            if self._initialized:
                self._nvml.nvmlShutdown()
                self._initialized = False

    def _code(self, err: Exception) -> int | None:
        value = getattr(err, "value", None)
        return value if isinstance(value, int) else None

    def _describe(self, err: Exception) -> str:
        code = self._code(err)
        return f"{self._error_names.get(code, 'NVML error')} ({code})" if code is not None else str(err)

    def _is(self, err: Exception, *names: str) -> bool:
        return self._code(err) in {getattr(self._nvml, n) for n in names}

    def _call(self, what: str, function: str, *args: Any) -> Any:
        """Call an NVML function; turn its error into a HardwareError that names `what` and the function."""
        try:
            return getattr(self._nvml, function)(*args)
        except self._nvml.NVMLError as err:
            raise HardwareError(
                f"{what}: {function} failed: {self._describe(err)}", nvml_code=self._code(err)
            ) from err

    def _call_if_offered(self, what: str, function: str, *args: Any) -> Any | None:
        """`_call`, but None where the GPU does not offer what is asked for (a MIG profile it lacks:
        NOT_SUPPORTED or INVALID_ARGUMENT)."""
        try:
            return getattr(self._nvml, function)(*args)
        except self._nvml.NVMLError as err:
            if self._is(err, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT"):
                return None
            raise HardwareError(
                f"{what}: {function} failed: {self._describe(err)}", nvml_code=self._code(err)
            ) from err

    def _handle(self, gpu_uuid: str) -> Any:
        self._ensure_init()
        return self._call(f"GPU {gpu_uuid}", "nvmlDeviceGetHandleByUUID", gpu_uuid)

    def nvml_module(self) -> Any:
        """The NVML module (pynvml or the simulator) for callers that need calls this class does not wrap
        (the health monitor's event set, which must not wait under this class's lock)."""
        return self._nvml

    def driver_root(self) -> str:
        return self._driver_root

    # ---- discovery ----
    def discover(self) -> DiscoveryResult:
        with self._lock:
            try:
                self._ensure_init()
                driver_version = str(self._call("driver", "nvmlSystemGetDriverVersion"))
                cuda = int(self._call("driver", "nvmlSystemGetCudaDriverVersion_v2"))
                count = int(self._call("driver", "nvmlDeviceGetCount"))
            except HardwareError as err:
                return DiscoveryResult("", (0, 0), (), (DiscoveryError(None, str(err)),))
            gpus: list[GpuInfo] = []
            errors: list[DiscoveryError] = []
            for index in range(count):
                try:
                    gpus.append(self._read_gpu(index))
                except HardwareError as err:
                    errors.append(DiscoveryError(index, str(err)))
            return DiscoveryResult(
                driver_version, (cuda // 1000, (cuda % 1000) // 10), tuple(gpus), tuple(errors)
            )

    def _read_gpu(self, index: int) -> GpuInfo:
        what = f"GPU {index}"
        h = self._call(what, "nvmlDeviceGetHandleByIndex", index)
        uuid = str(self._call(what, "nvmlDeviceGetUUID", h))
        what = f"GPU {index} ({uuid})"
        arch = int(self._call(what, "nvmlDeviceGetArchitecture", h))
        major, minor = self._call(what, "nvmlDeviceGetCudaComputeCapability", h)
        capability = (int(major), int(minor))
        bus_id = normalize_bus_id(self._call(what, "nvmlDeviceGetPciInfo_v3", h).busId)
        mig_capable, mig_current, mig_pending = self._mig_mode(what, h)
        profiles = self._mig_profiles(what, uuid, h) if mig_capable else ()
        instances, empty = self._list_gpu_instances(what, uuid, h) if mig_current else ([], [])
        return GpuInfo(
            index=index,
            minor=int(self._call(what, "nvmlDeviceGetMinorNumber", h)),
            uuid=uuid,
            product_name=str(self._call(what, "nvmlDeviceGetName", h)),
            brand=BRAND_NAMES.get(int(self._call(what, "nvmlDeviceGetBrand", h)), "Unknown"),
            architecture=ARCHITECTURE_NAMES.get(arch, "Unknown"),
            cuda_compute_capability=capability,
            memory_bytes=int(self._call(what, "nvmlDeviceGetMemoryInfo", h).total),
            multiprocessors=self._multiprocessors(what, h, capability, profiles),
            pci_bus_id=bus_id,
            pcie_root=self._pcie_root(bus_id),
            numa_node=self._numa_node(what, h),
            interconnect=self._interconnect(what, h),
            addressing_mode=self._addressing_mode(what, h),
            mig_capable=mig_capable,
            mig_enabled=mig_current,
            mig_pending=mig_pending,
            mig_toggle_without_reset=mig_capable and ARCH_HOPPER <= arch != ARCH_UNKNOWN,
            compute_mode=ComputeMode(int(self._call(what, "nvmlDeviceGetComputeMode", h))),
            mig_profiles=profiles,
            mig_instances=tuple(instances),
            mig_empty_gpu_instances=tuple(empty),
        )

    def _mig_mode(self, what: str, h: Any) -> tuple[bool, bool, bool]:
        try:
            current, pending = self._nvml.nvmlDeviceGetMigMode(h)
        except self._nvml.NVMLError as err:
            if self._is(err, "NVML_ERROR_NOT_SUPPORTED"):
                return False, False, False
            raise HardwareError(
                f"{what}: nvmlDeviceGetMigMode failed: {self._describe(err)}", nvml_code=self._code(err)
            ) from err
        enable = self._nvml.NVML_DEVICE_MIG_ENABLE
        return True, current == enable, pending == enable

    def _numa_node(self, what: str, h: Any) -> int | None:
        try:
            node = int(self._nvml.nvmlDeviceGetNumaNodeId(h))
        except self._nvml.NVMLError as err:
            if self._is(err, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"):
                return None
            raise HardwareError(f"{what}: nvmlDeviceGetNumaNodeId failed: {self._describe(err)}") from err
        return node if node >= 0 else None

    def _addressing_mode(self, what: str, h: Any) -> str | None:
        """HMM/ATS/None, or None (no attribute) where the driver lacks the call or the platform does not
        support it, as NVIDIA's driver does; any other failure fails the GPU, as it does there too."""
        try:
            mode = int(self._nvml.nvmlDeviceGetAddressingMode(h))
        except AttributeError:  # a pynvml older than the call
            return None
        except self._nvml.NVMLError as err:
            if self._is(err, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"):
                return None
            raise HardwareError(
                f"{what}: nvmlDeviceGetAddressingMode failed: {self._describe(err)}",
                nvml_code=self._code(err),
            ) from err
        if mode not in ADDRESSING_MODE_NAMES:
            raise HardwareError(f"{what}: nvmlDeviceGetAddressingMode returned unknown mode {mode}")
        return ADDRESSING_MODE_NAMES[mode]

    def _multiprocessors(
        self, what: str, h: Any, capability: tuple[int, int], profiles: tuple[MigProfileInfo, ...]
    ) -> int:
        try:
            return int(self._nvml.nvmlDeviceGetNumGpuCores(h)) // cores_per_sm(capability)
        except self._nvml.NVMLError as err:
            if not self._is(err, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"):
                raise HardwareError(
                    f"{what}: nvmlDeviceGetNumGpuCores failed: {self._describe(err)}"
                ) from err
        return max((p.multiprocessors for p in profiles), default=0)

    def _interconnect(self, what: str, h: Any) -> str | None:
        """ "nvswitch-0" when the GPU's NVLinks end at NVSwitches (one fabric per node), "nvlink" for direct
        GPU-GPU links, None for PCIe only."""
        for link in range(int(getattr(self._nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if int(self._nvml.nvmlDeviceGetNvLinkState(h, link)) != self._nvml.NVML_FEATURE_ENABLED:
                    continue
                remote = int(self._nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link))
            except self._nvml.NVMLError as err:
                if self._is(
                    err,
                    "NVML_ERROR_NOT_SUPPORTED",
                    "NVML_ERROR_INVALID_ARGUMENT",
                    "NVML_ERROR_FUNCTION_NOT_FOUND",
                ):
                    return None
                raise HardwareError(
                    f"{what}: nvmlDeviceGetNvLinkState failed: {self._describe(err)}"
                ) from err
            return "nvswitch-0" if remote == self._nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH else "nvlink"
        return None

    def _pcie_root(self, bus_id: str) -> str | None:
        """The PCIe root complex ("pci0000:00") from the device's sysfs path, as the Kubernetes helper
        does."""
        path = os.path.realpath(os.path.join(self._sysfs_root, "bus", "pci", "devices", bus_id))
        parts = path.split(os.sep)
        return next((p for p in parts if p.startswith("pci") and ":" in p), None)

    def _mig_profiles(self, what: str, uuid: str, h: Any) -> tuple[MigProfileInfo, ...]:
        cached = self._profile_cache.get(uuid)
        if cached is not None:
            return cached
        found: list[MigProfileInfo] = []
        for enum in range(int(self._nvml.NVML_GPU_INSTANCE_PROFILE_COUNT)):
            info = self._call_if_offered(
                f"{what} (GPU-instance profile {enum})", "nvmlDeviceGetGpuInstanceProfileInfo", h, enum
            )
            if info is None:
                continue
            placements = self._placements(what, h, int(info.id))
            size = placements[0].size if placements else int(info.sliceCount)
            found.append(
                MigProfileInfo(
                    name=_profile_name(info),
                    gi_profile_id=int(info.id),
                    compute_slices=int(info.sliceCount),
                    memory_slices=size,
                    memory_mib=int(info.memorySizeMB),
                    multiprocessors=int(info.multiprocessorCount),
                    copy_engines=int(info.copyEngineCount),
                    decoders=int(info.decoderCount),
                    encoders=int(info.encoderCount),
                    jpeg_engines=int(info.jpegCount),
                    ofa_engines=int(info.ofaCount),
                    max_instances=int(info.instanceCount),
                    placements=placements,
                )
            )
        result = tuple(found)
        self._profile_cache[uuid] = result
        return result

    def _placements(self, what: str, h: Any, profile_id: int) -> tuple[MigPlacement, ...]:
        count = ctypes.c_uint(0)
        fn = "nvmlDeviceGetGpuInstancePossiblePlacements"
        self._call(what, fn, h, profile_id, None, ctypes.byref(count))
        array = (self._nvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
        self._call(what, fn, h, profile_id, array, ctypes.byref(count))
        return tuple(MigPlacement(int(array[i].start), int(array[i].size)) for i in range(count.value))

    def _profile_by_id(self, what: str, uuid: str, h: Any, gi_profile_id: int) -> tuple[MigProfileInfo, Any]:
        """Our profile record plus NVML's own info struct for it (the create call takes the struct's id)."""
        profile = next(
            (p for p in self._mig_profiles(what, uuid, h) if p.gi_profile_id == gi_profile_id), None
        )
        if profile is None:
            raise HardwareError(f"{what}: no MIG profile with id {gi_profile_id}")
        return profile, self._call(what, "nvmlDeviceGetGpuInstanceProfileInfoById", h, gi_profile_id)

    # ---- MIG ----
    def _list_mig(self, what: str, uuid: str, h: Any) -> list[MigInstance]:
        return self._list_gpu_instances(what, uuid, h)[0]

    def _list_gpu_instances(
        self, what: str, uuid: str, h: Any
    ) -> tuple[list[MigInstance], list[MigGpuInstance]]:
        """The MIG devices (GPU instance + compute instance), and the GPU instances without one."""
        minor = int(self._call(what, "nvmlDeviceGetMinorNumber", h))
        devices: list[MigInstance] = []
        empty: list[MigGpuInstance] = []
        for profile in self._mig_profiles(what, uuid, h):
            count = ctypes.c_uint(0)
            gis = (self._nvml.c_nvmlGpuInstance_t * max(profile.max_instances, 1))()
            self._call(what, "nvmlDeviceGetGpuInstances", h, profile.gi_profile_id, gis, ctypes.byref(count))
            for gi in list(gis)[: count.value]:
                gi_info = self._call(what, "nvmlGpuInstanceGetInfo", gi)
                gi_placement = MigPlacement(int(gi_info.placement.start), int(gi_info.placement.size))
                found = len(devices)
                for ci_profile in _CI_PROFILES:
                    ci_count = ctypes.c_uint(0)
                    cis = (self._nvml.c_nvmlComputeInstance_t * 8)()
                    try:
                        self._nvml.nvmlGpuInstanceGetComputeInstances(
                            gi, ci_profile, cis, ctypes.byref(ci_count)
                        )
                    except self._nvml.NVMLError as err:
                        if self._is(err, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT"):
                            continue
                        raise HardwareError(
                            f"{what}: nvmlGpuInstanceGetComputeInstances failed: {self._describe(err)}"
                        ) from err
                    for ci in list(cis)[: ci_count.value]:
                        ci_info = self._call(what, "nvmlComputeInstanceGetInfo", ci)
                        devices.append(
                            MigInstance(
                                parent_uuid=uuid,
                                parent_minor=minor,
                                uuid=str(self._call(what, "nvmlDeviceGetUUID", ci_info.device)),
                                profile=profile.name,
                                gi_profile_id=profile.gi_profile_id,
                                gi_id=int(gi_info.id),
                                ci_id=int(ci_info.id),
                                placement=gi_placement,
                            )
                        )
                if len(devices) == found:
                    empty.append(MigGpuInstance(int(gi_info.id), profile.gi_profile_id, gi_placement))
        devices.sort(key=lambda d: (d.gi_id, d.ci_id))
        empty.sort(key=lambda g: g.gi_id)
        return devices, empty

    def list_mig_devices(self, gpu_uuid: str) -> list[MigInstance]:
        with self._lock:
            h = self._handle(gpu_uuid)
            what = f"GPU {gpu_uuid}"
            if not self._mig_mode(what, h)[1]:
                return []
            return self._list_mig(what, gpu_uuid, h)

    def _processes(self, h: Any, gi_ci: tuple[int, int] | None = None) -> str:
        """ "pid 123, pid 456 (MIG gi 1 ci 0)": the processes NVML lists on a GPU (or one of its MIG devices),
        for error messages; "" when none is listed or NVML cannot list them."""
        found: list[str] = []
        for function in (
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetMPSComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
        ):
            try:
                processes = getattr(self._nvml, function)(h)
            except (self._nvml.NVMLError, AttributeError):
                continue
            for p in processes:
                gi, ci = getattr(p, "gpuInstanceId", None), getattr(p, "computeInstanceId", None)
                if gi_ci is not None and (gi, ci) != gi_ci:
                    continue
                mig = (
                    f" (MIG gi {gi} ci {ci})" if gi_ci is None and gi is not None and gi != 0xFFFFFFFF else ""
                )
                text = f"pid {p.pid}{mig}"
                if text not in found:
                    found.append(text)
        return ", ".join(found)

    def set_mig_mode(self, gpu_uuid: str, enabled: bool) -> None:
        """Switch MIG mode; HardwareError if it did not take effect (nvml_code IN_USE: processes hold the GPU,
        RESET_REQUIRED: only a reset applies it). Either way NVML leaves the mode pending."""
        with self._lock:
            h = self._handle(gpu_uuid)
            what = f"GPU {gpu_uuid}"
            mode = self._nvml.NVML_DEVICE_MIG_ENABLE if enabled else self._nvml.NVML_DEVICE_MIG_DISABLE
            status = self._call(what, "nvmlDeviceSetMigMode", h, mode)
            if status == self._nvml.NVML_ERROR_IN_USE:
                # nvml.h, nvmlDeviceSetMigMode: the activation status is NVML_ERROR_IN_USE when the device
                # could not be unbound because it is not idle; "the caller ... is expected to idle the device
                # and retry".
                holders = self._processes(h)
                raise HardwareError(
                    f"{what}: MIG mode cannot be {'enabled' if enabled else 'disabled'} while the GPU is in "
                    f"use (processes: {holders or 'not listed by NVML'}); NVML switches MIG mode only on an "
                    "idle GPU",
                    nvml_code=self._nvml.NVML_ERROR_IN_USE,
                )
            # nvml.h: the switch may unbind or reset the device, so "attributes associated with the device,
            # such as minor number, might change. The caller of this API is expected to query such attributes
            # again": look the GPU up again by its UUID, which does not change.
            h = self._handle(gpu_uuid)
            current = self._mig_mode(what, h)[1]
            if current != enabled:
                raise HardwareError(
                    f"{what}: MIG mode {'enable' if enabled else 'disable'} is pending until the GPU is "
                    "reset "
                    "(this GPU cannot switch MIG mode at run time; reset it or set MIG mode out of "
                    "band)",
                    nvml_code=self._nvml.NVML_ERROR_RESET_REQUIRED,
                )

    def create_mig_device(self, gpu_uuid: str, gi_profile_id: int, placement_start: int) -> MigInstance:
        with self._lock:
            h = self._handle(gpu_uuid)
            what = f"GPU {gpu_uuid}"
            if not self._mig_mode(what, h)[1]:
                self.set_mig_mode(gpu_uuid, True)
                h = self._handle(gpu_uuid)  # the switch may have re-bound the GPU under another minor number
            profile, info = self._profile_by_id(what, gpu_uuid, h, gi_profile_id)
            placement = self._nvml.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = placement_start, profile.memory_slices
            where = f"{what}: MIG {profile.name} at placement {placement_start}:{profile.memory_slices}"
            gi = self._call(
                where, "nvmlDeviceCreateGpuInstanceWithPlacement", h, int(info.id), ctypes.byref(placement)
            )
            try:
                ci_info = self._spanning_ci_profile(
                    where, gi, profile.compute_slices, int(info.multiprocessorCount)
                )
                ci = self._call(where, "nvmlGpuInstanceCreateComputeInstance", gi, int(ci_info.id))
            except HardwareError:
                self._call(where, "nvmlGpuInstanceDestroy", gi)  # leave nothing behind
                raise
            try:
                gi_info = self._call(where, "nvmlGpuInstanceGetInfo", gi)
                ci_data = self._call(where, "nvmlComputeInstanceGetInfo", ci)
                mig_uuid = str(self._call(where, "nvmlDeviceGetUUID", ci_data.device))
                minor = int(self._call(where, "nvmlDeviceGetMinorNumber", h))
            except HardwareError:
                self._call(where, "nvmlComputeInstanceDestroy", ci)
                self._call(where, "nvmlGpuInstanceDestroy", gi)
                raise
            return MigInstance(
                gpu_uuid,
                minor,
                mig_uuid,
                profile.name,
                gi_profile_id,
                int(gi_info.id),
                int(ci_data.id),
                MigPlacement(int(gi_info.placement.start), int(gi_info.placement.size)),
            )

    def _spanning_ci_profile(self, where: str, gi: Any, slices: int, multiprocessors: int) -> Any:
        """The compute-instance profile that spans the GPU instance `gi`, all its slices and all its SMs: on
        a one-slice GPU instance with more SMs than a 1g (Hopper's 1g.24gb) that is 1-slice rev1, not
        profile 0 (`nvidia-smi mig -C` chose rev1 on a GH200, driver 550.54.15); else the profile of `slices`
        slices."""
        ci_enum = _CI_PROFILE_FOR_SLICES.get(slices)
        if ci_enum is None:
            raise HardwareError(f"{where}: no compute-instance profile spans {slices} slices")
        function = "nvmlGpuInstanceGetComputeInstanceProfileInfo"
        shared = self._nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        if slices == 1:
            rev1 = self._call_if_offered(where, function, gi, _CI_PROFILE_1_SLICE_REV1, shared)
            if (
                rev1 is not None
                and int(rev1.sliceCount) == 1
                and int(rev1.multiprocessorCount) == multiprocessors
            ):
                return rev1
        return self._call(where, function, gi, ci_enum, shared)

    def destroy_mig_device(self, gpu_uuid: str, gi_id: int, ci_id: int) -> None:
        with self._lock:
            h = self._handle(gpu_uuid)
            what = f"GPU {gpu_uuid}: MIG device gi={gi_id} ci={ci_id}"
            gone = ("NVML_ERROR_NOT_FOUND", "NVML_ERROR_NOT_SUPPORTED")  # not there / MIG off: nothing to do
            try:
                gi = self._nvml.nvmlDeviceGetGpuInstanceById(h, gi_id)
            except self._nvml.NVMLError as err:
                if self._is(err, *gone):
                    return
                raise HardwareError(
                    f"{what}: nvmlDeviceGetGpuInstanceById failed: {self._describe(err)}",
                    nvml_code=self._code(err),
                ) from err
            try:
                ci = self._nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
            except self._nvml.NVMLError as err:
                if not self._is(err, *gone):
                    raise HardwareError(
                        f"{what}: nvmlGpuInstanceGetComputeInstanceById failed: {self._describe(err)}",
                        nvml_code=self._code(err),
                    ) from err
            else:
                self._destroy_in_use_aware(what, "nvmlComputeInstanceDestroy", ci, h, (gi_id, ci_id))
            self._destroy_in_use_aware(what, "nvmlGpuInstanceDestroy", gi, h, (gi_id, ci_id))

    def _destroy_in_use_aware(
        self, what: str, function: str, target: Any, h: Any, gi_ci: tuple[int, int]
    ) -> None:
        """A destroy call; NVML_ERROR_IN_USE (processes still run on the MIG device) names those processes."""
        try:
            getattr(self._nvml, function)(target)
        except self._nvml.NVMLError as err:
            detail = self._describe(err)
            if self._is(err, "NVML_ERROR_IN_USE"):
                holders = self._processes(h, gi_ci)
                detail += f": processes still run on it ({holders or 'not listed by NVML'})"
            raise HardwareError(f"{what}: {function} failed: {detail}", nvml_code=self._code(err)) from err

    # ---- sharing knobs ----
    def set_compute_mode(self, gpu_uuid: str, mode: ComputeMode) -> None:
        with self._lock:
            self._call(f"GPU {gpu_uuid}", "nvmlDeviceSetComputeMode", self._handle(gpu_uuid), int(mode))

    def get_compute_mode(self, gpu_uuid: str) -> ComputeMode:
        with self._lock:
            return ComputeMode(
                int(self._call(f"GPU {gpu_uuid}", "nvmlDeviceGetComputeMode", self._handle(gpu_uuid)))
            )

    def set_time_slice(self, gpu_uuid: str, interval: int) -> None:
        """What NVIDIA's driver does: compute mode back to DEFAULT, then `compute-policy --set-timeslice`.

        Some boards (Tesla P4) refuse the second step; nvidia-smi then exits 3, which becomes a HardwareError
        with `nvml_code` NVML_ERROR_NOT_SUPPORTED so callers can tell "this GPU cannot" from "this failed".
        """
        if not 0 <= interval <= 3:
            raise HardwareError(
                f"GPU {gpu_uuid}: time-slice interval {interval} is not 0 (Default) .. 3 (Long)"
            )
        smi = driver_layout.binary_path(self._driver_root, "nvidia-smi")  # usr/bin, or bin/ on GKE
        for action, args in (
            ("set the compute mode to DEFAULT", ["-i", gpu_uuid, "-c", "DEFAULT"]),
            (
                f"set the time-slice interval to {interval}",
                ["compute-policy", "-i", gpu_uuid, "--set-timeslice", str(interval)],
            ),
        ):
            try:
                done = self._run([smi, *args])
            except FileNotFoundError as err:
                raise HardwareError(
                    f"GPU {gpu_uuid}: cannot run {smi}: not found under the driver root "
                    f"{self._driver_root!r} (where this process sees it: --container-driver-root, env "
                    "CONTAINER_DRIVER_ROOT, by default --nvidia-driver-root)"
                ) from err
            except OSError as err:
                raise HardwareError(f"GPU {gpu_uuid}: cannot run {smi}: {err}") from err
            if done.returncode == 0:
                continue
            output = (done.stderr or done.stdout).strip()
            command = f"'{smi} {' '.join(args)}' exited {done.returncode}: {output}"
            if done.returncode == SMI_RC_NOT_SUPPORTED:
                raise HardwareError(
                    f"GPU {gpu_uuid}: cannot {action}: this GPU does not support it ({command})",
                    nvml_code=getattr(self._nvml, "NVML_ERROR_NOT_SUPPORTED", None),
                )
            lost = done.returncode == SMI_RC_GPU_LOST
            raise HardwareError(
                f"GPU {gpu_uuid}: cannot {action}: {command}",
                nvml_code=getattr(self._nvml, "NVML_ERROR_GPU_IS_LOST", None) if lost else None,
            )


def _profile_name(info: Any) -> str:
    raw = getattr(info, "name", b"")
    name = raw.decode() if isinstance(raw, bytes) else str(raw)
    name = name.removeprefix("MIG ").strip()
    if name:
        return name
    return f"{info.sliceCount}g.{round(int(info.memorySizeMB) / 1024)}gb"  # v1 structs carry no name


def _run_command(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
