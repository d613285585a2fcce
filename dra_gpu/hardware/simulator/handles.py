"""Opaque NVML handles for the simulator, as real ctypes pointers.

Real pynvml hands out `c_nvmlDevice_t` / `c_nvmlGpuInstance_t` / `c_nvmlComputeInstance_t` pointers and
callers put
them in ctypes arrays (`nvmlDeviceGetGpuInstances`) and structs (`c_nvmlComputeInstanceInfo_t.device`). The
simulator
uses the same pointer types; the address encodes what the handle names. It is never dereferenced.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import pynvml

_MAGIC = 0x5D  # top byte: marks a simulator handle
KIND_DEVICE = 1
KIND_MIG_DEVICE = 2
KIND_GPU_INSTANCE = 3
KIND_COMPUTE_INSTANCE = 4
KIND_EVENT_SET = 5  # gpu_index holds the event set's number


@dataclass(frozen=True)
class HandleRef:
    kind: int
    gpu_index: int
    gi_id: int = 0
    ci_id: int = 0


def _address(ref: HandleRef) -> int:
    return (_MAGIC << 56) | (ref.kind << 48) | (ref.gpu_index << 32) | (ref.gi_id << 16) | ref.ci_id


def make(ref: HandleRef) -> Any:
    pointer_type: Any = {
        KIND_DEVICE: pynvml.c_nvmlDevice_t,
        KIND_MIG_DEVICE: pynvml.c_nvmlDevice_t,
        KIND_GPU_INSTANCE: pynvml.c_nvmlGpuInstance_t,
        KIND_COMPUTE_INSTANCE: pynvml.c_nvmlComputeInstance_t,
        KIND_EVENT_SET: pynvml.c_nvmlEventSet_t,
    }[ref.kind]
    return ctypes.cast(ctypes.c_void_p(_address(ref)), pointer_type)


def decode(handle: Any) -> HandleRef | None:
    """The reference behind a handle, or None for anything that is not a simulator handle."""
    try:
        value = ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return None
    if not value or value >> 56 != _MAGIC:
        return None
    return HandleRef(
        kind=(value >> 48) & 0xFF,
        gpu_index=(value >> 32) & 0xFFFF,
        gi_id=(value >> 16) & 0xFFFF,
        ci_id=value & 0xFFFF,
    )
