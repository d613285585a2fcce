"""On-demand MIG on the simulator: create at prepare, destroy at unprepare, roll back, clean up at start."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
from sim_node import SimNode

from dra_gpu.config.api import decode_opaque_config
from dra_gpu.inventory.model import Device, DeviceKind
from dra_gpu.sharing.interface import SharingError


def dynamic(node: SimNode, profile: str, start: int | None = None, minor: int = 0) -> Device:
    for d in node.model().devices:
        if (
            d.kind is DeviceKind.MIG_DYNAMIC
            and d.parent_minor == minor
            and d.mig is not None
            and d.mig.profile == profile
            and (start is None or d.mig.placement_start == start)
        ):
            return d
    raise LookupError(f"no dynamic MIG device {profile} at {start} on gpu-{minor}")


def mig_ts() -> object:
    return decode_opaque_config(
        {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "MigDeviceConfig",
            "sharing": {"strategy": "TimeSlicing"},
        }
    )


def test_create_and_destroy_switches_mig_mode_on_and_off(node: SimNode) -> None:
    manager = node.manager()
    a, b = dynamic(node, "1g.10gb", 0), dynamic(node, "3g.40gb", 4)
    result = manager.prepare_group("claim-1", None, [node.alloc(a.name), node.alloc(b.name, request="r2")])
    gpu = node.state().gpus[0]
    assert gpu.mig_current is True
    created = {(gi.profile_id, gi.start) for gi in gpu.gpu_instances}
    assert created == {(a.mig.gi_profile_id, 0), (b.mig.gi_profile_id, 4)}  # type: ignore[union-attr]
    instance = result.mig_instances[a.name]
    assert (
        instance.profile == "1g.10gb" and instance.placement.start == 0 and instance.uuid.startswith("MIG-")
    )
    assert {i.uuid for i in node.hardware.list_mig_devices(node.uuid())} == {
        m.uuid for m in result.mig_instances.values()
    }
    cap = node.root / f"proc/driver/nvidia/capabilities/gpu0/mig/gi{instance.gi_id}/access"
    assert cap.is_file()  # the simulated driver root follows the instances
    assert [m["device"] for m in result.state["migCreated"]] == [a.name, b.name]

    manager.unprepare_group("claim-1", result.state)
    gpu = node.state().gpus[0]
    assert gpu.gpu_instances == [] and gpu.mig_current is False
    assert manager.describe()["createdMig"] == [] and manager.describe()["migModeEnabled"] == []
    manager.unprepare_group("claim-1", result.state)  # idempotent: already gone is fine


def test_mig_mode_stays_on_while_another_claim_has_a_device(node: SimNode) -> None:
    manager = node.manager()
    first = manager.prepare_group("a", None, [node.alloc(dynamic(node, "1g.10gb", 0).name)])
    second = manager.prepare_group("b", mig_ts(), [node.alloc(dynamic(node, "1g.10gb", 1).name)])
    assert second.state["migTimeSlicing"] == [dynamic(node, "1g.10gb", 1).name]
    assert node.gpu_state(node.uuid()).timeslice == 0  # MIG + TimeSlicing: nothing GPU-global is changed
    manager.unprepare_group("a", first.state)
    assert node.state().gpus[0].mig_current is True
    manager.unprepare_group("b", second.state)
    assert node.state().gpus[0].mig_current is False


def test_placement_taken_outside_the_driver_is_a_clear_error(node: SimNode) -> None:
    uuid = node.uuid()
    outsider = node.hardware.create_mig_device(uuid, dynamic(node, "2g.20gb", 2).mig.gi_profile_id, 2)  # type: ignore[union-attr]
    try:
        target = dynamic(node, "1g.10gb", 3)
        with pytest.raises(SharingError) as info:
            node.manager().prepare_group("claim-1", None, [node.alloc(target.name)])
        message = str(info.value)
        assert (
            target.name in message
            and "placement 3:1 is already taken" in message
            and outsider.uuid in message
        )
        assert [i.uuid for i in node.hardware.list_mig_devices(uuid)] == [outsider.uuid]
    finally:
        node.hardware.destroy_mig_device(uuid, outsider.gi_id, outsider.ci_id)
        node.hardware.set_mig_mode(uuid, False)


def test_partial_failure_destroys_what_the_group_created(node: SimNode) -> None:
    uuid = node.uuid()
    first = dynamic(node, "1g.10gb", 0)
    outsider = node.hardware.create_mig_device(uuid, dynamic(node, "1g.10gb", 6).mig.gi_profile_id, 6)  # type: ignore[union-attr]
    try:
        with pytest.raises(SharingError, match="placement 6:1 is already taken"):
            node.manager().prepare_group(
                "claim-1",
                None,
                [node.alloc(first.name), node.alloc(dynamic(node, "1g.10gb", 6).name, request="r2")],
            )
        assert [i.uuid for i in node.hardware.list_mig_devices(uuid)] == [outsider.uuid]
    finally:
        node.hardware.destroy_mig_device(uuid, outsider.gi_id, outsider.ci_id)
        node.hardware.set_mig_mode(uuid, False)


def test_ampere_with_mig_disabled_is_never_toggled(make_node: Callable[[str], SimNode]) -> None:
    node = make_node("a100-40gb")
    uuid = node.uuid()
    smi = str(node.root / "usr/bin/nvidia-smi")
    # Enable MIG the Ampere way (pending until reset) to see the dynamic devices, then disable it again.
    for args in (["-i", uuid, "-mig", "1"], ["-i", uuid, "-r"]):
        subprocess.run([smi, *args], check=True, capture_output=True)
    device = next(d for d in node.model(refresh=True).devices if d.kind is DeviceKind.MIG_DYNAMIC)
    for args in (["-i", uuid, "-mig", "0"], ["-i", uuid, "-r"]):
        subprocess.run([smi, *args], check=True, capture_output=True)
    with pytest.raises(SharingError, match=r"MIG mode is disabled and this Ampere GPU needs a reset.*-mig 1"):
        node.manager().prepare_group("claim-1", None, [node.alloc(device.name)])
    gpu = node.state().gpus[0]
    assert gpu.mig_current is False and gpu.mig_pending is False and gpu.gpu_instances == []


def test_start_up_destroys_only_unowned_instances_we_created(node: SimNode) -> None:
    uuid = node.uuid()
    manager = node.manager()
    kept = manager.prepare_group("kept", None, [node.alloc(dynamic(node, "1g.10gb", 0).name)])
    lost = manager.prepare_group("lost", None, [node.alloc(dynamic(node, "1g.10gb", 1).name)])
    admin = node.hardware.create_mig_device(uuid, dynamic(node, "1g.10gb", 2).mig.gi_profile_id, 2)  # type: ignore[union-attr]
    kept_instance = next(iter(kept.mig_instances.values()))
    lost_instance = next(iter(lost.mig_instances.values()))
    restarted = node.manager()  # "lost" was never checkpointed: its instance must go
    owned = {(uuid, kept_instance.gi_id, kept_instance.ci_id)}
    destroyed = restarted.destroy_unowned_mig(owned)
    assert len(destroyed) == 1 and lost_instance.uuid in destroyed[0]
    assert {i.uuid for i in node.hardware.list_mig_devices(uuid)} == {kept_instance.uuid, admin.uuid}
    assert restarted.destroy_unowned_mig(owned) == []
    restarted.unprepare_group("kept", kept.state)
    node.hardware.destroy_mig_device(uuid, admin.gi_id, admin.ci_id)
    assert node.state().gpus[0].gpu_instances == []
    restarted.destroy_unowned_mig(set())
    assert node.state().gpus[0].mig_current is False


def test_mig_device_config_on_a_full_gpu_is_refused(node: SimNode) -> None:
    with pytest.raises(SharingError, match="cannot apply MigDeviceConfig to device gpu-0 \\(a full GPU\\)"):
        node.manager().prepare_group("c", mig_ts(), [node.alloc("gpu-0")])


def test_admin_access_devices_are_not_created(node: SimNode) -> None:
    device = dynamic(node, "1g.10gb", 0)
    result = node.manager().prepare_group("c", None, [node.alloc(device.name, admin_access=True)])
    assert result.mig_instances == {}
    assert result.state["adminAccessSkipped"] == [device.name]
    assert node.state().gpus[0].gpu_instances == []


def test_failed_creation_leaves_mig_mode_as_it_was(node: SimNode) -> None:
    from dra_gpu.hardware.simulator.state import Fault

    with node.store.transaction() as state:  # NVML_ERROR_INSUFFICIENT_RESOURCES, as on a busy GPU
        state.faults.append(Fault(gpu_index=0, function="nvmlDeviceCreateGpuInstanceWithPlacement", error=23))
    device = dynamic(node, "1g.10gb", 0)
    with pytest.raises(SharingError, match=f"MIG device {device.name} .*creating it failed"):
        node.manager().prepare_group("claim-1", None, [node.alloc(device.name)])
    gpu = node.state().gpus[0]
    assert gpu.mig_current is False and gpu.gpu_instances == []


def test_start_up_spares_an_admin_device_that_reuses_the_ids_of_one_of_ours(node: SimNode) -> None:
    """Ours destroyed out of band, then an administrator's created in its place (same GPU-instance and
    compute-instance ids): the registry's uuid tells them apart, so start-up cleanup leaves it alone."""
    uuid = node.uuid()
    manager = node.manager()
    device = dynamic(node, "1g.10gb", 3)
    ours = next(iter(manager.prepare_group("gone", None, [node.alloc(device.name)]).mig_instances.values()))
    node.hardware.destroy_mig_device(uuid, ours.gi_id, ours.ci_id)
    assert device.mig is not None
    admin = node.hardware.create_mig_device(uuid, device.mig.gi_profile_id, 3)
    assert (admin.gi_id, admin.ci_id) == (ours.gi_id, ours.ci_id) and admin.uuid != ours.uuid

    assert node.manager().destroy_unowned_mig(set()) == []
    assert [i.uuid for i in node.hardware.list_mig_devices(uuid)] == [admin.uuid]
    assert node.manager().describe()["createdMig"] == []  # ours is forgotten
    node.hardware.destroy_mig_device(uuid, admin.gi_id, admin.ci_id)
    node.manager().destroy_unowned_mig(set())  # switches MIG mode off again (we switched it on)
    assert node.state().gpus[0].mig_current is False


def test_replayed_unprepare_leaves_a_reused_instance_alone(node: SimNode) -> None:
    """The crash window: claim-1's MIG device was destroyed, the plugin died before its checkpoint said so,
    and claim-2 then got a MIG device with the same GPU-instance/compute-instance ids. Replaying claim-1's
    unprepare must not destroy claim-2's device (it is told apart by its MIG uuid)."""
    manager = node.manager()
    device = dynamic(node, "1g.10gb", 0)
    first = manager.prepare_group("claim-1", None, [node.alloc(device.name)])
    old = first.mig_instances[device.name]
    node.hardware.destroy_mig_device(old.parent_uuid, old.gi_id, old.ci_id)  # the step before the crash
    second = manager.prepare_group("claim-2", None, [node.alloc(device.name)])
    new = second.mig_instances[device.name]
    assert (new.gi_id, new.ci_id) == (old.gi_id, old.ci_id) and new.uuid != old.uuid  # ids reused

    manager.unprepare_group("claim-1", first.state)  # the replay
    assert [i.uuid for i in node.hardware.list_mig_devices(node.uuid())] == [new.uuid]
    # claim-2's instance is still recorded as ours: a crash now would still clean it up at start
    assert manager.destroy_unowned_mig(set()) == [
        f"{new.uuid} (GPU {new.parent_uuid} gi={new.gi_id} ci={new.ci_id})"
    ]
    assert node.hardware.list_mig_devices(node.uuid()) == []
    second = manager.prepare_group("claim-2", None, [node.alloc(device.name)])
    manager.unprepare_group("claim-2", second.state)
    assert node.hardware.list_mig_devices(node.uuid()) == []
    assert node.state().gpus[0].mig_current is False  # nothing leaks: MIG mode switched off again


class _Killed(BaseException):
    """The plugin process dies here (nothing after it runs, no handler catches it)."""


def _die_at(monkeypatch: pytest.MonkeyPatch, node: SimNode, wrapper: str, function: str) -> None:
    """The plugin dies as it is about to make the NVML call `function` (through the hardware's `wrapper`)."""
    call = getattr(node.hardware, wrapper)

    def die_there(what: str, name: str, *args: object) -> object:
        if name == function:
            raise _Killed
        return call(what, name, *args)

    monkeypatch.setattr(node.hardware, wrapper, die_there)


def test_an_instance_made_just_before_a_crash_is_destroyed_at_start_up(
    node: SimNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the soak (tests/soak): killed after NVML made the MIG device and before the registry named
    it, the instance was nobody's: start-up destroys only what the registry names, so it stayed, and its
    placement was taken for every later claim. The creation is now recorded as an intent first."""
    device = dynamic(node, "1g.10gb", 3)
    create = node.hardware.create_mig_device

    def create_then_die(*args: object) -> object:
        create(*args)  # type: ignore[arg-type]
        raise _Killed

    monkeypatch.setattr(node.hardware, "create_mig_device", create_then_die)
    with pytest.raises(_Killed):
        node.manager().prepare_group("claim-1", None, [node.alloc(device.name)])
    monkeypatch.undo()
    assert len(node.state().gpus[0].gpu_instances) == 1  # made, and recorded nowhere but the intent

    destroyed = node.manager().destroy_unowned_mig(set())  # the next start
    assert len(destroyed) == 1
    gpu = node.state().gpus[0]
    assert gpu.gpu_instances == [] and gpu.mig_current is False  # MIG mode off again: we switched it on
    node.manager().prepare_group("claim-1", None, [node.alloc(device.name)])  # the placement is free
    assert len(node.state().gpus[0].gpu_instances) == 1
    node.manager().destroy_unowned_mig(set())


def test_a_gpu_instance_left_empty_by_a_crash_is_destroyed_by_the_replayed_unprepare(
    node: SimNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the soak (tests/soak): killed between destroying a MIG device's compute instance and its GPU
    instance, the replayed unprepare found no MIG device, took it for gone and forgot it: the empty GPU
    instance stayed, holding its placement (the model then withholds it and the whole GPU)."""
    device = dynamic(node, "2g.20gb", 4)
    manager = node.manager()
    result = manager.prepare_group("claim-1", None, [node.alloc(device.name)])
    _die_at(monkeypatch, node, "_destroy_in_use_aware", "nvmlGpuInstanceDestroy")
    with pytest.raises(_Killed):
        manager.unprepare_group("claim-1", result.state)
    monkeypatch.undo()
    assert node.hardware.list_mig_devices(node.uuid()) == []  # the MIG device is gone, its GPU instance not
    assert len(node.state().gpus[0].gpu_instances) == 1

    node.manager().unprepare_group("claim-1", result.state)  # the kubelet's retry, after the restart
    gpu = node.state().gpus[0]
    assert gpu.gpu_instances == [] and gpu.mig_current is False


def test_start_up_destroys_a_gpu_instance_left_empty_by_a_crash(
    node: SimNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same crash, and the claim was never checkpointed (or is gone): start-up finishes the job."""
    device = dynamic(node, "2g.20gb", 4)
    result = node.manager().prepare_group("claim-1", None, [node.alloc(device.name)])
    _die_at(monkeypatch, node, "_destroy_in_use_aware", "nvmlGpuInstanceDestroy")
    with pytest.raises(_Killed):
        node.manager().unprepare_group("claim-1", result.state)
    monkeypatch.undo()
    assert len(node.manager().destroy_unowned_mig(set())) == 1
    gpu = node.state().gpus[0]
    assert gpu.gpu_instances == [] and gpu.mig_current is False


@pytest.mark.parametrize("mig_was_on", [False, True])
def test_a_gpu_instance_left_empty_by_a_crash_during_creation_is_destroyed_at_start_up(
    node: SimNode, monkeypatch: pytest.MonkeyPatch, mig_was_on: bool
) -> None:
    """Found by the soak (tests/soak, SOAK_SEED=31): killed between NVML making the GPU instance and its
    compute instance (two calls), start-up looked for the intent's MIG device among the full ones only, found
    none and dropped the intent: the empty GPU instance stayed, nobody's, its placement withheld from the
    model (the retried prepare was refused: "names device ..., which node ... does not have")."""
    if mig_was_on:
        node.hardware.set_mig_mode(node.uuid(), True)
    device = dynamic(node, "3g.40gb", 4)
    _die_at(monkeypatch, node, "_call", "nvmlGpuInstanceCreateComputeInstance")
    with pytest.raises(_Killed):
        node.manager().prepare_group("claim-1", None, [node.alloc(device.name)])
    monkeypatch.undo()
    assert node.hardware.list_mig_devices(node.uuid()) == []  # no MIG device, but its GPU instance
    assert len(node.state().gpus[0].gpu_instances) == 1

    assert len(node.manager().destroy_unowned_mig(set())) == 1  # the next start
    gpu = node.state().gpus[0]
    assert gpu.gpu_instances == [] and gpu.mig_current is mig_was_on  # MIG mode off again if we switched it
    node.manager().prepare_group("claim-1", None, [node.alloc(device.name)])  # the placement is free
    assert len(node.state().gpus[0].gpu_instances) == 1


def test_mig_mode_switched_on_by_a_creation_killed_before_its_gpu_instance_is_switched_off_at_start_up(
    node: SimNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same kill one NVML call earlier: MIG mode was switched on for the creation and no GPU instance was
    made yet. Nothing else needs MIG mode there, so start-up switches it off (MIG mode left on withholds the
    whole GPU from the model)."""
    device = dynamic(node, "3g.40gb", 4)
    _die_at(monkeypatch, node, "_call", "nvmlDeviceCreateGpuInstanceWithPlacement")
    with pytest.raises(_Killed):
        node.manager().prepare_group("claim-1", None, [node.alloc(device.name)])
    monkeypatch.undo()
    assert node.state().gpus[0].mig_current is True and node.state().gpus[0].gpu_instances == []

    node.manager().destroy_unowned_mig(set())  # the next start
    assert node.state().gpus[0].mig_current is False
