"""GPU health from NVML: XID critical-error events through an event set, and a per-GPU probe.

`NvmlHealthEvents` works on the `pynvml` module or the simulator (same calls). One event set covers every GPU
that registered; a GPU whose registration fails is reported as unmonitored. When the set's wait fails with
GPU_IS_LOST (a registered GPU fell off the bus) the set is rebuilt from the GPUs that still answer; a lost GPU
is registered again once `probe` finds it answering.

It keeps its own NVML reference (`nvmlInit`/`nvmlShutdown` are reference-counted), so waiting here never holds
`NvmlHardware`'s lock and prepares go on while the monitor waits.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from dra_gpu.hardware.interface import HardwareError
from dra_gpu.hardware.types import ALL_INSTANCES, GpuProbe, XidEvent

DBE_XID = 48  # double-bit ECC error


class GpuLostError(HardwareError):
    """The event set's wait failed because a registered GPU is lost; `probe` tells which."""


def _code(err: Exception) -> int | None:
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


class NvmlHealthEvents:
    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._nvml.nvmlInit()
        self._event_set: Any = None
        self._registered: set[str] = set()
        self._unmonitored: dict[str, str] = {}  # uuid -> why registration failed
        self.gpus: list[str] = []  # UUIDs of the GPUs NVML enumerated at start
        for index in range(self._nvml.nvmlDeviceGetCount()):
            try:
                self.gpus.append(
                    str(self._nvml.nvmlDeviceGetUUID(self._nvml.nvmlDeviceGetHandleByIndex(index)))
                )
            except self._nvml.NVMLError:
                continue  # a GPU lost at start has no UUID to name it by; discovery leaves it out too

    @property
    def unmonitored(self) -> dict[str, str]:
        """GPUs (UUID -> reason) for which no event could be registered."""
        return dict(self._unmonitored)

    @property
    def registered(self) -> frozenset[str]:
        return frozenset(self._registered)

    def register(self, gpus: list[str] | None = None) -> None:
        """(Re)build the event set for `gpus` (default: every GPU), recording those that cannot register."""
        self._free()
        self._event_set = self._nvml.nvmlEventSetCreate()
        self._registered.clear()
        wanted = self._nvml.nvmlEventTypeXidCriticalError
        # ECC events as NVIDIA's driver registers them: double-bit errors taint (as XID 48), single-bit ones
        # are corrected and skipped; a GPU without ECC reporting is still monitored for XIDs.
        full = wanted | self._nvml.nvmlEventTypeDoubleBitEccError | self._nvml.nvmlEventTypeSingleBitEccError
        for uuid in self.gpus if gpus is None else gpus:
            try:
                handle = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
                try:
                    self._nvml.nvmlDeviceRegisterEvents(handle, full, self._event_set)
                except self._nvml.NVMLError as err:
                    if _code(err) != self._nvml.NVML_ERROR_NOT_SUPPORTED:
                        raise
                    self._nvml.nvmlDeviceRegisterEvents(handle, wanted, self._event_set)
            except self._nvml.NVMLError as err:
                self._unmonitored[uuid] = f"event registration failed: {err}"
                continue
            self._registered.add(uuid)
            self._unmonitored.pop(uuid, None)

    def wait(self, timeout_s: float) -> XidEvent | None:
        """The next XID event, or None when `timeout_s` passes without one (single-bit ECC is skipped).

        A double-bit ECC event is reported as XID 48 (what the driver logs for it): uncorrectable memory
        errors are fatal to the work on the GPU, whether the driver sent the XID event, the ECC event, or both
        (the taint is the same, so both collapse into one)."""
        if self._event_set is None or not self._registered:
            time.sleep(timeout_s)  # nothing to wait on; the caller probes and registers again
            return None
        try:
            data = self._nvml.nvmlEventSetWait_v2(self._event_set, int(timeout_s * 1000))
        except self._nvml.NVMLError as err:
            code = _code(err)
            if code == self._nvml.NVML_ERROR_TIMEOUT:
                return None
            if code == self._nvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLostError(f"nvmlEventSetWait_v2: {err}", nvml_code=code) from err
            raise HardwareError(f"nvmlEventSetWait_v2 failed: {err}", nvml_code=code) from err
        if data.eventType & self._nvml.nvmlEventTypeXidCriticalError:
            xid = int(data.eventData)
        elif data.eventType & self._nvml.nvmlEventTypeDoubleBitEccError:
            xid = DBE_XID
        else:
            return None
        uuid = str(self._nvml.nvmlDeviceGetUUID(data.device))
        gi_id, ci_id = int(data.gpuInstanceId), int(data.computeInstanceId)
        return XidEvent(
            gpu_uuid=uuid,
            xid=xid,
            gi_id=gi_id,
            ci_id=ci_id,
            gi_placement=self._placement(data.device, gi_id),
            time=time.time(),
        )

    def _placement(self, device: Any, gi_id: int) -> tuple[int, int] | None:
        """Where the event's GPU instance sits, so the event maps to a (profile, placement) MIG device."""
        if gi_id == ALL_INSTANCES:
            return None
        try:
            info = self._nvml.nvmlGpuInstanceGetInfo(self._nvml.nvmlDeviceGetGpuInstanceById(device, gi_id))
        except self._nvml.NVMLError:
            return None  # the instance is gone already: the event still maps by its ids
        return int(info.placement.start), int(info.placement.size)

    def probe(self, uuid: str) -> GpuProbe:
        """Does the GPU answer, and does the driver still ask for a reset?"""
        try:
            handle = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
            self._nvml.nvmlDeviceGetUUID(handle)
        except self._nvml.NVMLError as err:
            return GpuProbe(uuid, answering=False, reset_required=True, error=str(err))
        reset = known = False
        field = getattr(self._nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field is not None:
            try:
                value = self._nvml.nvmlDeviceGetFieldValues(handle, [field])[0]
                if value.nvmlReturn == self._nvml.NVML_SUCCESS:
                    reset = int(value.value.uiVal) != self._nvml.NVML_GPU_RECOVERY_ACTION_NONE
                    known = True
            except self._nvml.NVMLError:
                pass  # older drivers do not know the field: a taint then waits for a reset to be seen
        return GpuProbe(uuid, answering=True, reset_required=reset, recovery_known=known)

    def _free(self) -> None:
        if self._event_set is not None:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlEventSetFree(self._event_set)
            self._event_set = None

    def close(self) -> None:
        self._free()
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()
