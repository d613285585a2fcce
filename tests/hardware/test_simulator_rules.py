"""The NVML simulator behaves like pynvml on hardware: same call shapes, same errors, shared state."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_gpu.hardware.sim_driver_root import init_sim_driver_root, open_simulated_nvml, state_path
from dra_gpu.hardware.simulator import SimulatedNvml, StateStore
from dra_gpu.hardware.simulator.state import Fault

H100_1G, H100_1G_ME, H100_2G, H100_3G, H100_7G = 19, 20, 14, 9, 0


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sim-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _nvml(root: Path, hardware: str) -> SimulatedNvml:
    init_sim_driver_root(root, hardware, seed="node-a")
    nvml = open_simulated_nvml(root)
    nvml.nvmlInit()
    return nvml


def _placement(start: int, size: int) -> Any:
    p = pynvml.c_nvmlGpuInstancePlacement_t()
    p.start, p.size = start, size
    return p


def _create(nvml: SimulatedNvml, h: Any, profile_id: int, start: int, size: int) -> Any:
    return nvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, profile_id, ctypes.byref(_placement(start, size)))


def test_calls_before_init_fail_uninitialized(root: Path) -> None:
    init_sim_driver_root(root, "h100-80gb")
    nvml = open_simulated_nvml(root)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()


def test_missing_state_fails_init(root: Path) -> None:
    with pytest.raises(Exception, match="init-sim"):
        SimulatedNvml(root / "nope.json").nvmlInit()


def test_profile_info_and_placements_use_pynvml_structs(root: Path) -> None:
    nvml = _nvml(root, "h100-80gb")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2)
    assert isinstance(info, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t)
    assert (info.id, info.sliceCount, info.instanceCount, info.multiprocessorCount) == (15, 1, 4, 26)
    assert info.name == "MIG 1g.20gb"  # _PrintableStructure decodes char arrays
    count = ctypes.c_uint()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, None, ctypes.byref(count))
    placements = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, placements, ctypes.byref(count))
    assert [(p.start, p.size) for p in placements] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    too_small = (pynvml.c_nvmlGpuInstancePlacement_t * 2)()
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, too_small, ctypes.byref(count))
    with pytest.raises(pynvml.NVMLError_NotSupported):  # a profile this GPU does not have
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE)


def test_mig_calls_need_mig_mode(root: Path) -> None:
    nvml = _nvml(root, "h100-80gb")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 0]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        _create(nvml, h, H100_1G, 0, 1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuInstanceById(h, 7)


def test_non_mig_gpu_rejects_mig_mode(root: Path) -> None:
    nvml = _nvml(root, "l40s")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigMode(h)


def test_hopper_switches_mig_mode_immediately(root: Path) -> None:
    nvml = _nvml(root, "h100-80gb")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_SUCCESS
    assert nvml.nvmlDeviceGetMigMode(h) == [1, 1]


def test_ampere_mig_mode_is_pending_until_reset(root: Path) -> None:
    nvml = _nvml(root, "a100-40gb")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    status = nvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE)
    assert status == pynvml.NVML_ERROR_RESET_REQUIRED
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 1]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        _create(nvml, h, 19, 0, 1)
    nvml.reset_gpu(0)
    assert nvml.nvmlDeviceGetMigMode(h) == [1, 1]
    _create(nvml, h, 19, 0, 1)


def test_placement_rules(root: Path) -> None:
    nvml = _nvml(root, "h100-80gb")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE)
    gi = _create(nvml, h, H100_3G, 4, 4)
    info = nvml.nvmlGpuInstanceGetInfo(gi)
    assert (info.id, info.profileId, info.placement.start, info.placement.size) == (2, H100_3G, 4, 4)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):  # occupied
        _create(nvml, h, H100_1G, 5, 1)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):  # overlaps 4..7
        _create(nvml, h, H100_7G, 0, 8)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # 2g starts at 0, 2 or 4 only
        _create(nvml, h, H100_2G, 1, 2)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # wrong size for the profile
        _create(nvml, h, H100_1G, 0, 2)
    _create(nvml, h, H100_1G_ME, 0, 1)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):  # instanceCount of +me is 1
        _create(nvml, h, H100_1G_ME, 1, 1)
    _create(nvml, h, H100_1G, 1, 1)
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, H100_1G) == 2  # starts 2 and 3


def test_instances_lists_and_destroy_order(root: Path) -> None:
    nvml = _nvml(root, "h100-80gb")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE)
    gi = _create(nvml, h, H100_2G, 2, 2)
    ci_profile = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )
    with pytest.raises(pynvml.NVMLError_NotSupported):  # a 2-slice GPU instance has no 3-slice CI
        nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi,
            pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
            pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
        )
    ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
    ci_info = nvml.nvmlComputeInstanceGetInfo(ci)
    mig_uuid = nvml.nvmlDeviceGetUUID(ci_info.device)
    assert mig_uuid.startswith("MIG-")
    assert nvml.nvmlDeviceIsMigDeviceHandle(ci_info.device).value == 1
    assert nvml.nvmlDeviceGetName(ci_info.device).endswith("MIG 2g.20gb")
    assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)) == mig_uuid
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 1)
    instances = (pynvml.c_nvmlGpuInstance_t * 3)()
    count = ctypes.c_uint()
    nvml.nvmlDeviceGetGpuInstances(h, H100_2G, instances, ctypes.byref(count))
    assert count.value == 1 and nvml.nvmlGpuInstanceGetInfo(instances[0]).id == 4
    with pytest.raises(pynvml.NVMLError_InUse):  # compute instance first
        nvml.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(pynvml.NVMLError_InUse):  # MIG mode stays while instances exist
        nvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_DISABLE)
    nvml.nvmlComputeInstanceDestroy(ci)
    nvml.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetGpuInstanceById(h, 4)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # stale handle
        nvml.nvmlGpuInstanceGetInfo(gi)


def test_recreated_mig_device_gets_new_uuid(root: Path) -> None:
    nvml = _nvml(root, "h100-80gb")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE)
    uuids = []
    for _ in range(2):
        gi = _create(nvml, h, H100_1G, 0, 1)
        ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, 0)
        uuids.append(nvml.nvmlDeviceGetUUID(nvml.nvmlComputeInstanceGetInfo(ci).device))
        nvml.nvmlComputeInstanceDestroy(ci)
        nvml.nvmlGpuInstanceDestroy(gi)
    assert uuids[0] != uuids[1]


def test_injected_fault_hits_one_gpu_and_function(root: Path) -> None:
    nvml = _nvml(root, "dgx-h100")
    with nvml.store.transaction() as state:
        state.faults.append(Fault(3, "nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST))
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(3))
    assert nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(2)).total == 81559 * 2**20
    assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(3)).startswith("GPU-")


def test_state_is_shared_with_other_processes(root: Path) -> None:
    nvml = _nvml(root, "dgx-h100")
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE)
    # another process creates a MIG device through its own simulator instance ...
    child = f"""
import ctypes, pynvml
from dra_gpu.hardware.sim_driver_root import open_simulated_nvml
n = open_simulated_nvml({str(root)!r}); n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(1)
p = pynvml.c_nvmlGpuInstancePlacement_t(); p.start, p.size = 0, 4
gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, 5, ctypes.byref(p))
n.nvmlGpuInstanceCreateComputeInstance(gi, 3)
"""
    subprocess.run([sys.executable, "-c", child], check=True, timeout=60)
    # ... this one sees it at once and cannot take the same memory slices
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        _create(nvml, h, H100_2G, 2, 2)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert nvml.nvmlDeviceGetGpuInstanceId(mig) == 1
    # and the fake nvidia-smi (a third process) reports it too
    listing = subprocess.run(
        [str(root / "usr/bin/nvidia-smi"), "-L"], capture_output=True, text=True, check=True
    )
    assert "MIG 4g.40gb" in listing.stdout
    state = json.loads(state_path(root).read_text())
    assert state["gpus"][1]["gpu_instances"][0]["start"] == 0


def test_concurrent_creates_from_processes_never_overlap(root: Path) -> None:
    nvml = _nvml(root, "h100-80gb")
    nvml.nvmlDeviceSetMigMode(nvml.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_DEVICE_MIG_ENABLE)
    child = f"""
import ctypes, sys, pynvml
from dra_gpu.hardware.sim_driver_root import open_simulated_nvml
n = open_simulated_nvml({str(root)!r}); n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
p = pynvml.c_nvmlGpuInstancePlacement_t(); p.start, p.size = 0, 8
try:
    n.nvmlDeviceCreateGpuInstanceWithPlacement(h, 0, ctypes.byref(p))
    print("created")
except pynvml.NVMLError_InsufficientResources:
    print("occupied")
"""
    procs = [
        subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True) for _ in range(4)
    ]
    results = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert results == ["created", "occupied", "occupied", "occupied"]
    assert len(StateStore(state_path(root)).read().gpus[0].gpu_instances) == 1


def test_addressing_mode_follows_the_platform_and_driver(root: Path) -> None:
    # pynvml's nvmlDeviceGetAddressingMode returns the struct's value (NVML_DEVICE_ADDRESSING_MODE_*)
    dgx = _nvml(root / "dgx", "dgx-h100")
    assert dgx.nvmlDeviceGetAddressingMode(dgx.nvmlDeviceGetHandleByIndex(0)) == (
        pynvml.NVML_DEVICE_ADDRESSING_MODE_HMM
    )
    l40s = _nvml(root / "l40s", "pcie-4x-l40s")  # R570 without HMM/ATS support on the platform
    with pytest.raises(pynvml.NVMLError_NotSupported):
        l40s.nvmlDeviceGetAddressingMode(l40s.nvmlDeviceGetHandleByIndex(0))
    t4 = _nvml(root / "t4", "single-t4")  # R535: the call does not exist yet
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        t4.nvmlDeviceGetAddressingMode(t4.nvmlDeviceGetHandleByIndex(0))
