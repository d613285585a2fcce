"""A CUDA client for the real-GPU MPS check: what one CUDA context gets, through the driver API only.

    python e2e/real_gpu/cuda_client.py    (env: CUDA_MPS_PIPE_DIRECTORY and the client's own MPS limits)

prints JSON: the device's SM count, the SM count of this context's execution affinity (what MPS gives it),
the memory the context sees, and whether it can allocate 3 GiB. No toolkit or framework needed: ctypes and the
driver's libcuda.so.1, so it runs on any machine with an NVIDIA driver.
"""

from __future__ import annotations

import ctypes
import json
import sys

CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_EXEC_AFFINITY_TYPE_SM_COUNT = 0
ALLOCATION = 3 << 30


class _ExecAffinity(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("sm_count", ctypes.c_uint)]


def main() -> int:
    cuda = ctypes.CDLL("libcuda.so.1")
    report: dict[str, object] = {}

    def call(name: str, *args: object) -> int:
        code = int(getattr(cuda, name)(*args))
        if code != 0:
            report.setdefault("errors", []).append(f"{name}: CUresult {code}")  # type: ignore[union-attr]
        return code

    if call("cuInit", 0) != 0:
        print(json.dumps(report))
        return 1
    device = ctypes.c_int()
    call("cuDeviceGet", ctypes.byref(device), 0)
    sms = ctypes.c_int()
    call("cuDeviceGetAttribute", ctypes.byref(sms), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device)
    report["deviceSMs"] = sms.value
    context = ctypes.c_void_p()
    if call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device) != 0:
        print(json.dumps(report))
        return 1
    call("cuCtxSetCurrent", context)
    affinity = _ExecAffinity()
    if call("cuCtxGetExecAffinity", ctypes.byref(affinity), CU_EXEC_AFFINITY_TYPE_SM_COUNT) == 0:
        report["contextSMs"] = affinity.sm_count
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    if call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total)) == 0:
        report["freeMiB"], report["totalMiB"] = free.value >> 20, total.value >> 20
    pointer = ctypes.c_uint64()
    code = int(cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(ALLOCATION)))
    report["alloc3GiB"] = "ok" if code == 0 else f"CUresult {code}"
    if code == 0:
        cuda.cuMemFree_v2(pointer)
    cuda.cuDevicePrimaryCtxRelease(device)
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
