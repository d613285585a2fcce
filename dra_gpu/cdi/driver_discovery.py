"""Find what a GPU container needs from the driver installation (files under the driver root).

Two sources, in this order:
1. `nvidia-ctk cdi generate` when the NVIDIA Container Toolkit is on PATH (the image has it) and its hook
   binary is on the node: its common `containerEdits` (libraries, hooks, control nodes) are taken as they are;
   our own per-GPU device nodes replace its per-device entries.
2. Otherwise our own discovery: control nodes, the driver's user-space libraries and tools that exist under
   the driver root, as read-only bind mounts at the path they would have on a host with the driver at `/`,
   plus NVIDIA's hooks (nvidia_hooks.py) when nvidia-cdi-hook is on the node.

Also reads the MIG capability minors from `<driver root>/proc/driver/nvidia/capabilities/...`.

Two roots: files are looked for under the driver root as THIS process sees it (`container_root`; NVIDIA's
chart mounts the host's driver root at `/driver-root`), while the specs name host paths (`host_root`,
`--nvidia-driver-root`), since the container runtime reads them on the host. Without a container root both are
the same.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import structlog

from dra_gpu.cdi.nvidia_hooks import driver_hooks, driver_version_from_library
from dra_gpu.cdi.spec_builder import READ_ONLY_BIND, CdiHook, DriverEdits, device_node
from dra_gpu.hardware import driver_layout
from dra_gpu.sharing.interface import CdiDeviceNode, CdiMount

log = structlog.get_logger(__name__)

CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
# NVIDIA's search directories (driver_layout), but not the root itself: a library found there would have no
# place in a container's file system. `lib64/` and `bin/` are where GKE/COS keep the driver.
LIBRARY_DIRS = tuple(f"/{d}" for d in driver_layout.LIBRARY_DIRS if d)
# User-space driver libraries a CUDA / NVML / video workload loads (the soname the loader asks for).
DRIVER_LIBRARIES = (
    "libnvidia-ml.so.1",
    "libcuda.so.1",
    "libcudadebugger.so.1",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm.so.4",
    "libnvidia-gpucomp.so",
    "libnvidia-allocator.so.1",
    "libnvidia-cfg.so.1",
    "libnvidia-opencl.so.1",
    "libnvidia-encode.so.1",
    "libnvcuvid.so.1",
    "libnvidia-opticalflow.so.1",
)
BINARY_DIRS = tuple(f"/{d}" for d in driver_layout.BINARY_DIRS if d)
DRIVER_BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
NVIDIA_CTK_TIMEOUT_S = 60.0


class MigCapabilityError(Exception):
    """The capability file of a MIG instance is missing or unreadable (message names it)."""


def _exists(driver_root: Path, path: str) -> bool:
    return (driver_root / path.lstrip("/")).exists()


def to_host_path(path: str, container_root: str, host_root: str) -> str:
    """`path` as this process sees it -> the same file's path on the host. Paths outside the container's view
    of the driver root (e.g. the plugin's own tools) are returned unchanged."""
    inside = container_root.rstrip("/")
    if inside == host_root.rstrip("/"):
        return path
    if inside and path != inside and not path.startswith(inside + "/"):
        return path
    rest = path[len(inside) :].lstrip("/")
    return str(Path(host_root) / rest) if rest else str(Path(host_root))


def _real_file(root: Path, path: str) -> str:
    """The file a library path under the driver root resolves to, as a path inside the root (links followed
    inside the root: driver_layout.resolve_in_root). A host whose driver lives in /usr/local/nvidia/lib64 with
    links in /usr/lib has it resolved there, as `nvidia-ctk cdi generate` does (seen on an H100 host)."""
    return driver_layout.resolve_in_root(root, path)


def discover_from_driver_root(
    driver_root: str, host_driver_root: str | None = None, *, hook_path: str | None = None
) -> DriverEdits:
    """Our own discovery: files under `driver_root` (as seen here), named by their host path. With
    `hook_path` (nvidia-cdi-hook on the node) libraries are mounted as the files their links resolve to
    (versioned names, in the driver's own directory) and NVIDIA's hooks are added (nvidia_hooks.py), as
    `nvidia-ctk cdi generate` does."""
    host = host_driver_root or driver_root
    root = Path(driver_root)
    # device nodes: under the driver root when it has dev/, else the node's /dev (NVIDIA's devRoot; GKE)
    devs = Path(driver_layout.dev_root(driver_root))
    host_devs = driver_layout.host_dev_root(driver_root, host)
    nodes = tuple(device_node(host_devs, p) for p in CONTROL_NODES if _exists(devs, p))
    mounts: list[CdiMount] = []
    libraries: list[str] = []
    for names, dirs in ((DRIVER_LIBRARIES, LIBRARY_DIRS), (DRIVER_BINARIES, BINARY_DIRS)):
        for name in names:
            for directory in dirs:
                path = f"{directory}/{name}"
                real = _real_file(root, path)  # links are followed inside the root, never on this machine
                if _exists(root, real):
                    if hook_path and names is DRIVER_LIBRARIES:
                        path = real  # NVIDIA's layout: update-ldcache makes the soname links
                        libraries.append(path)
                    host_path = str(Path(host) / real.lstrip("/"))
                    mounts.append(CdiMount(host_path=host_path, container_path=path, options=READ_ONLY_BIND))
                    break
    missing = [p for p in ("/dev/nvidiactl",) if not _exists(devs, p)]
    if driver_layout.find_binary(root, "nvidia-smi") is None:
        missing.append("nvidia-smi (in " + ", ".join(BINARY_DIRS) + ")")
    if missing:
        log.warning("driver root lacks expected files", driver_root=driver_root, missing=missing)
    if not hook_path:
        return DriverEdits(device_nodes=nodes, mounts=tuple(mounts), source="driver-root")
    version = next(
        (v for v in (driver_version_from_library(Path(p).name) for p in libraries) if v is not None), None
    )
    hooks, env = driver_hooks(hook_path, libraries, version)
    return DriverEdits(device_nodes=nodes, mounts=tuple(mounts), hooks=hooks, env=env, source="driver-root")


def _edits_from_ctk_spec(spec: dict[str, object], container_root: str, host_root: str) -> DriverEdits:
    """nvidia-ctk ran inside this process's view, so its host paths are under `container_root`: map them."""
    edits = spec.get("containerEdits")
    if not isinstance(edits, dict):
        raise ValueError("nvidia-ctk spec has no containerEdits")

    def host(path: str) -> str:
        return to_host_path(path, container_root, host_root)

    nodes = tuple(
        CdiDeviceNode(
            path=str(n["path"]),
            host_path=None if n.get("hostPath") is None else host(str(n["hostPath"])),
        )
        for n in edits.get("deviceNodes") or ()
    )
    mounts = tuple(
        CdiMount(
            host_path=host(str(m["hostPath"])),
            container_path=str(m["containerPath"]),
            options=tuple(m.get("options") or READ_ONLY_BIND),
        )
        for m in edits.get("mounts") or ()
    )
    hooks = tuple(
        CdiHook(
            hook_name=str(h["hookName"]),
            path=host(str(h["path"])),
            args=tuple(h.get("args") or ()),
            env=tuple(h.get("env") or ()),
        )
        for h in edits.get("hooks") or ()
    )
    env = tuple(e for e in edits.get("env") or () if not str(e).startswith("NVIDIA_VISIBLE_DEVICES="))
    return DriverEdits(device_nodes=nodes, mounts=mounts, hooks=hooks, env=env, source="nvidia-ctk")


def _run_ctk(nvidia_ctk: str, driver_root: str, out: Path, extra: list[str]) -> dict[str, Any]:
    argv = [nvidia_ctk, "cdi", "generate", f"--driver-root={driver_root}", "--format=json", f"--output={out}"]
    subprocess.run([*argv, *extra], check=True, capture_output=True, timeout=NVIDIA_CTK_TIMEOUT_S)
    spec: dict[str, Any] = json.loads(out.read_text())
    return spec


def discover_with_nvidia_ctk(
    nvidia_ctk: str, driver_root: str, host_driver_root: str | None = None, *, hook_path: str | None = None
) -> DriverEdits:
    """nvidia-ctk's common edits. Its default (NVML) mode needs a loadable libnvidia-ml; when that fails
    (e.g. the simulator's placeholder libraries) its management mode, which finds the driver by its files,
    gives the same driver-file edits; its device nodes are then cut to the control nodes (the per-GPU ones
    come from the claim)."""
    extra = [f"--nvidia-cdi-hook-path={hook_path}"] if hook_path else []
    if driver_layout.dev_root(driver_root) != driver_root:
        extra.append("--dev-root=/")  # no dev/ under the driver root (GKE): the node's /dev, as NVIDIA's
    with tempfile.TemporaryDirectory(prefix="dra-gpu-ctk-") as tmp:
        out = Path(tmp) / "nvidia.json"
        try:
            spec = _run_ctk(nvidia_ctk, driver_root, out, extra)
            control_only = False
        except subprocess.CalledProcessError as exc:
            log.info(
                "nvidia-ctk cdi generate (NVML mode) failed; trying its management mode",
                error=(exc.stderr or b"").decode(errors="replace").strip().splitlines()[-1:],
            )
            spec = _run_ctk(nvidia_ctk, driver_root, out, [*extra, "--mode=management"])
            control_only = True
    if control_only:
        devices = spec.get("devices") or []
        nodes = [n for d in devices for n in (d.get("containerEdits") or {}).get("deviceNodes") or ()]
        common = dict(spec.get("containerEdits") or {})
        common["deviceNodes"] = [n for n in nodes if str(n.get("path")) in CONTROL_NODES]
        spec = {**spec, "containerEdits": common}
    return _edits_from_ctk_spec(spec, driver_root, host_driver_root or driver_root)


def discover_driver_edits(
    driver_root: str,
    nvidia_ctk: str | None = None,
    use_ctk: bool = True,
    *,
    host_driver_root: str | None = None,
    hook_path: str | None = None,
) -> DriverEdits:
    """Common edits for every claim's spec; computed once at start-up. `driver_root` is where this process
    finds the driver; `host_driver_root` (default: the same) is what the specs name; `hook_path` is
    nvidia-cdi-hook's path on the node (None: no hooks, see cdi_hook_install.py)."""
    ctk = nvidia_ctk or (shutil.which("nvidia-ctk") if use_ctk else None)
    if ctk and hook_path:
        try:
            return discover_with_nvidia_ctk(ctk, driver_root, host_driver_root, hook_path=hook_path)
        except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("nvidia-ctk cdi generate failed; using own driver discovery", error=str(exc))
    elif ctk:
        # nvidia-ctk's hooks would name a binary the runtime cannot find on the node: own discovery instead.
        log.info("nvidia-ctk found but no nvidia-cdi-hook on the node: using own driver discovery")
    return discover_from_driver_root(driver_root, host_driver_root, hook_path=hook_path)


def _capability_minor(path: Path) -> int:
    """The file reads `DeviceFileMinor: <N>` (plus mode lines); a bare number is accepted too."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise MigCapabilityError(f"cannot read MIG capability file {path}: {exc.strerror}") from exc
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
            return int(value.strip())
    if text.strip().isdigit():
        return int(text.strip())
    raise MigCapabilityError(f"MIG capability file {path} has no DeviceFileMinor line")


def mig_capability_minors(driver_root: str, parent_minor: int, gi_id: int, ci_id: int) -> tuple[int, int]:
    """Minors N of `/dev/nvidia-caps/nvidia-cap<N>` for the GPU instance and the compute instance, from
    `proc/driver/nvidia/capabilities` under the driver root when it has one, else under /proc."""
    caps = Path(driver_layout.proc_root(driver_root)) / "proc/driver/nvidia/capabilities"
    base = caps / f"gpu{parent_minor}" / "mig" / f"gi{gi_id}"
    return _capability_minor(base / "access"), _capability_minor(base / f"ci{ci_id}" / "access")
