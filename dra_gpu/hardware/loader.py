"""`--hardware` + the driver root as this process sees it -> a `GpuHardware`.

The driver root passed in is `--container-driver-root` (`CONTAINER_DRIVER_ROOT`) when set, else
`--nvidia-driver-root`: errors about paths under it name both flags, as either may be the wrong one.

- `real`: pynvml with `libnvidia-ml.so.1` loaded from the driver root (not from the loader's search path, so
  the
  plugin uses the host driver it was pointed at).
- a node layout or GPU profile name (`dgx-h100`, `h100-80gb`, ...): the simulator, with its state in
  `<driver root>/var/lib/nvml-sim/state.json`; the simulated driver root is created on demand.
- `simulated`: the simulator, serving whatever layout the driver root already holds (made on the node
  beforehand with `dra-gpu hardware init-sim`). One DaemonSet thus serves test nodes with different simulated
  hardware, as one DaemonSet serves different real GPUs.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from dra_gpu.hardware import driver_layout, profiles
from dra_gpu.hardware.interface import HardwareError
from dra_gpu.hardware.nvml_hardware import NvmlHardware
from dra_gpu.hardware.sim_driver_root import init_sim_driver_root, open_simulated_nvml, state_path
from dra_gpu.hardware.simulator.state import StateError, StateStore

REAL = "real"
PREPARED_SIMULATOR = "simulated"
LIBRARY_NAME = "libnvidia-ml.so.1"


def known_hardware() -> list[str]:
    return [REAL, PREPARED_SIMULATOR, *profiles.known_hardware_names()]


DRIVER_ROOT_FLAGS_HINT = (
    "set --nvidia-driver-root to where the driver is installed on the host ('/' for a host install, "
    "'/run/nvidia/driver' for the GPU operator, '/home/kubernetes/bin/nvidia' on GKE/COS) and, when this "
    "process sees that directory at another path (a mount in its container, e.g. /driver-root), "
    "--container-driver-root (env CONTAINER_DRIVER_ROOT) to that path"
)


def find_nvml_library(driver_root: str) -> Path:
    root = Path(driver_root)
    if not root.is_dir() or not os.access(root, os.R_OK | os.X_OK):
        raise HardwareError(
            f"NVIDIA driver root {driver_root!r} is not a readable directory: {DRIVER_ROOT_FLAGS_HINT}"
        )
    found = driver_layout.find_library(root, LIBRARY_NAME)
    if found is not None:
        return root / found.lstrip("/")
    candidates = [root / d / LIBRARY_NAME for d in driver_layout.LIBRARY_DIRS]
    raise HardwareError(
        f"{LIBRARY_NAME} not found under NVIDIA driver root {driver_root!r} (looked in "
        f"{', '.join(str(c) for c in candidates)}): is the NVIDIA driver installed there? "
        f"{DRIVER_ROOT_FLAGS_HINT}"
    )


def load_real_nvml(driver_root: str) -> object:
    """Import pynvml and bind it to the driver root's libnvidia-ml.so.1 before its first nvmlInit."""
    import pynvml

    path = find_nvml_library(driver_root)
    with pynvml.libLoadLock:
        if pynvml.nvmlLib is None:
            try:
                pynvml.nvmlLib = ctypes.CDLL(str(path))
            except OSError as err:
                raise HardwareError(
                    f"cannot load {path}: {err} (a simulated driver root has placeholder libraries: "
                    f"use --hardware <profile> with it, one of {', '.join(profiles.known_hardware_names())})"
                ) from err
    return pynvml


def prepared_simulated_hardware(driver_root: str) -> str:
    """The layout a simulated driver root was made with (`--hardware simulated`)."""
    path = state_path(driver_root)
    if not path.is_file():
        raise HardwareError(
            f"--hardware {PREPARED_SIMULATOR} serves the simulated GPUs already under the driver root, and "
            f"{driver_root!r} has none ({path} is missing): make them on the node with `dra-gpu hardware "
            f"init-sim --hardware <profile> --driver-root <host path>`, or name a profile in --hardware "
            f"(chart value `hardware`), one of {', '.join(profiles.known_hardware_names())}"
        )
    try:
        existing = StateStore(path).read()
    except (StateError, OSError) as err:
        raise HardwareError(f"simulated driver root {driver_root!r}: {err}") from err
    return existing.hardware


def open_hardware(hardware: str, driver_root: str, *, seed: str | None = None) -> NvmlHardware:
    """The hardware named by `--hardware`. `seed` (simulator only; default the node name from `NODE_NAME`,
    else the
    existing state's seed) makes the simulated GPU UUIDs."""
    if hardware == REAL:
        return NvmlHardware(load_real_nvml(driver_root), driver_root)
    if hardware == PREPARED_SIMULATOR:
        hardware = prepared_simulated_hardware(driver_root)
    try:
        profiles.resolve_layout(hardware)
    except profiles.UnknownHardwareError as err:
        raise HardwareError(str(err)) from None
    if seed is None and not state_path(driver_root).exists():
        seed = os.environ.get("NODE_NAME") or None
    try:
        init_sim_driver_root(driver_root, hardware, seed)
    except (StateError, OSError) as err:
        raise HardwareError(
            f"simulated driver root {driver_root!r}: {err} (the root named by --container-driver-root, env "
            "CONTAINER_DRIVER_ROOT, else by --nvidia-driver-root)"
        ) from err
    return NvmlHardware(
        open_simulated_nvml(driver_root), driver_root, sysfs_root=os.path.join(driver_root, "sys")
    )
