"""HealthMonitor + HealthView on the NVML simulator, in-process: unmonitored GPUs, change notifications, and
the model's identity staying stable while nothing changes."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from dra_gpu.hardware.health_events import NvmlHealthEvents
from dra_gpu.hardware.loader import open_hardware
from dra_gpu.hardware.sim_driver_root import init_sim_driver_root, open_simulated_nvml, state_path
from dra_gpu.hardware.simulator.state import Fault, StateStore
from dra_gpu.inventory.device_health import HealthPolicy
from dra_gpu.inventory.device_model import build_device_model
from dra_gpu.plugin.health_monitor import HealthMonitor, HealthView


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hm-", dir="/tmp"))
    init_sim_driver_root(path, "dgx-h100", seed="hm")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_unmonitored_gpu_gets_effect_none_taint_and_changes_are_announced(root: Path) -> None:
    with StateStore(state_path(root)).transaction() as state:
        state.faults.append(Fault(1, "nvmlDeviceRegisterEvents", pynvml.NVML_ERROR_NOT_SUPPORTED))
    base = build_device_model(open_hardware("dgx-h100", str(root)).discover())
    changes = threading.Semaphore(0)
    monitor = HealthMonitor(
        NvmlHealthEvents(open_simulated_nvml(root)),
        HealthPolicy(recovery_quiet_s=0.5),
        wait_s=0.1,
        on_change=changes.release,
    )
    view = HealthView(lambda: base, monitor)
    assert view.model() is base
    monitor.start()
    try:
        assert changes.acquire(timeout=5)  # the failed registration is a change
        model = view.model()
        assert model is view.model()  # cached while nothing changes
        tainted = {d.name for d in model.devices if d.taints}
        assert tainted == {d.name for d in base.devices if d.parent_minor == 1}
        assert {(t.key, t.effect) for d in model.devices for t in d.taints} == {
            ("gpu.nvidia.com/unmonitored", "None")
        }
        sim = open_simulated_nvml(root)
        sim.nvmlInit()
        sim.inject_xid(4, 48, recovery_action=pynvml.NVML_GPU_RECOVERY_ACTION_NONE)
        assert changes.acquire(timeout=5)
        by_name = view.model().by_name()
        assert [t.value for t in by_name["gpu-4"].taints] == ["48"]
        # no reset needed: a probe after the quiet period clears it
        assert changes.acquire(timeout=5)
        assert not view.model().by_name()["gpu-4"].taints
    finally:
        monitor.stop()


def test_stop_returns_without_waiting_out_the_poll_interval(root: Path) -> None:
    """A plugin restart or upgrade stops the monitor: it must not sit out the rest of a 5 s event wait."""
    open_hardware("dgx-h100", str(root)).discover()
    monitor = HealthMonitor(NvmlHealthEvents(open_simulated_nvml(root)), HealthPolicy(), wait_s=5.0)
    monitor.start()
    time.sleep(0.5)  # inside the first event wait
    began = time.monotonic()
    monitor.stop()
    assert time.monotonic() - began < 2.0
