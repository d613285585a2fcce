"""A CUDA client for the real-GPU MPS check: what one CUDA context gets, through the driver API only.

    python e2e/real_gpu/cuda_client.py    (env: CUDA_MPS_PIPE_DIRECTORY and the client's own MPS limits)
        [--alloc-mib N ...] [--job-iterations N [--blocks 16] [--threads 1024] [--start-at EPOCH]]

prints JSON: the device's SM count, the SM count of this context's execution affinity (what MPS gives it),
the memory the context sees, and whether it can allocate 3 GiB (or each `--alloc-mib` size, one at a time:
`allocations`). `--job-iterations` runs a batch job: `--blocks` blocks of `--threads` threads, each thread N
iterations of four independent FMA chains (a PTX kernel the driver compiles), timed from launch to
synchronize (`elapsedSeconds`); `--start-at` (time.time()) waits until then to launch, once the context, the
module and the buffer are ready, so that several clients start their jobs together. No toolkit or framework
needed: ctypes and the driver's libcuda.so.1, so it runs on any machine with an NVIDIA driver.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from collections.abc import Callable

CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_EXEC_AFFINITY_TYPE_SM_COUNT = 0
ALLOCATION = 3 << 30
CU_JIT_ERROR_LOG_BUFFER = 5
CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
KERNEL = b"fma_loop"
# out[global thread id] = the sum of four FMA chains of `iterations` steps each (compute-bound, no memory
# traffic in the loop); sm_60 PTX, which every driver that runs an H100 compiles for its GPU.
PTX = b"""
.version 6.4
.target sm_60
.address_size 64

.visible .entry fma_loop(.param .u64 out, .param .u32 iterations)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .f32 %f<12>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [iterations];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    cvt.rn.f32.s32 %f1, %r5;
    mov.f32 %f2, 0f3F800000;
    mov.f32 %f3, 0f40000000;
    mov.f32 %f4, 0f40400000;
    mov.f32 %f8, 0f3F7FFFFE;
    mov.f32 %f9, 0f3A83126F;
    mov.u32 %r6, 0;
LOOP:
    fma.rn.f32 %f1, %f1, %f8, %f9;
    fma.rn.f32 %f2, %f2, %f8, %f9;
    fma.rn.f32 %f3, %f3, %f8, %f9;
    fma.rn.f32 %f4, %f4, %f8, %f9;
    add.s32 %r6, %r6, 1;
    setp.lt.u32 %p1, %r6, %r1;
    @%p1 bra LOOP;
    add.f32 %f5, %f1, %f2;
    add.f32 %f6, %f3, %f4;
    add.f32 %f7, %f5, %f6;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.s32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.f32 [%rd4], %f7;
    ret;
}
"""


class _ExecAffinity(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("sm_count", ctypes.c_uint)]


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--alloc-mib", type=int, action="append", default=[], help="try to allocate N MiB")
    parser.add_argument("--job-iterations", type=int, default=0, help="run the FMA batch job (0: none)")
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1024)
    parser.add_argument("--start-at", type=float, default=0.0, help="launch the job at this time.time()")
    return parser.parse_args(argv)


def _job(
    cuda: ctypes.CDLL, args: argparse.Namespace, call: Callable[..., int], report: dict[str, object]
) -> None:
    """Load the kernel, allocate its output, wait for --start-at, launch and time the job."""
    log = ctypes.create_string_buffer(8192)
    options = (ctypes.c_int * 2)(CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
    values = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(len(log)))
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    if call("cuModuleLoadDataEx", ctypes.byref(module), ctypes.c_char_p(PTX), 2, options, values) != 0:
        report["jitLog"] = log.value.decode(errors="replace")[-2000:]
        return
    if call("cuModuleGetFunction", ctypes.byref(function), module, ctypes.c_char_p(KERNEL)) != 0:
        return
    out = ctypes.c_uint64()
    if call("cuMemAlloc_v2", ctypes.byref(out), ctypes.c_size_t(args.blocks * args.threads * 4)) != 0:
        return
    iterations = ctypes.c_uint32(args.job_iterations)
    params = (ctypes.c_void_p * 2)(ctypes.addressof(out), ctypes.addressof(iterations))
    if args.start_at:
        report["waitedSeconds"] = round(max(0.0, args.start_at - time.time()), 3)
        time.sleep(max(0.0, args.start_at - time.time()))
    started = time.perf_counter()
    launched = call(
        "cuLaunchKernel", function, ctypes.c_uint(args.blocks), ctypes.c_uint(1), ctypes.c_uint(1),
        ctypes.c_uint(args.threads), ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_uint(0), None, params, None,
    )  # fmt: skip
    if launched == 0 and call("cuCtxSynchronize") == 0:
        report["elapsedSeconds"] = round(time.perf_counter() - started, 4)
        report["job"] = {"blocks": args.blocks, "threads": args.threads, "iterations": args.job_iterations}
    cuda.cuMemFree_v2(out)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    cuda = ctypes.CDLL("libcuda.so.1")
    report: dict[str, object] = {}
    errors: list[str] = []

    def call(name: str, *args: object) -> int:
        code = int(getattr(cuda, name)(*args))
        if code != 0:
            errors.append(f"{name}: CUresult {code}")
            report["errors"] = errors
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
    allocations: dict[str, str] = {}
    for mib in args.alloc_mib or [ALLOCATION >> 20]:
        pointer = ctypes.c_uint64()
        code = int(cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(mib << 20)))
        allocations[str(mib)] = "ok" if code == 0 else f"CUresult {code}"
        if code == 0:
            cuda.cuMemFree_v2(pointer)
    if args.alloc_mib:
        report["allocations"] = allocations
    else:
        report["alloc3GiB"] = allocations[str(ALLOCATION >> 20)]
    if args.job_iterations:
        _job(cuda, args, call, report)
    cuda.cuDevicePrimaryCtxRelease(device)
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
