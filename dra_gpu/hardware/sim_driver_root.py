"""A simulated NVIDIA driver root on disk, kept in step with the simulator state.

Layout (what the plugin, CDI discovery and the sharing code look for under a real driver root):
- `usr/bin/nvidia-smi`, `usr/bin/nvidia-cuda-mps-control`: shell shims running `python -m
  dra_gpu.hardware.sim_tools.<tool>` with `DRA_GPU_SIM_ROOT` set to this root (the MPS one also with the
  default of `DRA_GPU_SIM_MPS_PID_FILE`).
- `usr/lib/x86_64-linux-gnu/`: placeholder driver libraries (`libnvidia-ml.so.<version>` + soname links
  `.so.1`, `libnvidia-nvvm.so.4`, ...).
  Those two directories are the `standard` driver layout (a host install, the GPU Operator's driver
  container); `driver_layout="rhel"` puts the libraries in `usr/lib64/`, `driver_layout="gke"` puts tools
  and libraries in `bin/` and `lib64/` directly under the root, as GKE/COS's `/home/kubernetes/bin/nvidia`.
- `dev/nvidia<minor>`, `dev/nvidiactl`, `dev/nvidia-uvm`, `dev/nvidia-uvm-tools`,
  `dev/nvidia-caps/nvidia-cap<N>`:
  character devices with /dev/null's numbers (1, 3), so a container given them opens something harmless;
  regular
  files when we are not root.
- `proc/driver/nvidia/capabilities/{mig/config,mig/monitor,gpu<minor>/mig/gi<G>/access,.../ci<C>/access}` and
  `proc/driver/nvidia-caps/mig-minors`, following the driver's capability minor numbering.
- `sys/bus/pci/devices/<bus id>` links into `sys/devices/<pcie root>/<bus id>`, where discovery reads the PCIe
  root.
- `var/lib/nvml-sim/state.json`: the simulator state; `var/lib/nvml-sim/mps/`: the MPS daemons' records.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

from dra_gpu.hardware import profiles
from dra_gpu.hardware.sim_tools.mps_control import PID_FILE_ENV
from dra_gpu.hardware.sim_tools.mps_records import daemon_alive, read_records
from dra_gpu.hardware.simulator.nvml import SimulatedNvml
from dra_gpu.hardware.simulator.state import SimState, StateStore

STATE_RELATIVE_PATH = "var/lib/nvml-sim/state.json"
# Driver layouts the simulator can lay out: name -> (tools directory, libraries directory) under the root.
DRIVER_LAYOUTS: dict[str, tuple[str, str]] = {
    "standard": ("usr/bin", "usr/lib/x86_64-linux-gnu"),
    "rhel": ("usr/bin", "usr/lib64"),
    "gke": ("bin", "lib64"),
}
DEFAULT_DRIVER_LAYOUT = "standard"
LIB_DIR = DRIVER_LAYOUTS[DEFAULT_DRIVER_LAYOUT][1]
TOOLS = {"nvidia-smi": "nvidia_smi", "nvidia-cuda-mps-control": "mps_control"}
# Library name and the soname suffix of the real driver's file (libnvidia-nvvm is at .so.4), so that our
# discovery (by soname) and nvidia-ctk's (by versioned file) find the same files here.
_LIBRARIES = (
    ("libnvidia-ml.so", "1"),
    ("libcuda.so", "1"),
    ("libnvidia-ptxjitcompiler.so", "1"),
    ("libnvidia-nvvm.so", "4"),
    ("libcudadebugger.so", "1"),
)
_NULL_MAJOR, _NULL_MINOR = 1, 3
CAP_ACCESS_MODE = 292  # 0444, as the driver reports it
# Capability minors: config=1, monitor=2, then per GPU 15 GPU instances x (access + 8 compute instances).
_GI_PER_GPU = 15
_CI_PER_GI = 8
_MINORS_PER_GI = 1 + _CI_PER_GI


def state_path(driver_root: str | os.PathLike[str]) -> Path:
    return Path(driver_root) / STATE_RELATIVE_PATH


def state_report(driver_root: str | os.PathLike[str]) -> dict[str, Any]:
    """What `dra-gpu hardware state` prints: the simulator state, with the static facts beside it (index,
    minor and product per GPU, each GPU instance's profile name, so tests can map indexes to minors and read
    profile names) and every simulated MPS control daemon's record under `mps`, keyed by its pipe directory's
    identity (mps_records.py), each with its MPS servers, their limits and clients."""
    state = StateStore(state_path(driver_root)).read()
    data = state.to_json()
    gpus = profiles.simulated_gpus(state.layout(), state.seed)
    data["devices"] = [
        {
            "index": g.index,
            "minor": g.minor,
            "uuid": g.uuid,
            "product_name": g.profile.product_name,
            "pci_bus_id": g.pci_bus_id,
        }
        for g in gpus
    ]
    for gpu, entry in zip(gpus, data["gpus"], strict=True):
        # the minor it is served under now (a MIG switch may renumber it); the layout's is in "devices"
        entry.update(index=gpu.index, minor=gpu.minor if entry.get("minor") is None else entry["minor"])
        names = {p.gi_profile_id: p.name for p in gpu.profile.mig_profiles}
        for gi in entry["gpu_instances"]:
            gi["profile"] = names.get(gi["profile_id"], str(gi["profile_id"]))
    records = read_records(driver_root)
    for key, record in records.items():
        # A SIGKILLed daemon could not mark its record stopped: running is what a `ps` would say (its lock)
        if record.get("running") and not daemon_alive(driver_root, key):
            record.update(running=False, killed=True)
    data["mps"] = records
    return data


def gi_cap_minor(gpu_minor: int, gi_id: int) -> int:
    return 3 + (gpu_minor * _GI_PER_GPU + gi_id) * _MINORS_PER_GI


def ci_cap_minor(gpu_minor: int, gi_id: int, ci_id: int) -> int:
    return gi_cap_minor(gpu_minor, gi_id) + 1 + ci_id


def _make_device_node(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        return
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(_NULL_MAJOR, _NULL_MINOR))
    except PermissionError:
        path.write_text("")  # not root: a regular file stands in


def _cap_text(minor: int) -> str:
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {CAP_ACCESS_MODE}\nDeviceFileModify: 1\n"


def _write_if_changed(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def existing_driver_layout(driver_root: str | os.PathLike[str]) -> str | None:
    """The layout a simulated driver root was made with (where its nvidia-smi shim and libnvidia-ml are)."""
    root = Path(driver_root)
    for name, (tools, libs) in DRIVER_LAYOUTS.items():
        if (root / tools / "nvidia-smi").is_file() and (root / libs / "libnvidia-ml.so.1").exists():
            return name
    return None


def _write_shim(root: Path, tools_dir: str, tool: str, module: str, env_defaults: dict[str, str]) -> None:
    shim = root / tools_dir / tool
    shim.parent.mkdir(parents=True, exist_ok=True)
    defaults = "".join(
        f'{name}="${{{name}:-{shlex.quote(value)}}}"\nexport {name}\n' for name, value in env_defaults.items()
    )
    text = (
        "#!/bin/sh\n"
        f"# simulated {tool}: runs dra_gpu.hardware.sim_tools.{module} against this driver root\n"
        f'DRA_GPU_SIM_ROOT="${{DRA_GPU_SIM_ROOT:-{shlex.quote(str(root))}}}"\n'
        "export DRA_GPU_SIM_ROOT\n"
        f"{defaults}"
        f'exec {shlex.quote(sys.executable)} -m dra_gpu.hardware.sim_tools.{module} "$@"\n'
    )
    _write_if_changed(shim, text)
    shim.chmod(0o755)


def _remove_driver_files(root: Path, layout_name: str) -> None:
    tools_dir, libs_dir = DRIVER_LAYOUTS[layout_name]
    for tool in TOOLS:
        (root / tools_dir / tool).unlink(missing_ok=True)
    for name, _soname in _LIBRARIES:
        for path in (root / libs_dir).glob(f"{name}.*"):
            path.unlink()


def _write_libraries(root: Path, libs_dir: str, driver_version: str) -> None:
    lib_dir = root / libs_dir
    lib_dir.mkdir(parents=True, exist_ok=True)
    for name, soname in _LIBRARIES:
        real = lib_dir / f"{name}.{driver_version}"
        _write_if_changed(real, f"placeholder for {name} {driver_version} (simulated driver root)\n")
        link = lib_dir / f"{name}.{soname}"
        if not link.is_symlink():
            link.unlink(missing_ok=True)
            link.symlink_to(real.name)


def _write_sysfs(root: Path, gpus: tuple[profiles.SimulatedGpu, ...]) -> None:
    for gpu in gpus:
        bus_id = gpu.sysfs_bus_id
        device_dir = root / "sys" / "devices" / gpu.slot.pcie_root / bus_id
        device_dir.mkdir(parents=True, exist_ok=True)
        _write_if_changed(
            device_dir / "numa_node", f"{-1 if gpu.slot.numa_node is None else gpu.slot.numa_node}\n"
        )
        link = root / "sys" / "bus" / "pci" / "devices" / bus_id
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(device_dir, link.parent))


def sync_mig_capabilities(driver_root: str | os.PathLike[str], state: SimState) -> None:
    """Make `proc/driver/nvidia/capabilities/gpu*/mig/gi*` and `dev/nvidia-caps/nvidia-cap*` match the MIG
    instances in `state`: one access file and one device node per GPU instance and per compute instance."""
    root = Path(driver_root)
    caps_dir = root / "proc" / "driver" / "nvidia" / "capabilities"
    dev_caps = root / "dev" / "nvidia-caps"
    gpus = profiles.simulated_gpus(state.layout(), state.seed)
    wanted_files: dict[Path, str] = {}
    wanted_nodes = {dev_caps / "nvidia-cap1", dev_caps / "nvidia-cap2"}
    # A MIG mode switch may have renumbered a GPU (state.py, renumber_minor): the driver then serves it, its
    # device node and its capability files under the new minor.
    minors = [g.minor if g.minor is not None else gpu.minor for gpu, g in zip(gpus, state.gpus, strict=True)]
    for gpu_minor, gstate in zip(minors, state.gpus, strict=True):
        if gpu_minor not in {g.minor for g in gpus}:
            _make_device_node(root / "dev" / f"nvidia{gpu_minor}")
            (caps_dir / f"gpu{gpu_minor}" / "mig").mkdir(parents=True, exist_ok=True)
        for gi in gstate.gpu_instances:
            gi_dir = caps_dir / f"gpu{gpu_minor}" / "mig" / f"gi{gi.gi_id}"
            minor = gi_cap_minor(gpu_minor, gi.gi_id)
            wanted_files[gi_dir / "access"] = _cap_text(minor)
            wanted_nodes.add(dev_caps / f"nvidia-cap{minor}")
            for ci in gi.compute_instances:
                minor = ci_cap_minor(gpu_minor, gi.gi_id, ci.ci_id)
                wanted_files[gi_dir / f"ci{ci.ci_id}" / "access"] = _cap_text(minor)
                wanted_nodes.add(dev_caps / f"nvidia-cap{minor}")
    for gpu_minor in sorted({g.minor for g in gpus} | set(minors)):  # drop instances that no longer exist
        mig_dir = caps_dir / f"gpu{gpu_minor}" / "mig"
        if mig_dir.is_dir():
            for gi_dir in mig_dir.iterdir():
                for access in [gi_dir / "access", *gi_dir.glob("ci*/access")]:
                    if access.is_file() and access not in wanted_files:
                        access.unlink()
                for ci_dir in gi_dir.glob("ci*"):
                    if ci_dir.is_dir() and not any(ci_dir.iterdir()):
                        ci_dir.rmdir()
                if not any(gi_dir.iterdir()):
                    gi_dir.rmdir()
    if dev_caps.is_dir():
        for node in dev_caps.iterdir():
            if node not in wanted_nodes:
                node.unlink()
    for path, text in wanted_files.items():
        _write_if_changed(path, text)
    for node in wanted_nodes:
        _make_device_node(node)


def _write_static_capabilities(root: Path, gpus: tuple[profiles.SimulatedGpu, ...]) -> None:
    caps = root / "proc" / "driver" / "nvidia" / "capabilities"
    _write_if_changed(caps / "mig" / "config", _cap_text(1))
    _write_if_changed(caps / "mig" / "monitor", _cap_text(2))
    lines = ["config 1", "monitor 2"]
    for gpu in gpus:
        (caps / f"gpu{gpu.minor}" / "mig").mkdir(parents=True, exist_ok=True)
        for gi_id in range(_GI_PER_GPU):
            lines.append(f"gpu{gpu.minor}/gi{gi_id}/access {gi_cap_minor(gpu.minor, gi_id)}")
            lines.extend(
                f"gpu{gpu.minor}/gi{gi_id}/ci{ci_id}/access {ci_cap_minor(gpu.minor, gi_id, ci_id)}"
                for ci_id in range(_CI_PER_GI)
            )
    _write_if_changed(root / "proc" / "driver" / "nvidia-caps" / "mig-minors", "\n".join(lines) + "\n")


def init_sim_driver_root(
    driver_root: str | os.PathLike[str],
    hardware: str,
    seed: str | None = None,
    *,
    force: bool = False,
    mps_pid_file: bool | None = None,
    driver_layout: str | None = None,
) -> SimState:
    """Create (or complete) a simulated driver root for `hardware`. Idempotent; keeps an existing state file
    for the same hardware unless `force`. `seed` (default: the existing state's seed, else the hardware name)
    makes the GPU UUIDs; use the node name so every simulated node has its own UUIDs. `mps_pid_file=False`
    models a driver whose MPS control daemon writes no pid file (default: DRA_GPU_SIM_MPS_PID_FILE, else
    yes, as driver 580 does). `driver_layout` (DRIVER_LAYOUTS; default: the one the root already has, else
    `standard`) says where the tools and libraries go."""
    root = Path(driver_root)
    profiles.resolve_layout(hardware)  # unknown names fail before anything is written
    if driver_layout is not None and driver_layout not in DRIVER_LAYOUTS:
        raise ValueError(
            f"unknown driver layout {driver_layout!r}; known: {', '.join(DRIVER_LAYOUTS)} (standard: "
            "usr/bin and usr/lib/x86_64-linux-gnu, rhel: usr/lib64, gke: bin and lib64 as on GKE/COS)"
        )
    have = existing_driver_layout(root)
    if driver_layout is not None and have is not None and have != driver_layout and not force:
        raise ValueError(
            f"simulated driver root {str(root)!r} has the {have!r} driver layout, not {driver_layout!r}: "
            "use another directory or --force"
        )
    if driver_layout is not None and have is not None and have != driver_layout:
        _remove_driver_files(root, have)  # --force into another layout: one layout per root
    tools_dir, libs_dir = DRIVER_LAYOUTS[driver_layout or have or DEFAULT_DRIVER_LAYOUT]
    store = StateStore(state_path(root))
    if force:
        shutil.rmtree(root / "proc" / "driver" / "nvidia" / "capabilities", ignore_errors=True)
        shutil.rmtree(root / "dev" / "nvidia-caps", ignore_errors=True)
    if store.exists() and not force:
        existing = store.read()
        if seed is None:
            seed = existing.seed
    state = store.initialize(hardware, seed or hardware, force=force)
    layout = state.layout()
    gpus = profiles.simulated_gpus(layout, state.seed)
    # The shims' default for the knob of the MPS pid file (mps_control.PID_FILE_ENV); the variable set when a
    # tool runs still wins, so a test can model a driver without the pid file for one daemon or for the root.
    if mps_pid_file is None:
        pid_file_default = os.environ.get(PID_FILE_ENV, "1")
    else:
        pid_file_default = "1" if mps_pid_file else "0"
    shim_env = {PID_FILE_ENV: pid_file_default}
    for tool, module in TOOLS.items():
        _write_shim(root, tools_dir, tool, module, shim_env if module == "mps_control" else {})
    _write_libraries(root, libs_dir, layout.driver_version)
    _write_sysfs(root, gpus)
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", *(f"nvidia{g.minor}" for g in gpus)):
        _make_device_node(root / "dev" / name)
    _write_static_capabilities(root, gpus)
    sync_mig_capabilities(root, state)
    return state


def open_simulated_nvml(driver_root: str | os.PathLike[str]) -> SimulatedNvml:
    """The simulator for an existing simulated driver root, keeping its capability files in step."""
    root = Path(driver_root)
    return SimulatedNvml(state_path(root), after_change=lambda state: sync_mig_capabilities(root, state))
