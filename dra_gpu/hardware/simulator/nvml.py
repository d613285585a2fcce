"""A `pynvml`-shaped object backed by the simulator state file.

`SimulatedNvml` has the functions of `pynvml` that the driver uses, with the same argument conventions (ctypes
out-arrays and `byref` counts), the same return shapes (pynvml's own ctypes structs, `str` for strings) and
the same
errors (`pynvml.NVMLError(code)`, which pynvml maps to its `NVMLError_*` subclasses). Every other attribute
(constants, structs, error classes) is pynvml's own, so code written against pynvml runs unchanged on it.

Behaviour modelled on hardware:
- GPU-instance placements must be one of the profile's valid starts (else INVALID_ARGUMENT) and must not
  overlap an
  existing instance (else INSUFFICIENT_RESOURCES); the instance count per profile is capped at
  `instanceCount`.
- GPU-instance ids follow the placement (swizzle id), compute-instance ids count from 0 inside a GPU instance.
- A GPU instance created without a placement goes where the real driver puts it, not at the first free start
  (profiles.default_placement_order); a compute instance of part of a GPU instance has the SMs of the plain
  GPU-instance profile of its size (profiles.compute_instance_multiprocessors).
- MIG calls on a GPU with MIG disabled fail with NOT_SUPPORTED; on a GPU without MIG with NOT_SUPPORTED.
- Profile and placement queries work whatever the MIG mode (the driver inspects them before enabling MIG).
- `nvmlDeviceSetMigMode`: Hopper+ switches immediately; Ampere only changes the pending mode (activation
  status RESET_REQUIRED) until `reset_gpu()`; disabling with instances present fails with IN_USE. A GPU with
  processes on it (simulator/contexts.py) is not idle: the mode becomes pending and the activation status is
  IN_USE. A switch that takes effect may renumber the GPU's minor (opt-in: `renumber_on_mig_switch`).
- A GPU instance with compute instances cannot be destroyed (IN_USE); neither can a GPU or compute instance
  with processes on its MIG devices (IN_USE).
- `nvmlDeviceGetComputeRunningProcesses` / `...MPSComputeRunningProcesses` / `...GraphicsRunningProcesses`
  list the registered contexts; a reset (`reset_gpu`) of a GPU with processes fails with IN_USE.
- Faults recorded in the state make a chosen function fail for a chosen GPU (`gpu-lost`: every function fails
  with GPU_IS_LOST).
- Events (`nvmlEventSetCreate`, `nvmlDeviceRegisterEvents`, `nvmlEventSetWait_v2`, `nvmlEventSetFree`): events
  raised by another process (`dra-gpu hardware xid`) are appended to the state file; an event set delivers, in
  order, those raised after its GPU registered, polling the state until the wait times out (TIMEOUT). An XID
  also sets the GPU's recovery action (`nvmlDeviceGetFieldValues` with NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) to
  GPU_RESET unless told otherwise; `recover_gpu` clears it and the GPU's faults (keeping the compute mode).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import pynvml

from dra_gpu.hardware import profiles
from dra_gpu.hardware.simulator import handles
from dra_gpu.hardware.simulator.handles import HandleRef
from dra_gpu.hardware.simulator.state import (
    ComputeInstanceState,
    Fault,
    GpuInstanceState,
    GpuState,
    SimState,
    StateStore,
    contexts_on,
    device_uuids,
    raise_event,
    renumber_minor,
)
from dra_gpu.hardware.types import normalize_bus_id

_T = TypeVar("_T")

MAX_MIG_DEVICES = 7
# First driver branch taken to have nvmlDeviceGetAddressingMode: R570 (CUDA 12.8). Unconfirmed, chosen so that
# the R535 layouts (single-t4, single-p4) show the FUNCTION_NOT_FOUND path and the R570 ones the call.
ADDRESSING_MODE_MIN_DRIVER = 570
_CORES_PER_SM = {
    profiles.ARCH_PASCAL: 128,  # GP10x with compute capability 6.1 (the only Pascal profile); GP100 has 64
    profiles.ARCH_TURING: 64,
    profiles.ARCH_AMPERE: 64,
    profiles.ARCH_ADA: 128,
    profiles.ARCH_HOPPER: 128,
}


ALL_INSTANCES = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of an event that concerns the whole GPU
SUPPORTED_EVENTS = (
    pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeXidCriticalError
)
_EVENT_POLL_S = 0.05  # how often a waiting event set re-reads the state file


class _EventSet:
    """Which GPUs registered which event types, and the seq of the last event delivered."""

    def __init__(self) -> None:
        self.masks: dict[int, int] = {}  # gpu index -> event type mask
        self.registered_at: dict[int, int] = {}  # gpu index -> event_seq when it registered
        self.cursor = 0


def _fail(code: int) -> NoReturn:
    raise pynvml.NVMLError(code)


def _set_out(ref: Any, value: int) -> None:
    """Write an integer through whatever pynvml callers pass as an out-count: byref(c_uint), pointer, or
    c_uint."""
    target = getattr(ref, "_obj", None)  # ctypes.byref(...) objects keep the referenced object here
    if target is None:
        target = ref.contents if hasattr(ref, "contents") else ref
    target.value = value


def _get_struct(ref: Any) -> Any:
    target = getattr(ref, "_obj", None)
    if target is not None:
        return target
    return ref.contents if isinstance(ref, ctypes._Pointer) else ref


class SimulatedNvml:
    """Stands in for the `pynvml` module. `state_path` is the JSON state file (created by
    `StateStore.initialize`)."""

    def __init__(
        self, state_path: str | os.PathLike[str], after_change: Callable[[SimState], None] | None = None
    ) -> None:
        self.store = StateStore(state_path)
        self._init_count = 0
        self._after_change = after_change  # e.g. keep the driver root's MIG capability files in step
        self._event_sets: dict[int, _EventSet] = {}
        self._next_event_set = 1
        # The GPUs of the last state read (the store hands out one object until the state changes): working
        # them out again for each of the ~700 NVML calls of a DGX discovery took ~15 ms of the plugin's start.
        self._gpus_of: tuple[SimState, tuple[profiles.SimulatedGpu, ...]] | None = None

    # ---- module-like fallbacks: constants, structs and errors are pynvml's own ----
    def __getattr__(self, name: str) -> Any:
        return getattr(pynvml, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(dir(pynvml)))

    # ---- plumbing ----
    def _state(self) -> SimState:
        if self._init_count <= 0:
            _fail(pynvml.NVML_ERROR_UNINITIALIZED)
        return self.store.read()

    def _gpus(self, state: SimState) -> tuple[profiles.SimulatedGpu, ...]:
        last = self._gpus_of
        if last is not None and last[0] is state:
            return last[1]
        gpus = profiles.simulated_gpus(state.layout(), state.seed)
        self._gpus_of = (state, gpus)
        return gpus

    def check_fault(self, gpu_index: int, function: str) -> None:
        """Apply the faults recorded for `function` on a GPU (the simulated tools use it for what they do
        without an NVML call of their own, e.g. nvidia-smi's time-slice)."""
        self._check_fault(self._state(), gpu_index, function)

    def _check_fault(self, state: SimState, gpu_index: int, function: str) -> None:
        for fault in state.faults:
            if fault.gpu_index == gpu_index and fault.function in (function, "*"):
                if fault.delay_s > 0:
                    time.sleep(fault.delay_s)
                if fault.error != pynvml.NVML_SUCCESS:
                    _fail(fault.error)

    def _device(self, handle: Any, function: str, *, allow_mig: bool = False) -> tuple[SimState, HandleRef]:
        state = self._state()
        ref = handles.decode(handle)
        if ref is None or ref.kind not in (handles.KIND_DEVICE, handles.KIND_MIG_DEVICE):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if ref.gpu_index >= len(state.gpus):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if ref.kind == handles.KIND_MIG_DEVICE:
            if not allow_mig:
                _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
            self._mig_instance(state, ref)  # stale MIG handles are invalid
        self._check_fault(state, ref.gpu_index, function)
        return state, ref

    def _gpu(self, state: SimState, ref: HandleRef) -> tuple[profiles.SimulatedGpu, GpuState]:
        return self._gpus(state)[ref.gpu_index], state.gpus[ref.gpu_index]

    @staticmethod
    def _find_gi(gpu: GpuState, gi_id: int) -> GpuInstanceState | None:
        return next((gi for gi in gpu.gpu_instances if gi.gi_id == gi_id), None)

    def _mig_instance(self, state: SimState, ref: HandleRef) -> tuple[GpuInstanceState, ComputeInstanceState]:
        gpu = state.gpus[ref.gpu_index]
        gi = self._find_gi(gpu, ref.gi_id)
        ci = next((c for c in gi.compute_instances if c.ci_id == ref.ci_id), None) if gi else None
        if gi is None or ci is None:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gi, ci

    def _gi_handle(self, handle: Any, function: str) -> tuple[SimState, HandleRef, GpuInstanceState]:
        state = self._state()
        ref = handles.decode(handle)
        if ref is None or ref.kind != handles.KIND_GPU_INSTANCE or ref.gpu_index >= len(state.gpus):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gi = self._find_gi(state.gpus[ref.gpu_index], ref.gi_id)
        if gi is None:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._check_fault(state, ref.gpu_index, function)
        return state, ref, gi

    def _mig_profile_by_id(self, gpu: profiles.SimulatedGpu, profile_id: int) -> profiles.MigProfileSpec:
        if not gpu.profile.mig_capable:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        spec = next((p for p in gpu.profile.mig_profiles if p.gi_profile_id == profile_id), None)
        if spec is None:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return spec

    def _require_mig_enabled(self, gpu: profiles.SimulatedGpu, gstate: GpuState) -> None:
        if not gpu.profile.mig_capable or not gstate.mig_current:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _mutate(self, gpu_index: int, function: str, change: Callable[[SimState, GpuState], _T]) -> _T:
        """Run `change` on a private copy of the state under the exclusive lock; saved only if it returns."""
        if self._init_count <= 0:
            _fail(pynvml.NVML_ERROR_UNINITIALIZED)
        with self.store.transaction() as state:
            self._check_fault(state, gpu_index, function)
            result = change(state, state.gpus[gpu_index])
            if self._after_change is not None:
                self._after_change(state)
            return result

    def _reap_dead_mps_servers(self) -> None:
        """Before NVML counts processes: an MPS server does not outlive its control daemon, and a daemon that
        was SIGKILLed could not drop its servers' contexts (mps_control.prune_dead_daemons), so they are
        dropped here; else a MIG device or GPU would stay "in use" by processes that are gone."""
        from dra_gpu.hardware.sim_driver_root import STATE_RELATIVE_PATH  # late: both import this module
        from dra_gpu.hardware.sim_tools.mps_control import prune_dead_daemons

        depth = len(STATE_RELATIVE_PATH.split("/"))
        if len(self.store.path.parents) > depth:  # a state file in a driver root (else no daemon has one)
            prune_dead_daemons(str(self.store.path.parents[depth - 1]))

    # ---- lifecycle and system ----
    def nvmlInitWithFlags(self, flags: int) -> None:
        self.store.read()  # a missing or corrupt state file fails here, like a missing driver
        self._init_count += 1

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> None:
        if self._init_count <= 0:
            _fail(pynvml.NVML_ERROR_UNINITIALIZED)
        self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self._state().layout().driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        layout = self._state().layout()
        return f"{layout.cuda_driver_version // 1000}.{layout.driver_version}"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self._state().layout().cuda_driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self._state().layout().cuda_driver_version

    # ---- enumeration ----
    def nvmlDeviceGetCount(self) -> int:
        return len(self._state().gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        state = self._state()
        if not 0 <= index < len(state.gpus):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handles.make(HandleRef(handles.KIND_DEVICE, index))

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        state = self._state()
        for index, gpu in enumerate(state.gpus):
            if gpu.uuid == wanted:
                return handles.make(HandleRef(handles.KIND_DEVICE, index))
            for gi in gpu.gpu_instances:
                for ci in gi.compute_instances:
                    if ci.uuid == wanted:
                        return handles.make(HandleRef(handles.KIND_MIG_DEVICE, index, gi.gi_id, ci.ci_id))
        _fail(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str | bytes) -> Any:
        # "0000:07:00.0", "00000000:07:00.0" and "07:00.0" name one device; two GH200s differ only by domain
        wanted = normalize_bus_id(bus_id)
        for gpu in self._gpus(self._state()):
            if gpu.sysfs_bus_id == wanted:
                return handles.make(HandleRef(handles.KIND_DEVICE, gpu.index))
        _fail(pynvml.NVML_ERROR_NOT_FOUND)

    # ---- identity ----
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        state, ref = self._device(handle, "nvmlDeviceGetUUID", allow_mig=True)
        if ref.kind == handles.KIND_MIG_DEVICE:
            return self._mig_instance(state, ref)[1].uuid
        return state.gpus[ref.gpu_index].uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        state, ref = self._device(handle, "nvmlDeviceGetName", allow_mig=True)
        gpu, _ = self._gpu(state, ref)
        if ref.kind == handles.KIND_MIG_DEVICE:
            gi, _ci = self._mig_instance(state, ref)
            return f"{gpu.profile.product_name} MIG {self._mig_profile_by_id(gpu, gi.profile_id).name}"
        return gpu.profile.product_name

    def nvmlDeviceGetBrand(self, handle: Any) -> int:
        state, ref = self._device(handle, "nvmlDeviceGetBrand", allow_mig=True)
        return self._gpu(state, ref)[0].profile.brand

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        state, ref = self._device(handle, "nvmlDeviceGetMinorNumber")
        gpu, gstate = self._gpu(state, ref)
        return gpu.minor if gstate.minor is None else gstate.minor

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        _state, ref = self._device(handle, "nvmlDeviceGetIndex")
        return ref.gpu_index

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        state, ref = self._device(handle, "nvmlDeviceGetMemoryInfo", allow_mig=True)
        gpu, _ = self._gpu(state, ref)
        if ref.kind == handles.KIND_MIG_DEVICE:
            gi, _ci = self._mig_instance(state, ref)
            total = self._mig_profile_by_id(gpu, gi.profile_id).memory_mib * 1024 * 1024
        else:
            total = gpu.profile.memory_mib * 1024 * 1024
        reserved = min(total // 100, 512 * 1024 * 1024)  # the driver keeps a little for itself
        if version:
            memory = pynvml.c_nvmlMemory_v2_t()
            memory.version = version
            memory.total, memory.reserved, memory.used, memory.free = total, reserved, 0, total - reserved
        else:
            memory = pynvml.c_nvmlMemory_t()
            memory.total, memory.used, memory.free = total, reserved, total - reserved
        return memory

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> Any:
        state, ref = self._device(handle, "nvmlDeviceGetPciInfo_v3")
        gpu, _ = self._gpu(state, ref)
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id.encode()
        info.busIdLegacy = gpu.pci_bus_id.encode()
        info.domain, info.bus, info.device = gpu.slot.pci_domain, gpu.slot.pci_bus, gpu.slot.pci_device
        info.pciDeviceId = gpu.profile.pci_device_id
        info.pciSubSystemId = (gpu.profile.pci_device_id & 0xFFFF0000) | 0x10DE
        return info

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return self.nvmlDeviceGetPciInfo_v3(handle)

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        state, ref = self._device(handle, "nvmlDeviceGetNumaNodeId")
        numa = self._gpu(state, ref)[0].slot.numa_node
        if numa is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return numa

    def nvmlDeviceGetAddressingMode(self, handle: Any) -> int:
        """pynvml returns the struct's `value` (NVML_DEVICE_ADDRESSING_MODE_*). Older drivers have no such
        symbol (FUNCTION_NOT_FOUND); nvml.h documents the call for Turing or newer on Linux, and a platform
        without the feature answers NOT_SUPPORTED."""
        state = self._state()
        layout = state.layout()
        if int(layout.driver_version.split(".", 1)[0]) < ADDRESSING_MODE_MIN_DRIVER:
            _fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)  # pynvml's symbol lookup fails before the call
        state, ref = self._device(handle, "nvmlDeviceGetAddressingMode")
        if (
            layout.addressing_mode is None
            or self._gpu(state, ref)[0].profile.architecture < profiles.ARCH_TURING
        ):
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return layout.addressing_mode

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        state, ref = self._device(handle, "nvmlDeviceGetCudaComputeCapability", allow_mig=True)
        return self._gpu(state, ref)[0].profile.cuda_compute_capability

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        state, ref = self._device(handle, "nvmlDeviceGetArchitecture", allow_mig=True)
        return self._gpu(state, ref)[0].profile.architecture

    def nvmlDeviceGetNumGpuCores(self, handle: Any) -> int:
        state, ref = self._device(handle, "nvmlDeviceGetNumGpuCores")
        profile = self._gpu(state, ref)[0].profile
        return profile.multiprocessors * _CORES_PER_SM[profile.architecture]

    def nvmlDeviceGetAttributes_v2(self, handle: Any) -> Any:
        """Engine counts of a MIG device (NVML supports only MIG device handles here)."""
        state, ref = self._device(handle, "nvmlDeviceGetAttributes_v2", allow_mig=True)
        if ref.kind != handles.KIND_MIG_DEVICE:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        gpu, _ = self._gpu(state, ref)
        gi, ci = self._mig_instance(state, ref)
        spec = self._mig_profile_by_id(gpu, gi.profile_id)
        attrs = pynvml.c_nvmlDeviceAttributes()
        attrs.multiprocessorCount = spec.multiprocessors * ci.slice_count // spec.compute_slices
        attrs.sharedCopyEngineCount, attrs.sharedDecoderCount = spec.copy_engines, spec.decoders
        attrs.sharedEncoderCount, attrs.sharedJpegCount, attrs.sharedOfaCount = (
            spec.encoders,
            spec.jpeg_engines,
            spec.ofa_engines,
        )
        attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount = spec.compute_slices, ci.slice_count
        attrs.memorySizeMB = spec.memory_mib
        return attrs

    def nvmlDeviceGetAttributes(self, handle: Any) -> Any:
        return self.nvmlDeviceGetAttributes_v2(handle)

    # ---- NVLink: every link of a GPU in an NVSwitch layout is up and ends at a switch ----
    def _nvlink(self, handle: Any, link: int, function: str) -> profiles.SimulatedGpu:
        state, ref = self._device(handle, function)
        gpu = self._gpus(state)[ref.gpu_index]
        if gpu.slot.interconnect is None or not gpu.profile.nvlinks:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < gpu.profile.nvlinks:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        self._nvlink(handle, link, "nvmlDeviceGetNvLinkState")
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        self._nvlink(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType")
        return int(pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)

    # ---- compute mode ----
    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        state, ref = self._device(handle, "nvmlDeviceGetComputeMode")
        return state.gpus[ref.gpu_index].compute_mode

    def nvmlDeviceSetComputeMode(self, handle: Any, mode: int) -> None:
        _state, ref = self._device(handle, "nvmlDeviceSetComputeMode")
        if mode not in (
            pynvml.NVML_COMPUTEMODE_DEFAULT,
            pynvml.NVML_COMPUTEMODE_PROHIBITED,
            pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
        ):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)

        def change(_s: SimState, gpu: GpuState) -> None:
            gpu.compute_mode = int(mode)

        self._mutate(ref.gpu_index, "nvmlDeviceSetComputeMode", change)

    # ---- MIG mode ----
    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        state, ref = self._device(handle, "nvmlDeviceGetMigMode")
        gpu, gstate = self._gpu(state, ref)
        if not gpu.profile.mig_capable:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [int(gstate.mig_current), int(gstate.mig_pending)]

    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        state, ref = self._device(handle, "nvmlDeviceSetMigMode")
        gpu, _ = self._gpu(state, ref)
        if not gpu.profile.mig_capable:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if mode not in (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        enable = mode == pynvml.NVML_DEVICE_MIG_ENABLE

        self._reap_dead_mps_servers()

        def change(s: SimState, gstate: GpuState) -> int:
            if not enable and gstate.gpu_instances:
                _fail(pynvml.NVML_ERROR_IN_USE)
            gstate.mig_pending = enable
            if gstate.mig_current == enable:
                return int(pynvml.NVML_SUCCESS)
            # nvml.h, nvmlDeviceSetMigMode: the call itself succeeds; its activationStatus says whether the
            # mode took effect. "if device unbind fails because the device isn't idle, NVML_ERROR_IN_USE would
            # be returned. The caller of this API is expected to idle the device and retry setting the mode."
            # The requested mode stays pending (nvmlDeviceGetMigMode returns current and pending).
            if contexts_on(s, device_uuids(gstate)):
                return int(pynvml.NVML_ERROR_IN_USE)
            if gpu.profile.mig_toggle_without_reset:
                self._switch_mig_mode(s, gstate)
                return int(pynvml.NVML_SUCCESS)
            return int(pynvml.NVML_ERROR_RESET_REQUIRED)

        return self._mutate(ref.gpu_index, "nvmlDeviceSetMigMode", change)

    def _switch_mig_mode(self, state: SimState, gstate: GpuState) -> None:
        """The pending MIG mode takes effect. nvml.h (nvmlDeviceSetMigMode): the device may be unbound or
        reset to activate it, "Thus, the attributes associated with the device, such as minor number, might
        change"; the simulator renumbers only when the state asks for it (renumber_on_mig_switch)."""
        if gstate.mig_current == gstate.mig_pending:
            return
        gstate.mig_current = gstate.mig_pending
        if state.renumber_on_mig_switch:
            renumber_minor(state, gstate, [g.minor for g in self._gpus(state)])

    def reset_gpu(self, gpu_index: int) -> None:
        """Simulated `nvidia-smi -r`: pending MIG mode becomes current, MIG instances vanish. nvidia-smi(1),
        -r/--gpu-reset: no application (CUDA, graphics, monitoring) may be using the GPU; a GPU with
        processes on it is refused here with IN_USE."""
        self._reap_dead_mps_servers()

        def change(state: SimState, gstate: GpuState) -> None:
            if contexts_on(state, device_uuids(gstate)):
                _fail(pynvml.NVML_ERROR_IN_USE)
            self._switch_mig_mode(state, gstate)
            gstate.gpu_instances = []
            gstate.compute_mode = 0
            state.resets += 1

        self._mutate(gpu_index, "reset", change)

    # ---- GPU-instance profiles and placements ----
    def _profile_info(self, gpu: profiles.SimulatedGpu, spec: profiles.MigProfileSpec, version: int) -> Any:
        info: Any = (
            pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
            if version == 2
            else (pynvml.c_nvmlGpuInstanceProfileInfo_t())
        )
        info.id = spec.gi_profile_id
        info.isP2pSupported = 0
        info.sliceCount = spec.compute_slices
        info.instanceCount = spec.max_instances
        info.multiprocessorCount = spec.multiprocessors
        info.copyEngineCount = spec.copy_engines
        info.decoderCount = spec.decoders
        info.encoderCount = spec.encoders
        info.jpegCount = spec.jpeg_engines
        info.ofaCount = spec.ofa_engines
        info.memorySizeMB = spec.memory_mib
        if version == 2:
            info.name = f"MIG {spec.name}".encode()
        return info

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> Any:
        state, ref = self._device(handle, "nvmlDeviceGetGpuInstanceProfileInfo")
        gpu, _ = self._gpu(state, ref)
        if version not in (1, 2):
            _fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        spec = next((p for p in gpu.profile.mig_profiles if p.gi_enum == profile), None)
        if spec is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._profile_info(gpu, spec, version)

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, profile: int, version: int = 2) -> Any:
        return self.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile, version)

    def nvmlDeviceGetGpuInstanceProfileInfoById(self, handle: Any, profile_id: int) -> Any:
        state, ref = self._device(handle, "nvmlDeviceGetGpuInstanceProfileInfoById")
        gpu, _ = self._gpu(state, ref)
        return self._profile_info(gpu, self._mig_profile_by_id(gpu, profile_id), 2)

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Any, profile_id: int, placements_ref: Any, count_ref: Any
    ) -> int:
        state, ref = self._device(handle, "nvmlDeviceGetGpuInstancePossiblePlacements")
        gpu, _ = self._gpu(state, ref)
        spec = self._mig_profile_by_id(gpu, profile_id)
        _set_out(count_ref, len(spec.starts))
        if placements_ref is not None:
            if len(placements_ref) < len(spec.starts):
                _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for i, start in enumerate(spec.starts):
                placements_ref[i].start, placements_ref[i].size = start, spec.memory_slices
        return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, handle: Any, profile_id: int) -> int:
        state, ref = self._device(handle, "nvmlDeviceGetGpuInstanceRemainingCapacity")
        gpu, gstate = self._gpu(state, ref)
        spec = self._mig_profile_by_id(gpu, profile_id)
        self._require_mig_enabled(gpu, gstate)
        return self._remaining_capacity(gpu, gstate, spec)

    def _remaining_capacity(
        self, gpu: profiles.SimulatedGpu, gstate: GpuState, spec: profiles.MigProfileSpec
    ) -> int:
        """How many more instances of `spec` fit, each where the driver would put it: not the free starts (a
        1g.12gb+me has seven starts but one instance; a real GH200 says "1/1", driver 550.54.15)."""
        trial = dataclasses.replace(gstate, gpu_instances=list(gstate.gpu_instances))
        count = 0
        for start in profiles.default_placement_order(spec):
            if self._placement_free(gpu, trial, spec, start) is None:
                gi_id = profiles.gpu_instance_id(start, spec.memory_slices)
                trial.gpu_instances.append(
                    GpuInstanceState(gi_id, spec.gi_profile_id, start, spec.memory_slices)
                )
                count += 1
        return count

    @staticmethod
    def _placement_free(
        gpu: profiles.SimulatedGpu, gstate: GpuState, spec: profiles.MigProfileSpec, start: int
    ) -> int | None:
        """None when a new instance of `spec` fits at `start`, else the NVML error code that says why not."""
        if start not in spec.starts:
            return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        wanted = set(range(start, start + spec.memory_slices))
        used_compute = 0
        for gi in gstate.gpu_instances:
            if wanted & set(range(gi.start, gi.start + gi.size)):
                return int(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            other = next(p for p in gpu.profile.mig_profiles if p.gi_profile_id == gi.profile_id)
            used_compute += other.compute_slices
        same = sum(1 for gi in gstate.gpu_instances if gi.profile_id == spec.gi_profile_id)
        if same >= spec.max_instances or used_compute + spec.compute_slices > profiles.COMPUTE_SLICES:
            return int(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        # engines that a profile needs all of (+me's OFA/JPEG on A100) are exclusive
        used_ofa = sum(
            next(p for p in gpu.profile.mig_profiles if p.gi_profile_id == gi.profile_id).ofa_engines
            for gi in gstate.gpu_instances
        )
        total_ofa = max(p.ofa_engines for p in gpu.profile.mig_profiles)
        if spec.ofa_engines and used_ofa + spec.ofa_engines > total_ofa:
            return int(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        return None

    def _create_gi(
        self, ref: HandleRef, spec: profiles.MigProfileSpec, start: int | None, function: str
    ) -> Any:
        gpu = self._gpus(self._state())[ref.gpu_index]

        def change(_s: SimState, gstate: GpuState) -> int:
            self._require_mig_enabled(gpu, gstate)
            if start is None:  # the driver's own choice, not first fit (profiles.default_placement_order)
                order = profiles.default_placement_order(spec)
                chosen = next((s for s in order if self._placement_free(gpu, gstate, spec, s) is None), None)
                if chosen is None:
                    _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            else:
                chosen = start
                problem = self._placement_free(gpu, gstate, spec, chosen)
                if problem is not None:
                    _fail(problem)
            gi_id = profiles.gpu_instance_id(chosen, spec.memory_slices)
            gstate.gpu_instances.append(
                GpuInstanceState(gi_id, spec.gi_profile_id, chosen, spec.memory_slices)
            )
            gstate.gpu_instances.sort(key=lambda g: g.gi_id)
            return gi_id

        gi_id = self._mutate(ref.gpu_index, function, change)
        return handles.make(HandleRef(handles.KIND_GPU_INSTANCE, ref.gpu_index, gi_id))

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profile_id: int, placement: Any) -> Any:
        state, ref = self._device(handle, "nvmlDeviceCreateGpuInstanceWithPlacement")
        gpu, _ = self._gpu(state, ref)
        spec = self._mig_profile_by_id(gpu, profile_id)
        wanted = _get_struct(placement)
        if wanted.size not in (0, spec.memory_slices):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._create_gi(ref, spec, int(wanted.start), "nvmlDeviceCreateGpuInstanceWithPlacement")

    def nvmlDeviceCreateGpuInstance(self, handle: Any, profile_id: int) -> Any:
        state, ref = self._device(handle, "nvmlDeviceCreateGpuInstance")
        gpu, _ = self._gpu(state, ref)
        return self._create_gi(
            ref, self._mig_profile_by_id(gpu, profile_id), None, "nvmlDeviceCreateGpuInstance"
        )

    def nvmlDeviceGetGpuInstances(
        self, handle: Any, profile_id: int, instances_ref: Any, count_ref: Any
    ) -> int:
        state, ref = self._device(handle, "nvmlDeviceGetGpuInstances")
        gpu, gstate = self._gpu(state, ref)
        self._mig_profile_by_id(gpu, profile_id)
        self._require_mig_enabled(gpu, gstate)
        found = [gi for gi in gstate.gpu_instances if gi.profile_id == profile_id]
        if instances_ref is not None:
            if len(instances_ref) < len(found):
                _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for i, gi in enumerate(found):
                instances_ref[i] = handles.make(HandleRef(handles.KIND_GPU_INSTANCE, ref.gpu_index, gi.gi_id))
        _set_out(count_ref, len(found))
        return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: int) -> Any:
        state, ref = self._device(handle, "nvmlDeviceGetGpuInstanceById")
        gpu, gstate = self._gpu(state, ref)
        self._require_mig_enabled(gpu, gstate)
        if self._find_gi(gstate, gi_id) is None:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return handles.make(HandleRef(handles.KIND_GPU_INSTANCE, ref.gpu_index, gi_id))

    def nvmlGpuInstanceGetInfo(self, gpu_instance: Any) -> Any:
        _state, ref, gi = self._gi_handle(gpu_instance, "nvmlGpuInstanceGetInfo")
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = handles.make(HandleRef(handles.KIND_DEVICE, ref.gpu_index))
        info.id, info.profileId = gi.gi_id, gi.profile_id
        info.placement.start, info.placement.size = gi.start, gi.size
        return info

    def nvmlGpuInstanceDestroy(self, gpu_instance: Any) -> int:
        self._reap_dead_mps_servers()
        _state, ref, _gi = self._gi_handle(gpu_instance, "nvmlGpuInstanceDestroy")

        def change(s: SimState, gstate: GpuState) -> None:
            gi = self._find_gi(gstate, ref.gi_id)
            if gi is None:
                _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if gi.compute_instances:
                _fail(pynvml.NVML_ERROR_IN_USE)
            # NVML_ERROR_IN_USE: "An operation cannot be performed because the GPU is currently in use"
            # (nvml.h); processes on the instance's MIG devices keep it in use.
            if contexts_on(s, device_uuids(gstate, gi.gi_id)):
                _fail(pynvml.NVML_ERROR_IN_USE)
            gstate.gpu_instances.remove(gi)

        self._mutate(ref.gpu_index, "nvmlGpuInstanceDestroy", change)
        return int(pynvml.NVML_SUCCESS)

    # ---- compute instances ----
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpu_instance: Any, profile: int, eng_profile: int, version: int = 2
    ) -> Any:
        state, ref, gi = self._gi_handle(gpu_instance, "nvmlGpuInstanceGetComputeInstanceProfileInfo")
        gpu = self._gpus(state)[ref.gpu_index]
        spec = self._mig_profile_by_id(gpu, gi.profile_id)
        if eng_profile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED or version not in (1, 2):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        slices = profiles.compute_instance_profiles(gpu.profile, spec).get(profile)
        if slices is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info: Any = (
            pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
            if version == 2
            else (pynvml.c_nvmlComputeInstanceProfileInfo_t())
        )
        info.id = profile
        info.sliceCount = slices
        info.instanceCount = spec.compute_slices // slices
        info.multiprocessorCount = profiles.compute_instance_multiprocessors(gpu.profile, spec, slices)
        info.sharedCopyEngineCount, info.sharedDecoderCount = spec.copy_engines, spec.decoders
        info.sharedEncoderCount, info.sharedJpegCount = spec.encoders, spec.jpeg_engines
        info.sharedOfaCount = spec.ofa_engines
        if version == 2:
            info.name = f"MIG {profiles.compute_instance_name(spec, slices)}".encode()
        return info

    def nvmlGpuInstanceGetComputeInstanceProfileInfoV(
        self, gpu_instance: Any, profile: int, eng_profile: int, version: int = 2
    ) -> Any:
        return self.nvmlGpuInstanceGetComputeInstanceProfileInfo(gpu_instance, profile, eng_profile, version)

    def nvmlGpuInstanceCreateComputeInstance(self, gpu_instance: Any, profile_id: int) -> Any:
        state, ref, gi0 = self._gi_handle(gpu_instance, "nvmlGpuInstanceCreateComputeInstance")
        gpu = self._gpus(state)[ref.gpu_index]
        spec = self._mig_profile_by_id(gpu, gi0.profile_id)
        slices = profiles.compute_instance_profiles(gpu.profile, spec).get(profile_id)
        if slices is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)

        def change(s: SimState, gstate: GpuState) -> int:
            gi = self._find_gi(gstate, ref.gi_id)
            if gi is None:
                _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if sum(c.slice_count for c in gi.compute_instances) + slices > spec.compute_slices:
                _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            used = {c.ci_id for c in gi.compute_instances}
            ci_id = next(i for i in range(16) if i not in used)
            s.mig_serial += 1
            uuid = profiles.mig_uuid(gstate.uuid, gi.gi_id, ci_id, s.mig_serial)
            gi.compute_instances.append(ComputeInstanceState(ci_id, profile_id, slices, uuid))
            gi.compute_instances.sort(key=lambda c: c.ci_id)
            return ci_id

        ci_id = self._mutate(ref.gpu_index, "nvmlGpuInstanceCreateComputeInstance", change)
        return handles.make(HandleRef(handles.KIND_COMPUTE_INSTANCE, ref.gpu_index, ref.gi_id, ci_id))

    def nvmlGpuInstanceGetComputeInstances(
        self, gpu_instance: Any, profile_id: int, instances_ref: Any, count_ref: Any
    ) -> int:
        _state, ref, gi = self._gi_handle(gpu_instance, "nvmlGpuInstanceGetComputeInstances")
        found = [c for c in gi.compute_instances if c.profile_id == profile_id]
        if instances_ref is not None:
            if len(instances_ref) < len(found):
                _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for i, ci in enumerate(found):
                instances_ref[i] = handles.make(
                    HandleRef(handles.KIND_COMPUTE_INSTANCE, ref.gpu_index, gi.gi_id, ci.ci_id)
                )
        _set_out(count_ref, len(found))
        return int(pynvml.NVML_SUCCESS)

    def nvmlGpuInstanceGetComputeInstanceById(self, gpu_instance: Any, ci_id: int) -> Any:
        _state, ref, gi = self._gi_handle(gpu_instance, "nvmlGpuInstanceGetComputeInstanceById")
        if not any(c.ci_id == ci_id for c in gi.compute_instances):
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return handles.make(HandleRef(handles.KIND_COMPUTE_INSTANCE, ref.gpu_index, gi.gi_id, ci_id))

    def _ci_handle(self, handle: Any, function: str) -> tuple[HandleRef, ComputeInstanceState]:
        state = self._state()
        ref = handles.decode(handle)
        if ref is None or ref.kind != handles.KIND_COMPUTE_INSTANCE or ref.gpu_index >= len(state.gpus):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _gi, ci = self._mig_instance(state, ref)
        self._check_fault(state, ref.gpu_index, function)
        return ref, ci

    def nvmlComputeInstanceGetInfo_v2(self, compute_instance: Any) -> Any:
        ref, ci = self._ci_handle(compute_instance, "nvmlComputeInstanceGetInfo_v2")
        info = pynvml.c_nvmlComputeInstanceInfo_t()
        info.device = handles.make(HandleRef(handles.KIND_MIG_DEVICE, ref.gpu_index, ref.gi_id, ci.ci_id))
        info.gpuInstance = handles.make(HandleRef(handles.KIND_GPU_INSTANCE, ref.gpu_index, ref.gi_id))
        info.id, info.profileId = ci.ci_id, ci.profile_id
        info.placement.start, info.placement.size = 0, ci.slice_count
        return info

    def nvmlComputeInstanceGetInfo(self, compute_instance: Any) -> Any:
        return self.nvmlComputeInstanceGetInfo_v2(compute_instance)

    def nvmlComputeInstanceDestroy(self, compute_instance: Any) -> int:
        self._reap_dead_mps_servers()
        ref, _ci = self._ci_handle(compute_instance, "nvmlComputeInstanceDestroy")

        def change(s: SimState, gstate: GpuState) -> None:
            gi = self._find_gi(gstate, ref.gi_id)
            ci = next((c for c in gi.compute_instances if c.ci_id == ref.ci_id), None) if gi else None
            if gi is None or ci is None:
                _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            # NVML_ERROR_IN_USE (nvml.h: "the GPU is currently in use"): a process runs on the MIG device
            if contexts_on(s, {ci.uuid}):
                _fail(pynvml.NVML_ERROR_IN_USE)
            gi.compute_instances.remove(ci)

        self._mutate(ref.gpu_index, "nvmlComputeInstanceDestroy", change)
        return int(pynvml.NVML_SUCCESS)

    # ---- processes (simulator/contexts.py registers them) ----
    def _processes(self, handle: Any, function: str, kinds: tuple[str, ...]) -> list[Any]:
        """pynvml's answer shape: a list of nvmlFriendlyObject with pid, usedGpuMemory, gpuInstanceId and
        computeInstanceId (0xFFFFFFFF both outside MIG). A GPU handle lists its MIG devices' processes too."""
        self._reap_dead_mps_servers()
        state, ref = self._device(handle, function, allow_mig=True)
        gstate = state.gpus[ref.gpu_index]
        if ref.kind == handles.KIND_MIG_DEVICE:
            uuids = device_uuids(gstate, ref.gi_id, ref.ci_id)
        else:
            uuids = device_uuids(gstate)
        where = {ci.uuid: (gi.gi_id, ci.ci_id) for gi in gstate.gpu_instances for ci in gi.compute_instances}
        found: list[Any] = []
        for context in contexts_on(state, uuids):
            if context.kind not in kinds:
                continue
            info = pynvml.c_nvmlProcessInfo_v3_t()
            info.pid = context.pid
            info.usedGpuMemory = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
            info.gpuInstanceId, info.computeInstanceId = where.get(context.device_uuid, (ALL_INSTANCES,) * 2)
            obj = pynvml.nvmlStructToFriendlyObject(info)
            obj.usedGpuMemory = None  # what pynvml does with NVML_VALUE_NOT_AVAILABLE
            found.append(obj)
        return found

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._processes(handle, "nvmlDeviceGetComputeRunningProcesses", ("compute", "mps-server"))

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> list[Any]:
        return self.nvmlDeviceGetComputeRunningProcesses(handle)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._processes(handle, "nvmlDeviceGetMPSComputeRunningProcesses", ("mps-client",))

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        return self._processes(handle, "nvmlDeviceGetGraphicsRunningProcesses", ("graphics",))

    # ---- MIG device handles ----
    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> Any:
        _state, ref = self._device(handle, "nvmlDeviceIsMigDeviceHandle", allow_mig=True)
        return ctypes.c_uint(int(ref.kind == handles.KIND_MIG_DEVICE))  # pynvml returns the c_uint itself

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        state, ref = self._device(handle, "nvmlDeviceGetMaxMigDeviceCount")
        if not self._gpu(state, ref)[0].profile.mig_capable:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return MAX_MIG_DEVICES

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        state, ref = self._device(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        gpu, gstate = self._gpu(state, ref)
        self._require_mig_enabled(gpu, gstate)
        devices = [(gi.gi_id, ci.ci_id) for gi in gstate.gpu_instances for ci in gi.compute_instances]
        if not 0 <= index < MAX_MIG_DEVICES:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(devices):
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        gi_id, ci_id = devices[index]
        return handles.make(HandleRef(handles.KIND_MIG_DEVICE, ref.gpu_index, gi_id, ci_id))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, mig_handle: Any) -> Any:
        _state, ref = self._device(mig_handle, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", allow_mig=True)
        if ref.kind != handles.KIND_MIG_DEVICE:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return handles.make(HandleRef(handles.KIND_DEVICE, ref.gpu_index))

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        _state, ref = self._device(handle, "nvmlDeviceGetGpuInstanceId", allow_mig=True)
        if ref.kind != handles.KIND_MIG_DEVICE:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return ref.gi_id

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        _state, ref = self._device(handle, "nvmlDeviceGetComputeInstanceId", allow_mig=True)
        if ref.kind != handles.KIND_MIG_DEVICE:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return ref.ci_id

    # ---- events ----
    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._device(handle, "nvmlDeviceGetSupportedEventTypes")
        return int(SUPPORTED_EVENTS)

    def nvmlEventSetCreate(self) -> Any:
        self._state()
        number = self._next_event_set
        self._next_event_set += 1
        self._event_sets[number] = _EventSet()
        return handles.make(HandleRef(handles.KIND_EVENT_SET, number))

    def _event_set(self, event_set: Any) -> tuple[int, _EventSet]:
        ref = handles.decode(event_set)
        if ref is None or ref.kind != handles.KIND_EVENT_SET or ref.gpu_index not in self._event_sets:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return ref.gpu_index, self._event_sets[ref.gpu_index]

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        state, ref = self._device(handle, "nvmlDeviceRegisterEvents")
        _number, events = self._event_set(event_set)
        if event_types & ~SUPPORTED_EVENTS:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        events.masks[ref.gpu_index] = events.masks.get(ref.gpu_index, 0) | event_types
        events.registered_at.setdefault(ref.gpu_index, state.event_seq)

    def nvmlEventSetWait_v2(self, event_set: Any, timeoutms: int) -> Any:
        _number, events = self._event_set(event_set)
        deadline = time.monotonic() + max(timeoutms, 0) / 1000
        while True:
            state = self._state()
            for gpu_index in events.masks:
                self._check_fault(state, gpu_index, "nvmlEventSetWait_v2")
            for event in state.events:
                mask = events.masks.get(event.gpu_index, 0)
                if (
                    event.seq <= events.cursor
                    or event.seq <= events.registered_at.get(event.gpu_index, 0)
                    or not mask & event.event_type
                ):
                    continue
                events.cursor = event.seq
                data = pynvml.c_nvmlEventData_t()
                data.device = handles.make(HandleRef(handles.KIND_DEVICE, event.gpu_index))
                data.eventType = event.event_type
                data.eventData = event.data
                data.gpuInstanceId = event.gi_id
                data.computeInstanceId = event.ci_id
                return data
            left = deadline - time.monotonic()
            if left <= 0:
                _fail(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(min(_EVENT_POLL_S, left))

    def nvmlEventSetWait(self, event_set: Any, timeoutms: int) -> Any:
        return self.nvmlEventSetWait_v2(event_set, timeoutms)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        number, _events = self._event_set(event_set)
        del self._event_sets[number]

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> Any:
        """Only NVML_FI_DEV_GET_GPU_RECOVERY_ACTION has a value; other fields answer NOT_SUPPORTED each."""
        state, ref = self._device(handle, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for i, field_id in enumerate(field_ids):
            fid, scope = field_id if isinstance(field_id, tuple) else (field_id, 0)
            values[i].fieldId, values[i].scopeId = fid, scope
            values[i].timestamp = int(time.time() * 1e6)
            if fid == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = state.gpus[ref.gpu_index].recovery_action
                values[i].nvmlReturn = pynvml.NVML_SUCCESS
            else:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    # ---- error injection (the `dra-gpu hardware xid|gpu-lost|recover` commands; not NVML functions) ----
    def inject_xid(
        self,
        gpu_index: int,
        xid: int,
        gi_id: int = ALL_INSTANCES,
        ci_id: int = ALL_INSTANCES,
        recovery_action: int = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET,
        event_type: int = pynvml.nvmlEventTypeXidCriticalError,
    ) -> None:
        """Raise an XID critical-error event on a GPU (or one of its MIG instances) and record the action
        the driver asks for. `event_type` nvmlEventTypeDoubleBitEccError: an uncorrectable ECC error
        instead (event data 0, as NVML sends it; the driver logs it as XID `xid`, normally 48)."""
        with self.store.transaction() as state:
            if not 0 <= gpu_index < len(state.gpus):
                raise ValueError(f"gpu index {gpu_index} does not exist (0..{len(state.gpus) - 1})")
            gpu = state.gpus[gpu_index]
            if gi_id != ALL_INSTANCES:
                gi = self._find_gi(gpu, gi_id)
                if gi is None:
                    raise ValueError(f"GPU {gpu_index} has no GPU instance {gi_id} (is MIG enabled?)")
                if ci_id != ALL_INSTANCES and not any(c.ci_id == ci_id for c in gi.compute_instances):
                    raise ValueError(
                        f"GPU instance {gi_id} on GPU {gpu_index} has no compute instance {ci_id}"
                    )
            elif ci_id != ALL_INSTANCES:
                raise ValueError("a compute instance id needs its GPU instance id")
            data = 0 if event_type == pynvml.nvmlEventTypeDoubleBitEccError else xid
            raise_event(state, gpu_index, event_type, data, gi_id, ci_id)
            gpu.recovery_action = max(gpu.recovery_action, recovery_action)

    def lose_gpu(self, gpu_index: int) -> None:
        """The GPU falls off the bus: every NVML call on it fails with GPU_IS_LOST until `recover_gpu`."""
        with self.store.transaction() as state:
            if not 0 <= gpu_index < len(state.gpus):
                raise ValueError(f"gpu index {gpu_index} does not exist (0..{len(state.gpus) - 1})")
            state.faults.append(Fault(gpu_index, "*", pynvml.NVML_ERROR_GPU_IS_LOST))

    def recover_gpu(self, gpu_index: int) -> None:
        """The GPU back on the bus: faults and the pending recovery action cleared, the contexts it had lost,
        pending MIG mode applied and MIG instances gone (as `reset_gpu` does). The compute mode stays what it
        was: a GPU back from a bus drop keeps its settings, so whatever a driver changed (an MPS claim's
        EXCLUSIVE_PROCESS) is still there until the driver itself puts it back. Were it reset here, the
        driver's pending restore would never be tested (e2e/test_mps_daemons.py)."""
        with self.store.transaction() as state:
            if not 0 <= gpu_index < len(state.gpus):
                raise ValueError(f"gpu index {gpu_index} does not exist (0..{len(state.gpus) - 1})")
            state.faults = [f for f in state.faults if f.gpu_index != gpu_index]
            gpu = state.gpus[gpu_index]
            gpu.recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_NONE
            # the processes that had contexts there lost them when the GPU fell off the bus
            gone = device_uuids(gpu)
            state.contexts = [c for c in state.contexts if c.device_uuid not in gone]
            self._switch_mig_mode(state, gpu)
            gpu.gpu_instances = []
            state.resets += 1
            if self._after_change is not None:
                self._after_change(state)
