"""A GPU that processes still use (NVML_ERROR_IN_USE): on-demand MIG is refused cleanly where MIG mode would
have to switch, MIG devices with processes on them are destroyed later, never leaked; a GPU renumbered by a
MIG mode switch is found again by UUID; a time-slice step that finds the GPU lost is reset once it returns."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest
from sim_node import SimNode
from test_mig_lifecycle import dynamic
from test_time_slicing import ts_config

from dra_gpu.hardware.sim_tools.nvidia_smi import SET_TIMESLICE_STEP
from dra_gpu.hardware.simulator.contexts import add_context, remove_context
from dra_gpu.hardware.simulator.state import Fault
from dra_gpu.sharing.interface import SharingError
from dra_gpu.sharing.manager import HardwareSharingManager

GPU_IS_LOST = 15


def _unprepare_fast(manager: HardwareSharingManager, claim_uid: str, state: Mapping[str, Any]) -> None:
    started = time.monotonic()
    manager.unprepare_group(claim_uid, state)  # no SharingError: the kubelet can finish the pod
    assert time.monotonic() - started < 10


def test_on_demand_mig_on_a_busy_gpu_is_refused_and_leaves_nothing(node: SimNode) -> None:
    uuid = node.uuid()
    add_context(node.root, uuid, 4242)  # a CUDA process on the whole GPU: MIG mode cannot switch
    manager = node.manager()
    device = dynamic(node, "1g.10gb", 0)
    with pytest.raises(SharingError) as failure:
        manager.prepare_group("claim-1", None, [node.alloc(device.name)])
    message = str(failure.value)
    assert device.name in message and uuid in message and "pid 4242" in message
    assert "not idle" in message and "Stop the processes" in message
    gpu = node.gpu_state(uuid)
    assert (gpu.mig_current, gpu.mig_pending, gpu.gpu_instances) == (False, False, [])  # nothing pending
    assert manager.describe()["createdMig"] == [] and manager.describe()["migModeEnabled"] == []
    # once the process is gone, the claim's next prepare works
    assert remove_context(node.root, uuid, 4242)
    result = manager.prepare_group("claim-1", None, [node.alloc(device.name)])
    manager.unprepare_group("claim-1", result.state)
    assert node.gpu_state(uuid).mig_current is False


def test_mig_device_with_processes_is_destroyed_once_they_are_gone(node: SimNode) -> None:
    uuid = node.uuid()
    manager = node.manager()
    device = dynamic(node, "1g.10gb", 0)
    result = manager.prepare_group("claim-1", None, [node.alloc(device.name)])
    instance = result.mig_instances[device.name]
    add_context(node.root, instance.uuid, 777)  # a container's process that outlives its pod for a while
    _unprepare_fast(manager, "claim-1", result.state)
    assert manager.pending_cleanup() == {uuid: [f"MIG device {instance.uuid} to destroy"]}
    assert [i.uuid for i in node.hardware.list_mig_devices(uuid)] == [instance.uuid]  # not leaked: recorded
    # a new claim for the same placement is told why it waits
    with pytest.raises(SharingError, match="could not be destroyed yet"):
        manager.prepare_group("claim-2", None, [node.alloc(device.name)])
    assert manager.reconcile_mps([]).destroyed_mig == []  # still busy
    remove_context(node.root, instance.uuid, 777)
    assert manager.reconcile_mps([]).destroyed_mig == [instance.uuid]
    assert node.hardware.list_mig_devices(uuid) == []
    assert node.gpu_state(uuid).mig_current is False  # the MIG mode we switched on is off again
    assert manager.pending_cleanup() == {} and manager.registry.read()["createdMig"] == []


def test_gpu_renumbered_by_the_mig_mode_switch_is_found_by_uuid(node: SimNode) -> None:
    uuid = node.uuid()
    with node.store.transaction() as state:
        state.renumber_on_mig_switch = True
    manager = node.manager()
    device = dynamic(node, "1g.10gb", 0)
    result = manager.prepare_group("claim-1", None, [node.alloc(device.name)])
    instance = result.mig_instances[device.name]
    assert node.gpu_state(uuid).minor == 1  # /dev/nvidia0 became /dev/nvidia1 when MIG mode came on
    assert (instance.parent_uuid, instance.parent_minor) == (uuid, 1)
    assert [g.minor for g in node.hardware.discover().gpus] == [1]
    manager.unprepare_group("claim-1", result.state)
    assert node.hardware.list_mig_devices(uuid) == [] and node.gpu_state(uuid).mig_current is False
    assert manager.describe()["createdMig"] == [] and manager.describe()["migModeEnabled"] == []


def test_time_slice_step_on_a_lost_gpu_is_reset_when_it_returns(node: SimNode) -> None:
    """The GPU falls off the bus between `nvidia-smi -c DEFAULT` and `compute-policy --set-timeslice`: the
    simulated nvidia-smi now fails that step (exit 15), so the release records the reset as pending."""
    uuid = node.uuid()
    manager = node.manager()
    result = manager.prepare_group("claim-1", ts_config("Long"), [node.alloc("gpu-0")])
    assert node.gpu_state(uuid).timeslice == 3
    with node.store.transaction() as state:
        state.faults.append(Fault(0, SET_TIMESLICE_STEP, GPU_IS_LOST))
    _unprepare_fast(manager, "claim-1", result.state)
    assert manager.pending_cleanup() == {uuid: ["time-slice interval to reset to Default"]}
    assert node.gpu_state(uuid).timeslice == 3
    assert manager.reconcile_mps([]).reset_time_slices == []  # still lost
    with node.store.transaction() as state:
        state.faults.clear()
    assert manager.reconcile_mps([]).reset_time_slices == [uuid]
    assert node.gpu_state(uuid).timeslice == 0 and manager.pending_cleanup() == {}
