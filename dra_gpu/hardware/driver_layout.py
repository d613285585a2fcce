"""Where the NVIDIA driver's files are under a driver root, looked for as NVIDIA's driver looks for them.

Driver roots come in several layouts, all served with the same search:
- a host install (`/`) and the GPU Operator's driver container (`/run/nvidia/driver`): a whole root file
  system, tools in `usr/bin`, libraries in `usr/lib/x86_64-linux-gnu` (Debian/Ubuntu), `usr/lib64` (RHEL) or
  `usr/lib/aarch64-linux-gnu`;
- GKE / Container-Optimized OS (`/home/kubernetes/bin/nvidia`): the installer's directory with `bin/` and
  `lib64/` directly under the root.

NVIDIA's GPU kubelet plugin (kubernetes-sigs/dra-driver-nvidia-gpu `cmd/gpu-kubelet-plugin/root.go`
`findFile`) tries the root itself and then a fixed list of directories under it, in order, and takes the first
candidate that resolves to a regular file; these lists are its lists (libraries: `librarySearchPaths`;
tools: those of `getNvidiaSMIPath`), plus `usr/lib` and `lib` for libraries, which our earlier releases
searched. Links are followed inside the root: an absolute link target means that path under the root (as the
host sees it), never a file of this container.
"""

from __future__ import annotations

import os
from pathlib import Path

LIBRARY_DIRS: tuple[str, ...] = (
    "",
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
    "lib",
)
BINARY_DIRS: tuple[str, ...] = ("", "opt/bin", "usr/bin", "usr/sbin", "bin", "sbin")
_MAX_LINKS = 16  # a longer chain is a loop


def resolve_in_root(root: str | os.PathLike[str], path: str) -> str:
    """`path` (absolute, inside the root) with its links followed inside the root: through the soname link
    (`libcuda.so.1` -> `libcuda.so.570.133.20`) and links into other directories, relative or absolute. The
    path itself when the chain does not end in a regular file."""
    base = Path(root)
    current = "/" + path.lstrip("/")
    for _ in range(_MAX_LINKS):
        link = base / current.lstrip("/")
        if not link.is_symlink():
            break
        target = os.readlink(link)
        current = target if target.startswith("/") else os.path.normpath(f"{Path(current).parent}/{target}")
    return current if (base / current.lstrip("/")).is_file() else path


def _find(root: str | os.PathLike[str], name: str, dirs: tuple[str, ...]) -> str | None:
    for directory in dirs:
        inside = f"/{directory}/{name}" if directory else f"/{name}"
        if (Path(root) / resolve_in_root(root, inside).lstrip("/")).is_file():
            return inside
    return None


def find_library(root: str | os.PathLike[str], name: str) -> str | None:
    """Where `name` (a soname such as `libnvidia-ml.so.1`) is under the root, as a path inside it
    (`/usr/lib64/libnvidia-ml.so.1`); None when no search directory has it."""
    return _find(root, name, LIBRARY_DIRS)


def find_binary(root: str | os.PathLike[str], name: str) -> str | None:
    """Where the tool `name` (`nvidia-smi`, `nvidia-cuda-mps-control`) is under the root, as a path inside it
    (`/usr/bin/nvidia-smi`, `/bin/nvidia-smi` on GKE); None when no search directory has it."""
    return _find(root, name, BINARY_DIRS)


def binary_path(root: str | os.PathLike[str], name: str) -> str:
    """The tool's path as this process runs it: where it was found, else `<root>/usr/bin/<name>` (so that the
    error of running it names the usual place)."""
    found = find_binary(root, name) or f"/usr/bin/{name}"
    return os.path.join(str(root), found.lstrip("/"))


def library_dirs(root: str | os.PathLike[str]) -> list[str]:
    """The search directories that exist under the root (this process's paths), in search order: the
    `LD_LIBRARY_PATH` for a driver tool run from the root."""
    found = []
    for directory in LIBRARY_DIRS[1:]:  # the root itself is no library directory of a whole file system
        path = os.path.join(str(root), directory)
        if os.path.isdir(path) and not os.path.islink(path):
            found.append(path)
    return found


def dev_root(root: str | os.PathLike[str]) -> str:
    """Where the device nodes are, as NVIDIA's plugin decides it (root.go `getDevRoot`): the driver root when
    it has a `dev` directory (a host install, the GPU Operator's driver container, the simulator), else `/`
    (GKE/COS's `/home/kubernetes/bin/nvidia` holds only the driver's files)."""
    return str(root) if os.path.isdir(os.path.join(str(root), "dev")) else "/"


def host_dev_root(container_root: str, host_root: str) -> str:
    """`dev_root` as the host names it: the host's driver root when the devices are under the driver root."""
    return host_root if dev_root(container_root) != "/" or container_root == "/" else "/"


def proc_root(root: str | os.PathLike[str]) -> str:
    """Where `proc/driver/nvidia` (MIG capability files) is read: under the driver root when it has one (the
    simulator keeps its own there), else this process's `/proc` (the kernel's, seen from any container)."""
    return str(root) if os.path.isdir(os.path.join(str(root), "proc", "driver", "nvidia")) else "/"
