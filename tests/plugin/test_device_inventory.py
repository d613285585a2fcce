"""Re-discovery on the simulator: a changed inventory is handed on once, an unchanged one never, and a
discovery that fails keeps the previous model."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from dra_gpu.hardware.loader import open_hardware
from dra_gpu.hardware.sim_driver_root import state_path
from dra_gpu.inventory.model import DeviceModel
from dra_gpu.plugin.device_inventory import DeviceInventory, Rediscovery
from tests.plugin.plugin_harness import REPO_ROOT, SimNode


@pytest.fixture
def sim() -> Iterator[SimNode]:
    node = SimNode(name="inv-node")
    yield node
    node.cleanup()


def names(model: DeviceModel) -> set[str]:
    return {d.name for d in model.devices}


def lose_gpu(node: SimNode, index: int) -> None:
    """Every NVML call for the GPU fails with GPU_IS_LOST, as `dra-gpu hardware fault` sets it up."""
    argv = ["hardware", "fault", "--driver-root", str(node.driver_root), "-i", str(index)]
    subprocess.run(
        [sys.executable, "-m", "dra_gpu.cli.main", *argv],
        check=True, capture_output=True, timeout=60, cwd=REPO_ROOT,
    )


def test_changes_are_handed_on_once(sim: SimNode) -> None:
    inventory = DeviceInventory(open_hardware(sim.hardware, str(sim.driver_root)))
    seen: list[DeviceModel] = []
    rediscovery = Rediscovery(inventory, seen.append, interval_s=3600)
    first = inventory.model()
    assert rediscovery.run_once() is False and seen == []

    lose_gpu(sim, 3)
    assert rediscovery.run_once() is True
    gone = names(first) - names(seen[0])  # the GPU, its share device and its MIG devices
    assert {"gpu-3", "gpu-3-shared", "gpu-3-mig-1g10gb-19-4"} <= gone
    assert gone == {n for n in names(first) if n == "gpu-3" or n.startswith("gpu-3-")}
    assert names(seen[0]) == names(first) - gone
    assert inventory.model() is seen[0]
    assert rediscovery.run_once() is False and len(seen) == 1


def test_failed_discovery_keeps_the_previous_model(sim: SimNode) -> None:
    inventory = DeviceInventory(open_hardware(sim.hardware, str(sim.driver_root)))
    seen: list[DeviceModel] = []
    rediscovery = Rediscovery(inventory, seen.append, interval_s=3600)
    before = inventory.model()
    path = state_path(sim.driver_root)
    os.rename(path, f"{path}.away")  # the simulated driver disappears
    try:
        assert rediscovery.run_once() is False
    finally:
        os.rename(f"{path}.away", path)
    assert inventory.model() is before and seen == [] and rediscovery.rounds == 1


def test_trigger_wakes_the_thread_before_the_interval(sim: SimNode) -> None:
    inventory = DeviceInventory(open_hardware(sim.hardware, str(sim.driver_root)))
    seen: list[DeviceModel] = []
    rediscovery = Rediscovery(inventory, seen.append, interval_s=3600)
    rediscovery.start()
    try:
        lose_gpu(sim, 5)
        rediscovery.trigger()  # what the plugin's SIGHUP handler does
        deadline = time.monotonic() + 20
        while not seen:
            assert time.monotonic() < deadline, "trigger did not re-discover"
            time.sleep(0.02)
        assert "gpu-5" not in names(seen[0])
    finally:
        rediscovery.stop()


def test_interval_must_be_positive(sim: SimNode) -> None:
    inventory = DeviceInventory(open_hardware(sim.hardware, str(sim.driver_root)))
    with pytest.raises(ValueError, match="interval must be > 0"):
        Rediscovery(inventory, lambda _m: None, interval_s=0)
