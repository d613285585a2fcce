"""What the simulated CUDA client can open from its container's device nodes (device_nodes.py): a GPU from
its own node; on a GPU in MIG mode, a MIG device only with the capabilities of its GPU instance and its
compute instance, the GPU itself not at all (NVML still reaches it: `whole_gpus`)."""

from __future__ import annotations

from pathlib import Path

from dra_gpu.hardware.sim_driver_root import ci_cap_minor, gi_cap_minor, init_sim_driver_root, state_path
from dra_gpu.hardware.sim_tools.device_nodes import visible_devices
from dra_gpu.hardware.simulator.state import ComputeInstanceState, GpuInstanceState, StateStore


def test_a_gpu_is_reached_through_its_own_node_only(tmp_path: Path) -> None:
    init_sim_driver_root(tmp_path, "dgx-h100", seed="nodes")
    state = StateStore(state_path(tmp_path)).read()
    assert visible_devices(state, {"/dev/nvidia3"}) == [state.gpus[3].uuid]
    assert visible_devices(state, {"/dev/nvidiactl", "/dev/nvidia-uvm"}) == []


def test_a_mig_device_needs_the_capabilities_of_its_instances(tmp_path: Path) -> None:
    init_sim_driver_root(tmp_path, "dgx-h100", seed="nodes")
    store = StateStore(state_path(tmp_path))
    with store.transaction() as state:
        gpu = state.gpus[1]
        gpu.mig_current = gpu.mig_pending = True
        gpu.gpu_instances = [
            GpuInstanceState(2, 19, 6, 1, [ComputeInstanceState(0, 0, 1, "MIG-aaaa")]),
            GpuInstanceState(3, 19, 5, 1, [ComputeInstanceState(0, 0, 1, "MIG-bbbb")]),
        ]
    state = store.read()
    gi, ci = (
        f"/dev/nvidia-caps/nvidia-cap{gi_cap_minor(1, 3)}",
        f"/dev/nvidia-caps/nvidia-cap{ci_cap_minor(1, 3, 0)}",
    )
    assert visible_devices(state, {"/dev/nvidia1", gi, ci}) == ["MIG-bbbb"]
    assert visible_devices(state, {"/dev/nvidia1", gi}) == []  # its compute instance's capability is missing
    assert visible_devices(state, {"/dev/nvidia1"}) == []  # a GPU in MIG mode runs nothing by itself
    assert visible_devices(state, {"/dev/nvidia1"}, whole_gpus=True) == [state.gpus[1].uuid]
