"""Inventory changes under a running plugin (MIG set up out of band, a GPU failing) reach the published
ResourceSlices: re-discovery every `--rediscovery-interval` seconds and on SIGHUP, against a real
apiserver."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from dra_gpu.hardware.interface import HardwareError
from dra_gpu.hardware.loader import open_hardware
from dra_gpu.inventory.device_model import ModelOptions, build_device_model
from tests.plugin.plugin_harness import ClaimFactory, PluginProcess, SimNode

pytestmark = pytest.mark.apiserver


@pytest.fixture
def node() -> Iterator[SimNode]:
    """An A100 node: Ampere switches MIG mode only with a GPU reset, so an administrator does that out of
    band."""
    sim = SimNode(name=f"node-{uuid.uuid4().hex[:8]}", hardware="dgx-a100")
    yield sim
    sim.cleanup()


def model_devices(node: SimNode) -> set[str]:
    """What the plugin should publish for the simulated hardware as it is now."""
    discovery = open_hardware(node.hardware, str(node.driver_root)).discover()
    return {d.name for d in build_device_model(discovery, ModelOptions()).devices}


def test_mig_set_up_out_of_band_is_published_after_sighup(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    plugin = start_plugin(extra_args=["--publish-slices", "true", "--rediscovery-interval", "3600"])
    before = set(claims.wait_published(lambda d: set(d) == model_devices(node)))
    assert {"gpu-1", "gpu-1-shared"} <= before and not any(d.startswith("gpu-1-mig-") for d in before)

    # The administrator enables MIG on GPU 1 (takes effect at the reset) and creates an instance.
    hardware = open_hardware("dgx-a100", str(node.driver_root))
    gpu = next(g for g in hardware.discover().gpus if g.minor == 1)
    with pytest.raises(HardwareError, match="pending until the GPU is reset"):
        hardware.set_mig_mode(gpu.uuid, True)
    node.hardware_cli("reset", "-i", str(gpu.index))
    profile = gpu.mig_profiles[0]
    hardware.create_mig_device(gpu.uuid, profile.gi_profile_id, profile.placements[0].start)

    time.sleep(1.0)  # nothing re-discovers on its own within the hour-long interval
    assert set(claims.published_devices()) == before
    plugin.proc.send_signal(signal.SIGHUP)
    after = set(claims.wait_published(lambda d: "gpu-1" not in d))
    assert "gpu-1-shared" not in after
    assert any(d.startswith("gpu-1-mig-") for d in after)
    assert {d for d in after if not d.startswith("gpu-1")} == {d for d in before if not d.startswith("gpu-1")}
    assert after == model_devices(node)
    assert plugin.proc.poll() is None  # SIGHUP re-discovers; it does not end the plugin


def test_failing_gpu_is_withdrawn_and_returns_on_periodic_rediscovery(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    start_plugin(extra_args=["--publish-slices", "true", "--rediscovery-interval", "0.5"])
    before = set(claims.wait_published(lambda d: set(d) == model_devices(node)))
    assert {"gpu-2", "gpu-2-shared"} <= before

    node.hardware_cli("fault", "-i", "2")  # every NVML call for GPU 2 fails with GPU_IS_LOST
    # Wait for the end state, not the first list without gpu-2: the slices are rewritten one at a time (a
    # GPU's device slice is renamed when one before it goes), so a list taken meanwhile can miss others.
    claims.wait_published(lambda d: set(d) == before - {"gpu-2", "gpu-2-shared"})

    node.hardware_cli("fault", "--clear")
    # the end state again: with the health monitor on, the lost GPU's taints come and go in their own writes
    claims.wait_published(lambda d: set(d) == before)
