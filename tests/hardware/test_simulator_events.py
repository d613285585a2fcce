"""NVML events in the simulator: pynvml's event calls, XIDs injected from another process, lost GPUs, resets;
and `NvmlHealthEvents`, which reads them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_gpu.hardware.health_events import GpuLostError, NvmlHealthEvents
from dra_gpu.hardware.sim_driver_root import init_sim_driver_root, open_simulated_nvml
from dra_gpu.hardware.simulator import SimulatedNvml
from dra_gpu.hardware.types import ALL_INSTANCES

H100_1G = 19


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ev-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _nvml(root: Path, hardware: str = "dgx-h100") -> SimulatedNvml:
    init_sim_driver_root(root, hardware, seed="node-a")
    nvml = open_simulated_nvml(root)
    nvml.nvmlInit()
    return nvml


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_gpu.cli.hardware", *args, "--driver-root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _registered_set(nvml: SimulatedNvml, *indexes: int) -> Any:
    event_set = nvml.nvmlEventSetCreate()
    assert isinstance(event_set, pynvml.c_nvmlEventSet_t)
    for index in indexes:
        nvml.nvmlDeviceRegisterEvents(
            nvml.nvmlDeviceGetHandleByIndex(index), pynvml.nvmlEventTypeXidCriticalError, event_set
        )
    return event_set


def test_wait_times_out_with_nvml_timeout(root: Path) -> None:
    nvml = _nvml(root)
    event_set = _registered_set(nvml, 0)
    started = time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(event_set, 200)
    assert 0.15 <= time.monotonic() - started < 2.0
    nvml.nvmlEventSetFree(event_set)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlEventSetWait_v2(event_set, 0)


def test_xid_from_another_process_arrives_as_pynvml_event_data(root: Path) -> None:
    nvml = _nvml(root)
    event_set = _registered_set(nvml, 3)
    result = _cli(root, "xid", "--gpu", "3", "--xid", "79")
    assert result.returncode == 0, result.stderr
    data = nvml.nvmlEventSetWait_v2(event_set, 2000)
    assert isinstance(data, pynvml.c_nvmlEventData_t)
    assert data.eventType == pynvml.nvmlEventTypeXidCriticalError
    assert data.eventData == 79
    assert (data.gpuInstanceId, data.computeInstanceId) == (ALL_INSTANCES, ALL_INSTANCES)
    assert nvml.nvmlDeviceGetUUID(data.device) == nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(3))
    with pytest.raises(pynvml.NVMLError_Timeout):  # delivered once
        nvml.nvmlEventSetWait_v2(event_set, 0)


def test_events_before_registration_and_of_other_gpus_are_not_delivered(root: Path) -> None:
    nvml = _nvml(root)
    assert _cli(root, "xid", "--gpu", "1", "--xid", "48").returncode == 0
    event_set = _registered_set(nvml, 1)
    assert _cli(root, "xid", "--gpu", "2", "--xid", "48").returncode == 0
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(event_set, 100)
    assert _cli(root, "xid", "--gpu", "1", "--xid", "94").returncode == 0
    assert nvml.nvmlEventSetWait_v2(event_set, 1000).eventData == 94


def test_mig_xid_carries_instance_ids_and_is_checked(root: Path) -> None:
    nvml = _nvml(root)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE)
    gi = nvml.nvmlDeviceCreateGpuInstance(handle, H100_1G)
    gi_id = nvml.nvmlGpuInstanceGetInfo(gi).id
    nvml.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    event_set = _registered_set(nvml, 0)
    bad = _cli(root, "xid", "--gpu", "0", "--xid", "43", "--gi", str(gi_id + 1))
    assert bad.returncode == 1 and "no GPU instance" in bad.stderr
    assert _cli(root, "xid", "--gpu", "0", "--xid", "43", "--gi", str(gi_id), "--ci", "0").returncode == 0
    data = nvml.nvmlEventSetWait_v2(event_set, 1000)
    assert (data.eventData, data.gpuInstanceId, data.computeInstanceId) == (43, gi_id, 0)


def test_register_rejects_unsupported_event_types(root: Path) -> None:
    nvml = _nvml(root)
    event_set = nvml.nvmlEventSetCreate()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeClock, event_set)
    supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
    assert supported & pynvml.nvmlEventTypeXidCriticalError


def test_gpu_lost_and_recover_with_recovery_action(root: Path) -> None:
    nvml = _nvml(root)
    handle = nvml.nvmlDeviceGetHandleByIndex(5)
    field = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    assert nvml.nvmlDeviceGetFieldValues(handle, [field])[0].value.uiVal == 0
    assert _cli(root, "xid", "--gpu", "5", "--xid", "79").returncode == 0
    value = nvml.nvmlDeviceGetFieldValues(handle, [field])[0]
    assert value.nvmlReturn == pynvml.NVML_SUCCESS
    assert value.value.uiVal == pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    event_set = _registered_set(nvml, 5)
    assert _cli(root, "gpu-lost", "--gpu", "5").returncode == 0
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetUUID(handle)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlEventSetWait_v2(event_set, 100)
    assert _cli(root, "recover", "--gpu", "5").returncode == 0
    assert nvml.nvmlDeviceGetUUID(handle)
    assert nvml.nvmlDeviceGetFieldValues(handle, [field])[0].value.uiVal == 0
    state = json.loads(_cli(root, "state").stdout)
    assert state["resets"] == 1 and state["faults"] == []


def test_cli_rejects_unknown_gpu_and_ci_without_gi(root: Path) -> None:
    _nvml(root)
    result = _cli(root, "xid", "--gpu", "42", "--xid", "79")
    assert result.returncode == 1 and "minor" in result.stderr
    result = _cli(root, "xid", "--gpu", "0", "--xid", "79", "--ci", "0")
    assert result.returncode == 1 and "--ci needs --gi" in result.stderr


def test_health_events_reader(root: Path) -> None:
    _nvml(root)
    events = NvmlHealthEvents(open_simulated_nvml(root))
    try:
        assert len(events.gpus) == 8
        events.register()
        assert events.registered == frozenset(events.gpus) and events.unmonitored == {}
        assert events.wait(0.1) is None
        assert _cli(root, "xid", "--gpu", "3", "--xid", "79").returncode == 0
        event = events.wait(2.0)
        assert event is not None and event.gpu_uuid == events.gpus[3] and event.xid == 79 and event.whole_gpu
        probe = events.probe(events.gpus[3])
        assert probe.answering and probe.reset_required
        assert _cli(root, "gpu-lost", "--gpu", "3").returncode == 0
        with pytest.raises(GpuLostError):
            events.wait(0.5)
        assert not events.probe(events.gpus[3]).answering
        events.register([u for u in events.gpus if u != events.gpus[3]])
        assert events.wait(0.1) is None  # the lost GPU is out of the set, the others still wait normally
        assert _cli(root, "recover", "--gpu", "3").returncode == 0
        probe = events.probe(events.gpus[3])
        assert probe.answering and not probe.reset_required
    finally:
        events.close()


def test_registration_failure_is_reported_unmonitored(root: Path) -> None:
    _nvml(root)
    assert (
        subprocess.run(
            [
                sys.executable,
                "-m",
                "dra_gpu.cli.hardware",
                "fault",
                "--driver-root",
                str(root),
                "-i",
                "2",
                "--function",
                "nvmlDeviceRegisterEvents",
                "--error",
                str(pynvml.NVML_ERROR_NOT_SUPPORTED),
            ],
            timeout=60,
        ).returncode
        == 0
    )
    events = NvmlHealthEvents(open_simulated_nvml(root))
    try:
        events.register()
        assert set(events.unmonitored) == {events.gpus[2]}
        assert "registration failed" in events.unmonitored[events.gpus[2]]
        assert events.gpus[2] not in events.registered and len(events.registered) == 7
    finally:
        events.close()


def test_double_bit_ecc_event_is_read_as_xid_48_and_needs_a_reset(root: Path) -> None:
    _nvml(root)
    events = NvmlHealthEvents(open_simulated_nvml(root))
    try:
        events.register()
        assert _cli(root, "xid", "--gpu", "2", "--xid", "48", "--ecc-event").returncode == 0
        event = events.wait(2.0)
        assert event is not None and event.gpu_uuid == events.gpus[2] and event.xid == 48 and event.whole_gpu
        probe = events.probe(events.gpus[2])
        assert probe.answering and probe.reset_required and probe.recovery_known
        assert _cli(root, "recover", "--gpu", "2").returncode == 0
        probe = events.probe(events.gpus[2])
        assert probe.recovery_known and not probe.reset_required
    finally:
        events.close()


def test_latency_fault_slows_a_call_without_failing_it(root: Path) -> None:
    nvml = _nvml(root)
    done = _cli(root, "fault", "--index", "1", "--function", "nvmlDeviceGetUUID", "--delay-seconds", "0.4")
    assert done.returncode == 0, done.stderr
    began = time.monotonic()
    nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(1))
    assert time.monotonic() - began >= 0.4
    began = time.monotonic()
    nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(0))  # other GPUs are not slowed
    assert time.monotonic() - began < 0.4
    assert _cli(root, "fault", "--index", "1", "--delay-seconds", "-1").returncode != 0
