"""Re-discovery on the simulator: a changed inventory is handed on once, an unchanged one never, and a
discovery that fails keeps the previous model."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from dra_gpu.hardware.loader import open_hardware
from dra_gpu.hardware.sim_driver_root import state_path
from dra_gpu.hardware.types import DiscoveryResult, MigInstance
from dra_gpu.inventory.model import DeviceModel
from dra_gpu.plugin.device_inventory import DeviceInventory, DiscoveryFailedError, Rediscovery
from tests.plugin.plugin_harness import SimNode


@pytest.fixture
def sim() -> Iterator[SimNode]:
    node = SimNode(name="inv-node")
    yield node
    node.cleanup()


def names(model: DeviceModel) -> set[str]:
    return {d.name for d in model.devices}


def lose_gpu(node: SimNode, index: int) -> None:
    """Every NVML call for the GPU fails with GPU_IS_LOST, as `dra-gpu hardware fault` sets it up."""
    node.hardware_cli("fault", "-i", str(index))


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


PROFILE_2G = 14  # 2g.20gb on H100


def test_mig_devices_of_our_claims_leave_the_model_unchanged(sim: SimNode) -> None:
    hardware = open_hardware(sim.hardware, str(sim.driver_root))
    owned: set[tuple[str, int]] = set()
    discoveries: list[tuple[DiscoveryResult, float]] = []
    inventory = DeviceInventory(
        hardware, owned_mig=lambda: owned, on_discovery=lambda d, t: discoveries.append((d, t))
    )
    before = inventory.model()
    assert len(discoveries) == 1
    uuid = hardware.discover().gpus[1].uuid
    instance = hardware.create_mig_device(uuid, PROFILE_2G, 4)

    owned.add((uuid, instance.gi_id))  # a claim's: nothing changes
    assert inventory.refresh() == (before, False)
    assert discoveries[-1][0].gpus[1].mig_instances == (instance,)
    assert discoveries[-1][1] > discoveries[0][1]

    owned.clear()  # nobody's (made out of band): published, and the whole GPU withdrawn
    model, changed = inventory.refresh()
    assert changed and "gpu-1" not in names(model) and "gpu-1-mig-2g20gb-14-4" in names(model)
    assert names(model) - names(before) == set()  # the static device takes the dynamic device's name


def test_connect_takes_effect_at_the_next_refresh(sim: SimNode) -> None:
    """The composition root builds the inventory before the checkpoint is read, and connects it after;
    until then every MIG device counts as ours (the model stays as without any)."""
    hardware = open_hardware(sim.hardware, str(sim.driver_root))
    empty = names(DeviceInventory(hardware).model())
    uuid = hardware.discover().gpus[2].uuid
    instance = hardware.create_mig_device(uuid, PROFILE_2G, 0)
    inventory = DeviceInventory(hardware)
    assert names(inventory.model()) == empty
    inventory.connect(owned_mig=frozenset)  # the checkpoint says: none of ours
    model, changed = inventory.refresh()
    assert changed and "gpu-2" not in names(model)
    inventory.connect(owned_mig=lambda: {(uuid, instance.gi_id)})
    model, changed = inventory.refresh()
    assert changed and names(model) == empty


def test_prepare_racing_with_discovery_never_looks_out_of_band(sim: SimNode) -> None:
    """The owned set is read before and after discovering: a prepare that created its device while the
    hardware was read (checkpointed by the second read) and an unprepare that destroyed one after it was
    read (still checkpointed at the first) both leave the model alone."""
    hardware = open_hardware(sim.hardware, str(sim.driver_root))
    uuid = hardware.discover().gpus[3].uuid
    inventory = DeviceInventory(hardware)
    before = inventory.model()

    created: list[MigInstance] = []

    def prepare_during_discovery() -> frozenset[tuple[str, int]]:
        if not created:  # first read: the prepare is running, nothing checkpointed yet
            created.append(hardware.create_mig_device(uuid, PROFILE_2G, 2))
            return frozenset()
        return frozenset({(uuid, created[0].gi_id)})  # second read: checkpointed

    inventory.connect(owned_mig=prepare_during_discovery)
    assert inventory.refresh() == (before, False)

    destroyed: list[bool] = []

    def unprepare_after_discovery() -> frozenset[tuple[str, int]]:
        if not destroyed:  # first read: still prepared
            destroyed.append(False)
            return frozenset({(uuid, created[0].gi_id)})
        hardware.destroy_mig_device(uuid, created[0].gi_id, created[0].ci_id)  # done after the read
        return frozenset()

    inventory.connect(owned_mig=unprepare_after_discovery)
    assert inventory.refresh() == (before, False)


def test_unreadable_owned_set_keeps_the_previous_model(sim: SimNode) -> None:
    def broken() -> frozenset[tuple[str, int]]:
        raise OSError("checkpoint lock timed out")

    inventory = DeviceInventory(open_hardware(sim.hardware, str(sim.driver_root)))
    before = inventory.model()
    inventory.connect(owned_mig=broken)
    seen: list[DeviceModel] = []
    rediscovery = Rediscovery(inventory, seen.append, interval_s=3600)
    with pytest.raises(DiscoveryFailedError, match="cannot read which MIG devices prepared claims own"):
        inventory.refresh()
    assert rediscovery.run_once() is False and inventory.model() is before and seen == []


def test_an_unchanged_discovery_reuses_the_model_and_a_change_rebuilds_it(sim: SimNode) -> None:
    """The plugin re-discovers right after its start-up cleanup and then periodically; when neither the
    hardware nor the owned MIG set changed, the model (a pure function of both) is not built again. Every
    discovery still reaches the listener, so the sharing manager's GPU facts stay current."""
    hardware = open_hardware(sim.hardware, str(sim.driver_root))
    inventory = DeviceInventory(hardware)
    first = inventory.model()
    heard: list[DiscoveryResult] = []
    inventory.connect(owned_mig=frozenset, on_discovery=lambda d, _t: heard.append(d))
    model, changed = inventory.refresh()
    assert model is first and not changed and len(heard) == 1
    assert inventory.last_discovery[0] is heard[0]

    uuid = heard[0].gpus[2].uuid
    hardware.create_mig_device(uuid, 19, 6)  # out of band: published as it is, hiding what it overlaps
    model, changed = inventory.refresh()
    assert changed and model is not first and "gpu-2" not in names(model)
    again, changed = inventory.refresh()
    assert again is model and not changed
    inventory.connect(owned_mig=lambda: {(uuid, heard[-1].gpus[2].mig_instances[0].gi_id)})
    ours, changed = inventory.refresh()  # the same hardware, but now the instance is a claim's
    assert changed and ours is not model and names(ours) == names(first)
