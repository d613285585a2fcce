"""The sharing manager's GPU facts follow the plugin's re-discoveries (`refresh`), so prepares that do not
re-read the hardware themselves (everything but on-demand MIG) act on what is there now."""

from __future__ import annotations

import time
from collections.abc import Callable

import pynvml
import pytest
from sim_node import SimNode

from dra_gpu.config.api import decode_opaque_config
from dra_gpu.hardware.simulator.state import Fault
from dra_gpu.sharing.interface import SharingError

MPS = decode_opaque_config(
    {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
)


def test_a_gpu_gone_since_the_last_prepare_is_refused_after_a_refresh(
    make_node: Callable[[str], SimNode],
) -> None:
    node = make_node("dgx-h100")
    manager = node.manager()
    gpu2 = node.alloc("gpu-2")
    first = manager.prepare_group("c1", None, [gpu2])  # reads and caches the GPU facts
    manager.unprepare_group("c1", first.state)

    with node.store.transaction() as state:  # GPU 2 falls off the bus
        state.faults.append(Fault(2, "nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST))
    started_at = time.monotonic()
    discovery = node.hardware.discover()
    assert node.uuid(2) not in {g.uuid for g in discovery.gpus}
    manager.refresh(discovery, started_at)

    with pytest.raises(SharingError, match=rf"GPU {node.uuid(2)} is not present on this node"):
        manager.prepare_group("c2", MPS, [gpu2])
    assert node.leftovers() == []

    with node.store.transaction() as state:  # back again: the next re-discovery says so
        state.faults.clear()
    manager.refresh(node.hardware.discover(), time.monotonic())
    again = manager.prepare_group("c3", None, [gpu2])
    manager.unprepare_group("c3", again.state)
