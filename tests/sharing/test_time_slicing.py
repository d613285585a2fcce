"""Time-slicing on the simulator: set only when asked, ref-counted, reset by the last holder."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sim_node import SimNode

from dra_gpu.config.api import decode_opaque_config
from dra_gpu.hardware.simulator.state import Fault
from dra_gpu.hardware.types import ComputeMode
from dra_gpu.sharing.interface import SharingError


def ts_config(interval: str | None = None) -> object:
    sharing: dict[str, object] = {"strategy": "TimeSlicing"}
    if interval is not None:
        sharing["timeSlicingConfig"] = {"interval": interval}
    return decode_opaque_config(
        {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}
    )


@pytest.mark.parametrize(("interval", "value"), [("Default", 0), ("Short", 1), ("Medium", 2), ("Long", 3)])
def test_interval_is_set_and_reset(node: SimNode, interval: str, value: int) -> None:
    manager = node.manager()
    uuid = node.uuid()
    node.hardware.set_compute_mode(uuid, ComputeMode.PROHIBITED)
    result = manager.prepare_group("claim-1", ts_config(interval), [node.alloc("gpu-0")])
    assert node.gpu_state(uuid).timeslice == value
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.DEFAULT)  # nvidia-smi -c DEFAULT first
    assert result.state["timeSlice"] == {"interval": value, "gpus": [uuid]}
    assert result.undo_needed  # the prepare records the group before it goes on
    assert result.edits.env == ()
    manager.unprepare_group("claim-1", result.state)
    assert node.gpu_state(uuid).timeslice == 0
    assert node.manager().describe()["timeSlice"] == {}


def test_no_config_and_no_sharing_change_nothing(node: SimNode) -> None:
    manager = node.manager()
    uuid = node.uuid()
    node.hardware.set_time_slice(uuid, 2)  # set out of band: must survive claims that did not ask
    plain = decode_opaque_config({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"})
    for config in (None, plain):
        result = manager.prepare_group("c", config, [node.alloc("gpu-0")])
        assert result.state["timeSlice"] is None
        assert not result.undo_needed  # nothing a crash before the completed record would leave behind
        manager.unprepare_group("c", result.state)
        assert node.gpu_state(uuid).timeslice == 2


def test_last_holder_resets_and_conflicting_interval_is_refused(node: SimNode) -> None:
    manager = node.manager()
    uuid = node.uuid()
    first = manager.prepare_group("claim-a", ts_config("Long"), [node.alloc("gpu-0")])
    second = manager.prepare_group("claim-b", ts_config("Long"), [node.alloc("gpu-0", admin_access=False)])
    with pytest.raises(SharingError, match=r"interval Long for claim\(s\) claim-a, claim-b.*Short"):
        manager.prepare_group("claim-c", ts_config("Short"), [node.alloc("gpu-0")])
    manager.unprepare_group("claim-a", first.state)
    assert node.gpu_state(uuid).timeslice == 3  # claim-b still holds it
    manager.unprepare_group("claim-b", second.state)
    assert node.gpu_state(uuid).timeslice == 0


def test_ref_count_survives_a_restart(node: SimNode) -> None:
    uuid = node.uuid()
    first = node.manager().prepare_group("claim-a", ts_config("Medium"), [node.alloc("gpu-0")])
    second = node.manager().prepare_group("claim-b", ts_config("Medium"), [node.alloc("gpu-0")])
    restarted = node.manager()  # a new process would read the same registry
    restarted.unprepare_group("claim-a", first.state)
    assert node.gpu_state(uuid).timeslice == 2
    restarted.unprepare_group("claim-b", second.state)
    restarted.unprepare_group("claim-b", second.state)  # idempotent
    assert node.gpu_state(uuid).timeslice == 0


def test_registry_from_an_earlier_boot_is_ignored(node: SimNode) -> None:
    uuid = node.uuid()
    node.manager(boot_id="boot-1").prepare_group("old-claim", ts_config("Long"), [node.alloc("gpu-0")])
    after_reboot = node.manager(boot_id="boot-2")
    assert after_reboot.describe()["timeSlice"] == {}
    node.hardware.set_time_slice(uuid, 0)  # what a reboot does to the GPU


def test_gpu_that_cannot_change_it_gives_a_clear_error(node: SimNode) -> None:
    with node.store.transaction() as state:  # nvidia-smi -c fails on this GPU
        state.faults.append(Fault(gpu_index=0, function="nvmlDeviceSetComputeMode", error=3))
    manager = node.manager()
    with pytest.raises(SharingError, match=r"cannot set time-slice interval Long on GPU .*Tesla P4"):
        manager.prepare_group("claim-1", ts_config("Long"), [node.alloc("gpu-0")])
    assert manager.describe()["timeSlice"] == {}
    assert node.gpu_state(node.uuid()).timeslice == 0


def test_all_gpus_of_the_group_or_none(make_node: Callable[[str], SimNode]) -> None:
    node = make_node("dgx-h100")
    with node.store.transaction() as state:
        state.faults.append(Fault(gpu_index=3, function="nvmlDeviceSetComputeMode", error=3))
    uuids = [node.uuid(m) for m in range(4)]
    manager = node.manager()
    devices = [node.alloc(f"gpu-{m}") for m in range(4)]
    with pytest.raises(SharingError, match=uuids[3]):
        manager.prepare_group("claim-1", ts_config("Short"), devices)
    assert [node.gpu_state(u).timeslice for u in uuids] == [0, 0, 0, 0]
    result = manager.prepare_group("claim-2", ts_config("Short"), devices[:3])
    assert [node.gpu_state(u).timeslice for u in uuids] == [1, 1, 1, 0]
    manager.unprepare_group("claim-2", result.state)
    assert [node.gpu_state(u).timeslice for u in uuids] == [0, 0, 0, 0]


def test_time_slicing_config_on_a_mig_device_is_refused(node: SimNode) -> None:
    mig = next(d.name for d in node.model().devices if d.kind.value == "mig-dynamic")
    with pytest.raises(
        SharingError, match=f"cannot apply GpuConfig sharing strategy TimeSlicing to device {mig}"
    ):
        node.manager().prepare_group("c", ts_config("Long"), [node.alloc(mig)])
    assert node.state().gpus[0].gpu_instances == []


def _pre_volta_hardware() -> list[str]:
    """Simulated single-GPU layouts older than Volta (e.g. a Tesla P4), if the simulator models any."""
    from dra_gpu.hardware import profiles

    names = []
    for name in profiles.known_hardware_names():
        slots = profiles.resolve_layout(name).slots
        if len(slots) == 1 and slots[0].profile.cuda_compute_capability < (7, 0):
            names.append(name)
    return names


@pytest.mark.skipif(not _pre_volta_hardware(), reason="the simulator models no pre-Volta GPU yet")
@pytest.mark.parametrize("hardware", _pre_volta_hardware())
def test_pre_volta_gpu_refuses_mps_and_reports_time_slicing_clearly(
    make_node: Callable[[str], SimNode], hardware: str
) -> None:
    node = make_node(hardware)
    mps = decode_opaque_config(
        {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    )
    with pytest.raises(SharingError, match="compute capability"):
        node.manager().prepare_group("c", mps, [node.alloc("gpu-0")])
    try:  # old GPUs may or may not support --set-timeslice; either it works and is undone, or it says why
        result = node.manager().prepare_group("c", ts_config("Long"), [node.alloc("gpu-0")])
    except SharingError as err:
        assert "cannot set time-slice interval Long" in str(err)
    else:
        node.manager().unprepare_group("c", result.state)
    assert node.gpu_state(node.uuid()).timeslice == 0
    assert node.leftovers() == []
