"""Unprepare on a GPU that fell off the bus: it finishes (the pod can terminate), what it could not undo is
recorded as pending cleanup, and the reconcile loop finishes it once the GPU is back."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from sim_node import SimNode
from test_mig_lifecycle import dynamic
from test_mps import mps_config
from test_time_slicing import ts_config

from dra_gpu.hardware.types import ComputeMode
from dra_gpu.sharing.manager import HardwareSharingManager


def _unprepare_fast(manager: HardwareSharingManager, claim_uid: str, state: Mapping[str, Any]) -> None:
    started = time.monotonic()
    manager.unprepare_group(claim_uid, state)  # no SharingError: the kubelet can finish the pod
    assert time.monotonic() - started < 10


def test_time_slice_of_a_vanished_gpu_is_reset_when_it_returns(node: SimNode) -> None:
    uuid = node.uuid()
    manager = node.manager()
    result = manager.prepare_group("claim-1", ts_config("Long"), [node.alloc("gpu-0")])
    nvml = node.hardware.nvml_module()
    nvml.lose_gpu(0)
    _unprepare_fast(manager, "claim-1", result.state)
    assert manager.pending_cleanup() == {uuid: ["time-slice interval to reset to Default"]}
    assert manager.registry.read()["timeSlice"] == {}  # the claim no longer holds it
    assert manager.reconcile_mps([]).reset_time_slices == []  # still gone
    nvml.recover_gpu(0)
    node.hardware.set_time_slice(uuid, 3)  # a reset that left the interval as it was, to see ours act
    assert manager.reconcile_mps([]).reset_time_slices == [uuid]
    assert node.gpu_state(uuid).timeslice == 0
    assert manager.pending_cleanup() == {}


def test_a_new_claims_interval_on_the_returned_gpu_is_not_reset(node: SimNode) -> None:
    uuid = node.uuid()
    manager = node.manager()
    first = manager.prepare_group("claim-1", ts_config("Long"), [node.alloc("gpu-0")])
    nvml = node.hardware.nvml_module()
    nvml.lose_gpu(0)
    _unprepare_fast(manager, "claim-1", first.state)
    nvml.recover_gpu(0)
    second = manager.prepare_group("claim-2", ts_config("Short"), [node.alloc("gpu-0")])
    assert manager.pending_cleanup() == {}  # the new setting replaces the owed reset
    manager.reconcile_mps([second.state])
    assert node.gpu_state(uuid).timeslice == 1
    manager.unprepare_group("claim-2", second.state)
    assert node.gpu_state(uuid).timeslice == 0


def test_the_default_mode_of_a_returned_gpu_comes_back_only_from_the_pending_restore(node: SimNode) -> None:
    """The e2e case (e2e/test_mps_daemons.py): a GPU in Default gets an MPS claim (EXCLUSIVE_PROCESS), falls
    off the bus, the claim is unprepared. The GPU comes back still in EXCLUSIVE_PROCESS (a bus drop resets
    no setting); Default returns only through the driver's pending restore in the reconcile pass."""
    uuid = node.uuid()
    manager = node.manager()
    result = manager.prepare_group("claim-1", mps_config(), [node.alloc("gpu-0")])
    nvml = node.hardware.nvml_module()
    nvml.lose_gpu(0)
    _unprepare_fast(manager, "claim-1", result.state)
    assert manager.pending_cleanup() == {uuid: ["compute mode DEFAULT to restore"]}
    nvml.recover_gpu(0)
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.EXCLUSIVE_PROCESS)
    assert manager.reconcile_mps([]).restored_modes == [uuid]
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.DEFAULT)
    assert manager.pending_cleanup() == {}
    assert node.leftovers() == []


def test_a_new_mps_claim_on_the_returned_gpu_keeps_its_mode_and_restores_the_first_one(node: SimNode) -> None:
    """Claim 1 (MPS) is unprepared while its GPU is gone: PROHIBITED (the mode before it) is owed. Claim 2
    (MPS) gets the GPU once it is back, before the reconcile pass: the pass must not take EXCLUSIVE_PROCESS
    from claim 2, and claim 2's unprepare puts back PROHIBITED, the mode from before either claim."""
    uuid = node.uuid()
    node.hardware.set_compute_mode(uuid, ComputeMode.PROHIBITED)
    manager = node.manager()
    first = manager.prepare_group("claim-1", mps_config(), [node.alloc("gpu-0")])
    nvml = node.hardware.nvml_module()
    nvml.lose_gpu(0)
    _unprepare_fast(manager, "claim-1", first.state)
    assert manager.pending_cleanup() == {uuid: ["compute mode PROHIBITED to restore"]}
    nvml.recover_gpu(0)
    second = manager.prepare_group("claim-2", mps_config(), [node.alloc("gpu-0")])
    assert manager.pending_cleanup() == {}  # claim 2's daemon owes the mode now
    assert manager.reconcile_mps([second.state]).restored_modes == []
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.EXCLUSIVE_PROCESS)
    manager.unprepare_group("claim-2", second.state)
    assert node.gpu_state(uuid).compute_mode == int(ComputeMode.PROHIBITED)
    assert node.leftovers() == []


def test_mig_device_of_a_vanished_gpu_is_destroyed_when_it_returns(node: SimNode) -> None:
    uuid = node.uuid()
    manager = node.manager()
    device = dynamic(node, "1g.10gb", 0)
    result = manager.prepare_group("claim-1", None, [node.alloc(device.name)])
    instance = result.mig_instances[device.name]
    nvml = node.hardware.nvml_module()
    nvml.lose_gpu(0)
    _unprepare_fast(manager, "claim-1", result.state)
    assert manager.pending_cleanup() == {uuid: [f"MIG device {instance.uuid} to destroy"]}
    assert manager.reconcile_mps([]).destroyed_mig == []  # still gone
    # the kubelet replays the unprepare: recorded once
    _unprepare_fast(manager, "claim-1", result.state)
    assert len(manager.registry.read()["pendingMigDestroy"]) == 1
    # back without a reset (a transient fault): its MIG device is still there
    with nvml.store.transaction() as state:
        state.faults.clear()
    assert [i.uuid for i in node.hardware.list_mig_devices(uuid)] == [instance.uuid]
    assert manager.reconcile_mps([]).destroyed_mig == [instance.uuid]
    assert node.hardware.list_mig_devices(uuid) == []
    assert node.state().gpus[0].mig_current is False  # MIG mode we switched on is switched off again
    assert manager.pending_cleanup() == {}
    assert manager.registry.read()["createdMig"] == []
    assert node.leftovers() == []


def test_a_deferred_mig_device_never_takes_a_newer_device_with_its_ids(node: SimNode) -> None:
    uuid = node.uuid()
    manager = node.manager()
    device = dynamic(node, "1g.10gb", 0)
    first = manager.prepare_group("claim-1", None, [node.alloc(device.name)])
    old = first.mig_instances[device.name]
    nvml = node.hardware.nvml_module()
    nvml.lose_gpu(0)
    _unprepare_fast(manager, "claim-1", first.state)
    nvml.recover_gpu(0)  # a reset: our MIG device is gone with it
    node.hardware.set_mig_mode(uuid, True)
    second = manager.prepare_group("claim-2", None, [node.alloc(device.name)])
    new = second.mig_instances[device.name]
    assert (new.gi_id, new.ci_id) == (old.gi_id, old.ci_id) and new.uuid != old.uuid
    assert manager.reconcile_mps([second.state]).destroyed_mig == [old.uuid]  # gone already: forgotten
    assert [i.uuid for i in node.hardware.list_mig_devices(uuid)] == [new.uuid]  # claim-2's device untouched
    manager.unprepare_group("claim-2", second.state)
    assert node.hardware.list_mig_devices(uuid) == []
