"""Processes on simulated GPUs (simulator/contexts.py) and what NVML, CUDA and nvidia-smi refuse because of
them, as NVIDIA documents it: nvmlDeviceSetMigMode's activation status IN_USE and the pending mode, IN_USE
from the instance destroys, a minor number that may change with the MIG mode, cudaErrorDevicesUnavailable
in EXCLUSIVE_PROCESS/PROHIBITED, and `compute-policy --set-timeslice` failing on a lost GPU."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_gpu.hardware.sim_driver_root import init_sim_driver_root, open_simulated_nvml
from dra_gpu.hardware.simulator import SimulatedNvml
from dra_gpu.hardware.simulator.contexts import (
    DEVICES_UNAVAILABLE_TEXT,
    ContextRefusedError,
    add_context,
    list_contexts,
    remove_context,
)

H100_1G = 19


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="sim-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _nvml(root: Path, hardware: str = "h100-80gb") -> SimulatedNvml:
    init_sim_driver_root(root, hardware, seed="node-a")
    nvml = open_simulated_nvml(root)
    nvml.nvmlInit()
    return nvml


def _mig_device(nvml: SimulatedNvml, h: Any) -> tuple[Any, Any, str]:
    """A 1g MIG device at placement 0: (gpu instance, compute instance, MIG uuid)."""
    placement = pynvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = 0, 1
    gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, H100_1G, ctypes.byref(placement))
    ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, 0)
    uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlComputeInstanceGetInfo(ci).device)
    return gi, ci, uuid


def test_mig_mode_stays_pending_while_a_process_uses_the_gpu(root: Path) -> None:
    nvml = _nvml(root)
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    uuid = nvml.nvmlDeviceGetUUID(h)
    add_context(root, uuid, 100)
    # the call succeeds; its activation status says the GPU was not idle, and the mode is pending
    assert nvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_ERROR_IN_USE
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 1]
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.reset_gpu(0)  # nvidia-smi -r needs an idle GPU too
    assert remove_context(root, uuid, 100) and not remove_context(root, uuid, 100)
    assert nvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_SUCCESS  # retried idle
    assert nvml.nvmlDeviceGetMigMode(h) == [1, 1]


def test_instances_with_processes_are_not_destroyed(root: Path) -> None:
    nvml = _nvml(root)
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE)
    gi, ci, mig_uuid = _mig_device(nvml, h)
    add_context(root, mig_uuid, 200)
    processes = nvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert [(p.pid, p.gpuInstanceId, p.computeInstanceId) for p in processes] == [
        (200, nvml.nvmlGpuInstanceGetInfo(gi).id, 0)
    ]
    mig_handle = nvml.nvmlDeviceGetHandleByUUID(mig_uuid)
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(mig_handle)] == [200]
    with pytest.raises(pynvml.NVMLError_InUse):
        nvml.nvmlComputeInstanceDestroy(ci)
    remove_context(root, mig_uuid, 200)
    nvml.nvmlComputeInstanceDestroy(ci)
    nvml.nvmlGpuInstanceDestroy(gi)
    assert nvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_DISABLE) == pynvml.NVML_SUCCESS


def test_exclusive_process_and_prohibited_refuse_contexts_as_cuda_does(root: Path) -> None:
    nvml = _nvml(root)
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    uuid = nvml.nvmlDeviceGetUUID(h)
    nvml.nvmlDeviceSetComputeMode(h, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    add_context(root, uuid, 300, "mps-server")
    add_context(root, uuid, 300, "mps-server")  # the same process again: still one context
    add_context(root, uuid, 301, "mps-client")  # clients run in the server's context
    with pytest.raises(ContextRefusedError) as refused:
        add_context(root, uuid, 302)
    assert (
        str(refused.value) == DEVICES_UNAVAILABLE_TEXT == "all CUDA-capable devices are busy or unavailable"
    )
    assert refused.value.cuda_error == 46 and "300" in refused.value.detail
    assert [(c.pid, c.kind) for c in list_contexts(root, uuid)] == [(300, "mps-server"), (301, "mps-client")]
    assert [p.pid for p in nvml.nvmlDeviceGetMPSComputeRunningProcesses(h)] == [301]
    nvml.nvmlDeviceSetComputeMode(h, pynvml.NVML_COMPUTEMODE_PROHIBITED)
    with pytest.raises(ContextRefusedError):
        add_context(root, uuid, 300)  # a new compute context of the same process: PROHIBITED allows none
    with pytest.raises(ValueError, match="no simulated GPU"):
        add_context(root, "GPU-nope", 1)


def test_a_mig_mode_switch_may_renumber_the_gpu(root: Path) -> None:
    nvml = _nvml(root, "dgx-h100")
    with nvml.store.transaction() as state:
        state.renumber_on_mig_switch = True
    h = nvml.nvmlDeviceGetHandleByIndex(2)
    assert nvml.nvmlDeviceGetMinorNumber(h) == 2
    nvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_ENABLE)
    uuid = nvml.nvmlDeviceGetUUID(h)
    assert nvml.nvmlDeviceGetMinorNumber(nvml.nvmlDeviceGetHandleByUUID(uuid)) == 8  # above the 8 GPUs' 0..7
    nvml.nvmlDeviceSetMigMode(h, pynvml.NVML_DEVICE_MIG_DISABLE)
    assert nvml.nvmlDeviceGetMinorNumber(h) == 9


def _smi(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(root / "usr/bin/nvidia-smi"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DRA_GPU_SIM_ROOT": str(root)},
    )


def test_set_timeslice_on_a_lost_gpu_fails_like_the_real_tool(root: Path) -> None:
    nvml = _nvml(root, "dgx-h100")
    nvml.lose_gpu(1)
    done = _smi(root, "compute-policy", "-i", "0,1", "--set-timeslice", "2")
    assert done.returncode == 15, done.stdout + done.stderr  # nvidia-smi(1): GPU fell off the bus
    assert "GPU is lost" in done.stdout
    timeslices = [g.timeslice for g in nvml.store.read().gpus]
    assert timeslices[:2] == [2, 0]  # the GPU that answers is changed, the lost one is not


def test_nvidia_smi_warns_when_mig_mode_stays_pending_on_a_busy_gpu(root: Path) -> None:
    nvml = _nvml(root)
    add_context(root, nvml.store.read().gpus[0].uuid, 55)
    done = _smi(root, "-i", "0", "-mig", "1")
    assert (
        done.returncode == 0
        and "pending enable state" in done.stdout
        and "In use by another client" in done.stdout
    )


def test_process_cli(root: Path) -> None:
    nvml = _nvml(root)
    uuid = nvml.store.read().gpus[0].uuid

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dra_gpu.cli.hardware", "process", *args, "--driver-root", str(root)],
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert cli("add", "--device", uuid, "--pid", "9").returncode == 0
    assert json.loads(cli("list").stdout) == [{"device": uuid, "pid": 9, "kind": "compute"}]
    nvml.nvmlDeviceSetComputeMode(
        nvml.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    )
    refused = cli("add", "--device", uuid, "--pid", "10")
    assert refused.returncode != 0 and DEVICES_UNAVAILABLE_TEXT in refused.stderr
    assert cli("remove", "--device", uuid, "--pid", "9").returncode == 0
    assert json.loads(cli("list").stdout) == []
