"""NVIDIA's CDI hooks in our specs, compared with what NVIDIA's own `nvidia-ctk cdi generate` produces.

The comparison runs the real nvidia-ctk built from NVIDIA's Go module by `e2e/cluster/build.sh nvidia-ctk`
(pinned in e2e/cluster/versions.env, cached in ~/.cache/dra-gpu/nvidia-ctk/<version>/) against the simulated
dgx-h100 driver root. NVML cannot load from the simulator's placeholder libraries, so nvidia-ctk's NVML mode
fails there; its management mode finds the driver by its files and yields the same driver-file edits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_gpu.cdi.cdi_hook_install import install_cdi_hook
from dra_gpu.cdi.driver_discovery import discover_driver_edits, discover_from_driver_root
from dra_gpu.cdi.nvidia_hooks import driver_hooks, driver_version_from_library
from dra_gpu.cdi.spec_builder import ClaimDevice, build_claim_spec, gpu_device_nodes
from dra_gpu.cdi.spec_validation import validate_spec
from dra_gpu.hardware.sim_driver_root import init_sim_driver_root

REPO = Path(__file__).resolve().parents[2]
HOOK = "/var/lib/kubelet/plugins/gpu.nvidia.com/nvidia-cdi-hook"
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
DRIVER_VERSION = "570.133.20"  # the dgx-h100 profile's driver


def _nvidia_ctk() -> str | None:
    if os.environ.get("DRA_GPU_NVIDIA_CTK"):
        return os.environ["DRA_GPU_NVIDIA_CTK"]
    versions = (REPO / "e2e" / "cluster" / "versions.env").read_text().splitlines()
    version = next(v.split("=", 1)[1] for v in versions if v.startswith("NVIDIA_CONTAINER_TOOLKIT_VERSION="))
    cache = Path(os.environ.get("DRA_GPU_CACHE", Path.home() / ".cache" / "dra-gpu"))
    built = cache / "nvidia-ctk" / version / "nvidia-ctk"
    return str(built) if built.is_file() else shutil.which("nvidia-ctk")


NVIDIA_CTK = _nvidia_ctk()
needs_ctk = pytest.mark.skipif(
    NVIDIA_CTK is None,
    reason="nvidia-ctk not built: run `e2e/cluster/build.sh nvidia-ctk` (or set DRA_GPU_NVIDIA_CTK)",
)


@pytest.fixture(scope="module")
def sim_root() -> Iterator[str]:
    root = tempfile.mkdtemp(dir="/tmp", prefix="cdi-hooks-")
    init_sim_driver_root(root, "dgx-h100")
    yield root
    shutil.rmtree(root)


def _hooks_json(hooks: Any) -> list[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    return [(h.hook_name, h.path, tuple(h.args), tuple(h.env)) for h in hooks]


def test_own_discovery_carries_nvidias_hooks_for_the_simulated_dgx(sim_root: str) -> None:
    edits = discover_from_driver_root(sim_root, hook_path=HOOK)
    env = ("NVIDIA_CTK_DEBUG=false",)
    assert _hooks_json(edits.hooks) == [
        ("createContainer", HOOK, ("nvidia-cdi-hook", "create-symlinks", "--link",
                                   f"libcuda.so.1::{LIB_DIR}/libcuda.so"), env),
        ("createContainer", HOOK, ("nvidia-cdi-hook", "enable-cuda-compat",
                                   f"--host-driver-version={DRIVER_VERSION}"), env),
        ("createContainer", HOOK, ("nvidia-cdi-hook", "update-ldcache", "--folder", LIB_DIR), env),
    ]  # fmt: skip
    assert edits.env == (f"NVIDIA_CTK_LIBCUDA_DIR={LIB_DIR}",)
    libraries = sorted(m.container_path for m in edits.mounts if "/lib" in m.container_path)
    # Versioned file names (the soname links come from update-ldcache), each existing under the root.
    assert libraries and all(p.endswith(f".so.{DRIVER_VERSION}") for p in libraries), libraries
    assert all(Path(sim_root + p).is_file() for p in libraries)
    spec = build_claim_spec(
        "uid-1", "a/b", [ClaimDevice("gpu-0", ("GPU-x",), gpu_device_nodes("/", 0))], edits
    )
    validate_spec(spec)
    assert [h["args"][1] for h in spec["containerEdits"]["hooks"]] == [
        "create-symlinks", "enable-cuda-compat", "update-ldcache",
    ]  # fmt: skip


def test_without_the_hook_binary_libraries_are_mounted_by_soname_and_no_hooks(sim_root: str) -> None:
    edits = discover_from_driver_root(sim_root)
    assert edits.hooks == () and edits.env == ()
    assert f"{LIB_DIR}/libcuda.so.1" in [m.container_path for m in edits.mounts]


def test_hook_arguments_for_several_library_directories_and_nvidia_ctk_as_hook() -> None:
    hooks, env = driver_hooks(
        "/opt/nvidia-ctk", ["/usr/lib64/libcuda.so.1.2", "/usr/lib/libnvidia-ml.so.1.2"], None
    )
    assert [h.args for h in hooks] == [
        ("nvidia-ctk", "hook", "create-symlinks", "--link", "libcuda.so.1::/usr/lib64/libcuda.so"),
        ("nvidia-ctk", "hook", "update-ldcache", "--folder", "/usr/lib64", "--folder", "/usr/lib"),
    ]
    assert env == ("NVIDIA_CTK_LIBCUDA_DIR=/usr/lib64",)
    with pytest.raises(ValueError, match="absolute"):
        driver_hooks("nvidia-cdi-hook", [], None)
    assert driver_version_from_library("libcuda.so.570.133.20") == "570.133.20"
    assert driver_version_from_library("libcuda.so.1") is None


def _ctk_generate(sim_root: str, *extra: str) -> dict[str, Any]:
    assert NVIDIA_CTK is not None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "spec.json"
        subprocess.run(
            [NVIDIA_CTK, "cdi", "generate", f"--driver-root={sim_root}", "--format=json", f"--output={out}",
             f"--nvidia-cdi-hook-path={HOOK}", *extra],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        spec: dict[str, Any] = json.loads(out.read_text())
        return spec


@needs_ctk
def test_same_hooks_mounts_and_env_as_nvidia_ctk_cdi_generate(sim_root: str) -> None:
    nvidia = _ctk_generate(sim_root, "--mode=management")["containerEdits"]
    ours = discover_from_driver_root(sim_root, hook_path=HOOK)
    assert [
        (h["hookName"], h["path"], tuple(h["args"]), tuple(h.get("env") or ())) for h in nvidia["hooks"]
    ] == (_hooks_json(ours.hooks))
    # Same files at the same places; options differ in spelling only (NVIDIA adds rbind/rprivate).
    assert sorted((m["hostPath"], m["containerPath"]) for m in nvidia["mounts"]) == sorted(
        (m.host_path, m.container_path) for m in ours.mounts
    )
    nvidia_env = [e for e in nvidia["env"] if not e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert nvidia_env == list(ours.env)


@needs_ctk
def test_plugin_uses_real_nvidia_ctk_and_keeps_only_control_nodes(sim_root: str) -> None:
    assert NVIDIA_CTK is not None
    edits = discover_driver_edits(sim_root, nvidia_ctk=NVIDIA_CTK, host_driver_root="/host", hook_path=HOOK)
    assert edits.source == "nvidia-ctk"
    own = discover_from_driver_root(sim_root, "/host", hook_path=HOOK)
    assert _hooks_json(edits.hooks) == _hooks_json(own.hooks)
    assert sorted(n.path for n in edits.device_nodes) == sorted(n.path for n in own.device_nodes)
    assert all(n.host_path and n.host_path.startswith("/host/dev/") for n in edits.device_nodes)
    assert sorted(m.host_path for m in edits.mounts) == sorted(m.host_path for m in own.mounts)


@needs_ctk
def test_nvidia_ctk_without_a_hook_on_the_node_is_not_used(sim_root: str) -> None:
    edits = discover_driver_edits(sim_root, nvidia_ctk=NVIDIA_CTK)
    assert edits.source == "driver-root" and edits.hooks == ()


def test_hook_is_copied_into_the_plugin_directory(tmp_path: Path) -> None:
    source = tmp_path / "image-bin" / "nvidia-cdi-hook"
    source.parent.mkdir()
    source.write_bytes(b"\x7fELF hook")
    plugin_dir = tmp_path / "plugins" / "gpu.nvidia.com"
    path = install_cdi_hook(None, plugin_dir, source=str(source))
    assert path == str(plugin_dir / "nvidia-cdi-hook")
    assert Path(path).read_bytes() == b"\x7fELF hook" and os.access(path, os.X_OK)
    assert [p.name for p in plugin_dir.iterdir()] == ["nvidia-cdi-hook"]  # no temporary file left
    assert install_cdi_hook("/usr/local/nvidia/toolkit/nvidia-cdi-hook", plugin_dir) == (
        "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    )
    with pytest.raises(ValueError, match="nvidiaCDIHookPath"):
        install_cdi_hook("toolkit/nvidia-cdi-hook", plugin_dir)


def test_no_hook_anywhere_means_no_hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert install_cdi_hook(None, tmp_path / "plugin") is None


def test_libraries_linked_from_another_directory_are_mounted_where_they_live(tmp_path: Path) -> None:
    """A host as seen on an H100 machine: the driver in /usr/local/nvidia/lib64, /usr/lib holding absolute
    links to it. NVIDIA's `cdi generate` mounts the files in /usr/local/nvidia/lib64 under their versioned
    names; so does our own discovery (absolute links read inside the driver root, not on this machine)."""
    real = tmp_path / "usr/local/nvidia/lib64"
    real.mkdir(parents=True)
    (tmp_path / "usr/lib").mkdir(parents=True)
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
        versioned = soname.rsplit(".so.", 1)[0] + ".so.580.159.04"
        (real / versioned).write_bytes(b"")
        (real / soname).symlink_to(versioned)
        (tmp_path / "usr/lib" / soname).symlink_to(f"/usr/local/nvidia/lib64/{soname}")
    (tmp_path / "usr/lib/libnvidia-cfg.so.1").symlink_to("/nowhere/libnvidia-cfg.so.1")  # dangling: skipped
    edits = discover_from_driver_root(str(tmp_path), hook_path=HOOK)
    libraries = {m.container_path: m.host_path for m in edits.mounts}
    lib = "/usr/local/nvidia/lib64"
    assert libraries == {
        f"{lib}/libnvidia-ml.so.580.159.04": f"{tmp_path}{lib}/libnvidia-ml.so.580.159.04",
        f"{lib}/libcuda.so.580.159.04": f"{tmp_path}{lib}/libcuda.so.580.159.04",
    }
    assert [h.args[1:] for h in edits.hooks] == [
        ("create-symlinks", "--link", f"libcuda.so.1::{lib}/libcuda.so"),
        ("enable-cuda-compat", "--host-driver-version=580.159.04"),
        ("update-ldcache", "--folder", lib),
    ]
    assert edits.env == (f"NVIDIA_CTK_LIBCUDA_DIR={lib}",)
