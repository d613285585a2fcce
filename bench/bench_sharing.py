"""Prepare/unprepare latency of each sharing strategy on the simulator (one H100, fresh driver root).

Strategies: none (plain GPU), time-slicing (two `nvidia-smi` runs each way), MPS (a daemon process started,
proven ready, limits set, stopped), MIG create (GPU + compute instance, MIG mode on/off), a fractional share
(joining / leaving the per-GPU MPS daemon). Figures are medians and p90 in milliseconds over `ROUNDS` cycles.
"""

from __future__ import annotations

import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from dra_gpu.config.api import decode_opaque_config
from dra_gpu.hardware.loader import open_hardware
from dra_gpu.inventory.device_model import build_device_model
from dra_gpu.inventory.model import DeviceKind
from dra_gpu.sharing.interface import AllocatedDevice
from dra_gpu.sharing.manager import HardwareSharingManager

ROUNDS = 10
V1B1 = "resource.nvidia.com/v1beta1"


def _ms(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return round(statistics.median(ordered) * 1000, 2), round(p90 * 1000, 2)


def run() -> dict[str, Any]:
    # Per-claim info logs would drown the figures; warnings still show.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    root = Path(tempfile.mkdtemp(prefix="bsim.", dir="/tmp"))
    plugin_dir = Path(tempfile.mkdtemp(prefix="bplg.", dir="/tmp"))
    try:
        hardware = open_hardware("h100-80gb", str(root))
        model = build_device_model(hardware.discover())
        by_name = model.by_name()
        mig = next(d for d in model.devices if d.kind is DeviceKind.MIG_DYNAMIC)
        manager = HardwareSharingManager(hardware, plugin_dir)

        def alloc(name: str, **kw: Any) -> list[AllocatedDevice]:
            return [AllocatedDevice(request="req", pool="bench", device=by_name[name], **kw)]

        cases: dict[str, tuple[object | None, Callable[[], list[AllocatedDevice]]]] = {
            "none": (None, lambda: alloc("gpu-0")),
            "time_slicing": (
                decode_opaque_config(
                    {
                        "apiVersion": V1B1,
                        "kind": "GpuConfig",
                        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
                    }
                ),
                lambda: alloc("gpu-0"),
            ),
            "mps": (
                decode_opaque_config(
                    {
                        "apiVersion": V1B1,
                        "kind": "GpuConfig",
                        "sharing": {
                            "strategy": "MPS",
                            "mpsConfig": {
                                "defaultActiveThreadPercentage": 50,
                                "defaultPinnedDeviceMemoryLimit": "10Gi",
                            },
                        },
                    }
                ),
                lambda: alloc("gpu-0"),
            ),
            "mig_create": (None, lambda: alloc(mig.name)),
            "share": (
                None,
                lambda: alloc(
                    "gpu-0-shared", share_id="s", consumed_capacity={"compute": "20", "memory": "8Gi"}
                ),
            ),
        }
        figures: dict[str, Any] = {"rounds": ROUNDS, "hardware": "h100-80gb (simulated)"}
        for name, (config, devices) in cases.items():
            prepare: list[float] = []
            unprepare: list[float] = []
            for i in range(ROUNDS):
                claim = f"bench-{name}-{i}"
                started = time.perf_counter()
                result = manager.prepare_group(claim, config, devices())
                prepare.append(time.perf_counter() - started)
                started = time.perf_counter()
                manager.unprepare_group(claim, result.state)
                unprepare.append(time.perf_counter() - started)
            figures[f"{name}.prepare_ms_median"], figures[f"{name}.prepare_ms_p90"] = _ms(prepare)
            figures[f"{name}.unprepare_ms_median"], figures[f"{name}.unprepare_ms_p90"] = _ms(unprepare)
        hardware.close()
        return figures
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(plugin_dir, ignore_errors=True)


if __name__ == "__main__":
    for key, value in run().items():
        print(f"{key:40s} {value}")
