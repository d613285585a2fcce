"""Processes with a context on a simulated GPU or MIG device: register, drop, list, with compute-mode rules.

What needs it: NVML refuses to switch MIG mode (nvmlDeviceSetMigMode's activation status IN_USE) or destroy a
GPU/compute instance (NVML_ERROR_IN_USE) while processes run there, `nvmlDeviceGetComputeRunningProcesses`
lists them, and CUDA refuses a context that the compute mode forbids. The simulated CUDA/MPS tools register
their contexts here, tests and `dra-gpu hardware process add|remove|list` put a process on a device by hand.

    add_context(driver_root, device_uuid, pid, kind="compute") -> ContextState
    remove_context(driver_root, device_uuid, pid) -> bool
    list_contexts(driver_root, device_uuid=None) -> list[ContextState]

`device_uuid` is a GPU UUID or a MIG device UUID; `kind` one of CONTEXT_KINDS ("compute", "mps-server",
"mps-client", "graphics"). Each call is one locked read-modify-write of the simulator state (the same fcntl
lock as NVML's changes), so a check and the registration it allows are atomic across processes.

Compute modes, as the CUDA runtime documents cudaErrorDevicesUnavailable (46, "all CUDA devices are busy or
unavailable ... due to use of cudaComputeModeProhibited, cudaComputeModeExclusiveProcess"): in
EXCLUSIVE_PROCESS a device holds the contexts of one process only, in PROHIBITED none. An MPS client
("mps-client") runs inside its server's context and is not counted (the MPS guide puts an MPS GPU in
EXCLUSIVE_PROCESS so that only the server opens it). A refused context raises ContextRefusedError, whose text
is the CUDA runtime's error string for that code.
"""

from __future__ import annotations

import os
from pathlib import Path

from dra_gpu.hardware.simulator.state import (
    CONTEXT_KINDS,
    OWN_CONTEXT_KINDS,
    ContextState,
    SimState,
    StateStore,
)

CUDA_ERROR_DEVICES_UNAVAILABLE = 46  # cudaErrorDevicesUnavailable (driver API CUDA_ERROR_DEVICE_UNAVAILABLE)
DEVICES_UNAVAILABLE_TEXT = "all CUDA-capable devices are busy or unavailable"
_COMPUTEMODE_PROHIBITED = 2  # NVML_COMPUTEMODE_PROHIBITED
_COMPUTEMODE_EXCLUSIVE_PROCESS = 3  # NVML_COMPUTEMODE_EXCLUSIVE_PROCESS

_stores: dict[Path, StateStore] = {}  # one store per state file and process: its parsed-state cache is reused


class ContextRefusedError(RuntimeError):
    """CUDA would not create the context (cudaErrorDevicesUnavailable); `str()` is CUDA's own text."""

    cuda_error = CUDA_ERROR_DEVICES_UNAVAILABLE

    def __init__(self, detail: str) -> None:
        super().__init__(DEVICES_UNAVAILABLE_TEXT)
        self.detail = detail  # why, for logs and tests (not part of CUDA's message)


def _store(driver_root: str | os.PathLike[str]) -> StateStore:
    from dra_gpu.hardware.sim_driver_root import state_path  # late: sim_driver_root imports the simulator

    path = state_path(driver_root)
    store = _stores.get(path)
    if store is None:
        store = _stores[path] = StateStore(path)
    return store


def _compute_mode_of(state: SimState, device_uuid: str) -> int:
    """The compute mode governing `device_uuid` (a MIG device follows its parent GPU); ValueError if none."""
    for gpu in state.gpus:
        if gpu.uuid == device_uuid or any(
            ci.uuid == device_uuid for gi in gpu.gpu_instances for ci in gi.compute_instances
        ):
            return gpu.compute_mode
    raise ValueError(f"no simulated GPU or MIG device has UUID {device_uuid}")


def admit_context(state: SimState, device_uuid: str, pid: int, kind: str = "compute") -> ContextState:
    """Add the context to `state` (inside a transaction) or raise ContextRefusedError / ValueError."""
    if kind not in CONTEXT_KINDS:
        raise ValueError(f"context kind {kind!r} is not one of {', '.join(CONTEXT_KINDS)}")
    mode = _compute_mode_of(state, device_uuid)
    for existing in state.contexts:
        if (existing.device_uuid, existing.pid, existing.kind) == (device_uuid, pid, kind):
            return existing  # the same process asks again: it already has it
    if kind in OWN_CONTEXT_KINDS:
        if mode == _COMPUTEMODE_PROHIBITED:
            raise ContextRefusedError(f"{device_uuid} is in compute mode PROHIBITED")
        if mode == _COMPUTEMODE_EXCLUSIVE_PROCESS:
            holders = sorted(
                {
                    c.pid
                    for c in state.contexts
                    if c.device_uuid == device_uuid and c.kind in OWN_CONTEXT_KINDS and c.pid != pid
                }
            )
            if holders:
                raise ContextRefusedError(
                    f"{device_uuid} is in compute mode EXCLUSIVE_PROCESS and pid(s) "
                    f"{', '.join(map(str, holders))} hold a context on it"
                )
    context = ContextState(device_uuid, int(pid), kind)
    state.contexts.append(context)
    return context


def add_context(
    driver_root: str | os.PathLike[str], device_uuid: str, pid: int, kind: str = "compute"
) -> ContextState:
    """Register that `pid` holds a context of `kind` on `device_uuid`. Idempotent for the same triple.

    Raises ContextRefusedError where CUDA would refuse it (compute mode), ValueError for an unknown device or
    kind, StateError when the driver root has no simulator state."""
    with _store(driver_root).transaction() as state:
        return admit_context(state, device_uuid, pid, kind)


def remove_context(driver_root: str | os.PathLike[str], device_uuid: str, pid: int) -> bool:
    """Drop every context `pid` holds on `device_uuid` (the process exited). False when it held none."""
    store = _store(driver_root)
    if not any(c.device_uuid == device_uuid and c.pid == pid for c in store.read().contexts):
        return False  # nothing to do: no write, so readers keep their cached state
    with store.transaction() as state:
        before = len(state.contexts)
        state.contexts = [c for c in state.contexts if not (c.device_uuid == device_uuid and c.pid == pid)]
        return len(state.contexts) != before


def list_contexts(driver_root: str | os.PathLike[str], device_uuid: str | None = None) -> list[ContextState]:
    """The registered contexts (of one device with `device_uuid`), oldest first."""
    contexts = _store(driver_root).read().contexts
    return [c for c in contexts if device_uuid is None or c.device_uuid == device_uuid]
