"""The CDI hooks NVIDIA's `nvidia-ctk cdi generate` puts into the common edits, for our own discovery (pure).

When nvidia-ctk cannot run (not in the image, or NVML not loadable from the driver root) but the hook binary
`nvidia-cdi-hook` is on the node, our specs carry the same hooks as NVIDIA's, in NVIDIA's order:
- `create-symlinks --link libcuda.so.1::<dir>/libcuda.so`: the development name CUDA's runtime also tries;
- `enable-cuda-compat --host-driver-version=<version>`: lets an image's CUDA forward-compatibility libraries
  take over only when they are newer than the host driver;
- `update-ldcache --folder <dir>` for each directory a library is mounted in: the container's loader cache
  learns those directories (and ldconfig creates the soname links), so images whose loader does not search
  the host's library directory (RHEL/UBI-based ones, for one) still find libcuda.
With the hooks, libraries are mounted under their versioned file name (libcuda.so.<version>), as NVIDIA
does; the soname link comes from update-ldcache. Each hook runs with NVIDIA_CTK_DEBUG=false, and the spec
sets NVIDIA_CTK_LIBCUDA_DIR to libcuda's directory (the cuda-compat hook reads it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath

from dra_gpu.cdi.spec_builder import CdiHook

HOOK_NAME = "createContainer"  # OCI hook stage NVIDIA's spec uses for all three
HOOK_ENV = ("NVIDIA_CTK_DEBUG=false",)
LIBCUDA_SONAME = "libcuda.so.1"
LIBCUDA_DEV_NAME = "libcuda.so"


def driver_version_from_library(file_name: str, soname_prefix: str = "libcuda.so.") -> str | None:
    """`libcuda.so.570.133.20` -> `570.133.20`; None for a soname link (`libcuda.so.1`) or another file."""
    if not file_name.startswith(soname_prefix):
        return None
    version = file_name[len(soname_prefix) :]
    parts = version.split(".")
    return version if len(parts) >= 2 and all(p.isdigit() for p in parts) else None


def _hook(hook_path: str, *args: str) -> CdiHook:
    # argv[0] is the binary's own name; nvidia-ctk (older toolkits) serves the hooks as `nvidia-ctk hook ...`.
    name = PurePosixPath(hook_path).name
    fixed = (name, "hook") if name == "nvidia-ctk" else (name,)
    return CdiHook(hook_name=HOOK_NAME, path=hook_path, args=(*fixed, *args), env=HOOK_ENV)


def driver_hooks(
    hook_path: str, library_paths: Sequence[str], driver_version: str | None
) -> tuple[tuple[CdiHook, ...], tuple[str, ...]]:
    """Hooks and env for libraries mounted at `library_paths` (container paths, versioned file names)."""
    if not hook_path.startswith("/"):
        raise ValueError(f"nvidia-cdi-hook path must be absolute on the node, got {hook_path!r}")
    hooks: list[CdiHook] = []
    env: list[str] = []
    libcuda_dir = next(
        (
            str(PurePosixPath(p).parent)
            for p in library_paths
            if PurePosixPath(p).name.startswith("libcuda.so.")
        ),
        None,
    )
    if libcuda_dir is not None:
        link = f"{LIBCUDA_SONAME}::{libcuda_dir}/{LIBCUDA_DEV_NAME}"
        hooks.append(_hook(hook_path, "create-symlinks", "--link", link))
        env.append(f"NVIDIA_CTK_LIBCUDA_DIR={libcuda_dir}")
    if driver_version and libcuda_dir is not None:
        hooks.append(_hook(hook_path, "enable-cuda-compat", f"--host-driver-version={driver_version}"))
    folders: list[str] = []
    for path in library_paths:
        folder = str(PurePosixPath(path).parent)
        if folder not in folders:
            folders.append(folder)
    if folders:
        args: list[str] = ["update-ldcache"]
        for folder in folders:
            args += ["--folder", folder]
        hooks.append(_hook(hook_path, *args))
    return tuple(hooks), tuple(env)
