"""The MPS reconcile loop's report -> device taints, health status and metrics (real sharing manager on the
hardware simulator): a daemon that cannot be restarted taints its GPU, a GPU with cleanup pending too, and the
taints go when the problem does."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from dra_gpu.config.api import decode_opaque_config
from dra_gpu.hardware.loader import open_hardware
from dra_gpu.inventory.device_health import health_status
from dra_gpu.inventory.device_model import build_device_model
from dra_gpu.inventory.sharing_health import CLEANUP_PENDING, MPS_DAEMON_FAILED, SHARING_TAINT_KEY
from dra_gpu.plugin.mps_reconciler import MpsReconciler
from dra_gpu.sharing.interface import AllocatedDevice
from dra_gpu.sharing.manager import HardwareSharingManager


@pytest.fixture
def sim() -> Iterator[tuple[Any, Path]]:
    root = Path(tempfile.mkdtemp(prefix="sim.", dir="/tmp"))
    plugin_dir = Path(tempfile.mkdtemp(prefix="plg.", dir="/tmp"))
    hardware = open_hardware("h100-80gb", str(root))
    yield hardware, plugin_dir
    hardware.close()
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(plugin_dir, ignore_errors=True)


def test_problems_become_taints_health_and_metrics_and_go_away(sim: tuple[Any, Path]) -> None:
    hardware, plugin_dir = sim
    model = build_device_model(hardware.discover())
    gpu = next(d for d in model.devices if d.name == "gpu-0")
    manager = HardwareSharingManager(hardware, plugin_dir, mps_ready_timeout_s=0.5, mount_shm=False)
    config = decode_opaque_config(
        {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    )
    result = manager.prepare_group("claim-1", config, [AllocatedDevice("req", "node", gpu)])
    states = [result.state]
    registry = CollectorRegistry()
    changes: list[int] = []
    reconciler = MpsReconciler(manager, lambda: states, registry, on_change=lambda: changes.append(1))
    assert reconciler.step() is False and reconciler.with_taints(model) is model  # healthy: same object

    # the daemon dies and the control binary is broken: it cannot be restarted
    binary = Path(hardware.driver_root()) / "usr" / "bin" / "nvidia-cuda-mps-control"
    original = binary.read_text()
    os.kill(result.state["mpsDaemon"]["pid"], signal.SIGKILL)
    time.sleep(0.05)
    binary.write_text('#!/bin/sh\necho "driver/library version mismatch" >&2\nexit 1\n')
    assert reconciler.step() is True and changes == [1]
    tainted = reconciler.with_taints(model)
    assert reconciler.with_taints(model) is tainted  # cached while nothing changes
    on_gpu = [d for d in tainted.devices if d.parent_uuid == gpu.parent_uuid]
    assert on_gpu and all(
        any(t.key == SHARING_TAINT_KEY and t.value == MPS_DAEMON_FAILED for t in d.taints) for d in on_gpu
    )
    assert not health_status(next(d for d in tainted.devices if d.name == "gpu-0")).healthy
    labels = {"gpu": gpu.parent_uuid}
    assert registry.get_sample_value("dra_gpu_mps_daemons_failed", labels) == 1
    assert reconciler.step() is False  # the same problem: no new change

    binary.write_text(original)
    assert reconciler.step() is True  # restarted now
    assert reconciler.with_taints(model) is model
    assert registry.get_sample_value("dra_gpu_mps_daemons_failed", labels) == 0
    assert registry.get_sample_value("dra_gpu_mps_daemon_restarts_total") == 1

    # unprepare while the GPU is gone: cleanup pending -> tainted until the GPU is back
    nvml = hardware.nvml_module()
    nvml.lose_gpu(0)
    manager.unprepare_group("claim-1", result.state)
    states.clear()
    assert reconciler.step() is True
    assert any(t.value == CLEANUP_PENDING for t in reconciler.with_taints(model).by_name()["gpu-0"].taints)
    assert registry.get_sample_value("dra_gpu_sharing_cleanup_pending", labels) == 1
    nvml.recover_gpu(0)
    assert reconciler.step() is True
    assert reconciler.with_taints(model) is model
    assert registry.get_sample_value("dra_gpu_sharing_cleanup_pending", labels) == 0
    assert not (plugin_dir / "mps").exists() or list((plugin_dir / "mps").iterdir()) == []
