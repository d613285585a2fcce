"""A simulated node for the sharing tests: driver root, hardware, device model, plugin dir, leftovers."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_gpu.hardware.loader import open_hardware
from dra_gpu.hardware.nvml_hardware import NvmlHardware
from dra_gpu.hardware.sim_driver_root import state_path
from dra_gpu.hardware.simulator.state import GpuState, SimState, StateStore
from dra_gpu.inventory.device_model import build_device_model
from dra_gpu.inventory.model import Device, DeviceModel
from dra_gpu.sharing.interface import AllocatedDevice
from dra_gpu.sharing.manager import HardwareSharingManager
from tests.support.mps_view import mps_records as read_records


@dataclass
class SimNode:
    hardware_name: str
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sim.", dir="/tmp")))
    plugin_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="plg.", dir="/tmp")))

    def __post_init__(self) -> None:
        os.chmod(self.root, 0o755)  # a tenant's non-root process reaches the simulated driver (mkdtemp: 0700)
        self.hardware: NvmlHardware = open_hardware(self.hardware_name, str(self.root))
        self.store = StateStore(state_path(self.root))
        self._model: DeviceModel | None = None

    # ---- views ----
    def state(self) -> SimState:
        return self.store.read()

    def gpu_state(self, uuid: str) -> GpuState:
        return next(g for g in self.state().gpus if g.uuid == uuid)

    def model(self, refresh: bool = False) -> DeviceModel:
        if self._model is None or refresh:
            self._model = build_device_model(self.hardware.discover())
        return self._model

    def device(self, name: str) -> Device:
        return self.model().by_name()[name]

    def alloc(self, name: str, request: str = "req", **kw: Any) -> AllocatedDevice:
        return AllocatedDevice(request=request, pool="node-a", device=self.device(name), **kw)

    def uuid(self, minor: int = 0) -> str:
        return self.device(f"gpu-{minor}").parent_uuid

    def manager(self, **kw: Any) -> HardwareSharingManager:
        kw.setdefault("mps_ready_timeout_s", 20.0)
        return HardwareSharingManager(self.hardware, self.plugin_dir, **kw)

    def mps_records(self) -> dict[str, dict[str, Any]]:
        return read_records(self.root)

    def running_daemons(self) -> list[dict[str, Any]]:
        return [r for r in self.mps_records().values() if r.get("running") and pid_alive(r.get("pid"))]

    def mounts_under_plugin_dir(self) -> list[str]:
        prefix = os.path.realpath(self.plugin_dir) + "/"
        with open("/proc/self/mountinfo", encoding="utf-8") as info:
            return [f.split()[4] for f in info if f.split()[4].startswith(prefix)]

    def leftovers(self) -> list[str]:
        """Processes, mounts and MPS directories still there (what every test must leave empty)."""
        found = [f"MPS daemon pid {r['pid']} ({r['pipe_dir']})" for r in self.running_daemons()]
        found += [f"mount {m}" for m in self.mounts_under_plugin_dir()]
        mps_dir = self.plugin_dir / "mps"
        if mps_dir.is_dir():
            found += [f"directory {p}" for p in mps_dir.iterdir()]
        return found

    def cleanup(self) -> list[str]:
        """Remove everything (safety net after a test); returns what had to be removed."""
        found = self.leftovers()
        for r in self.running_daemons():
            os.kill(r["pid"], signal.SIGKILL)
        for mount in self.mounts_under_plugin_dir():
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        self.hardware.close()
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.plugin_dir, ignore_errors=True)
        return found


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
