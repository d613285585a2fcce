"""Driver roots in NVIDIA's layouts (a host install, RHEL's usr/lib64, GKE/COS's bin/ + lib64/), laid out by
the simulator (`dra-gpu hardware init-sim --driver-layout`), found as NVIDIA's plugin finds them (root.go
`findFile`): NVML, nvidia-smi and the CDI mounts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dra_gpu.cdi.driver_discovery import discover_from_driver_root
from dra_gpu.hardware import driver_layout
from dra_gpu.hardware.interface import HardwareError
from dra_gpu.hardware.loader import find_nvml_library, open_hardware
from dra_gpu.hardware.sim_driver_root import DRIVER_LAYOUTS, existing_driver_layout, init_sim_driver_root

VERSION = "570.133.20"  # the simulated dgx-h100's driver
LAYOUTS = {  # layout -> where nvidia-smi and libnvidia-ml.so.1 are, inside the root
    "standard": ("/usr/bin/nvidia-smi", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
    "rhel": ("/usr/bin/nvidia-smi", "/usr/lib64/libnvidia-ml.so.1"),
    "gke": ("/bin/nvidia-smi", "/lib64/libnvidia-ml.so.1"),
}


INIT_SIM = (sys.executable, "-m", "dra_gpu.cli.main", "hardware", "init-sim", "--hardware", "dgx-h100")


def _init_cli(root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*INIT_SIM, "--driver-root", str(root), *extra],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_each_layout_is_found_as_nvidia_finds_it(tmp_path: Path, layout: str) -> None:
    root = tmp_path / "drv"
    done = _init_cli(root, "--driver-layout", layout)
    assert done.returncode == 0, done.stderr
    smi, nvml = LAYOUTS[layout]
    assert existing_driver_layout(root) == layout
    assert driver_layout.find_binary(root, "nvidia-smi") == smi
    assert driver_layout.find_binary(root, "nvidia-cuda-mps-control") == smi.replace(
        "nvidia-smi", "nvidia-cuda-mps-control"
    )
    assert driver_layout.find_library(root, "libnvidia-ml.so.1") == nvml
    assert find_nvml_library(str(root)) == root / nvml.lstrip("/")
    # the other layouts' directories stay empty: nothing is found by accident in a standard place
    others = {d for name, dirs in DRIVER_LAYOUTS.items() if name != layout for d in dirs} - set(
        DRIVER_LAYOUTS[layout]
    )
    assert not any((root / d).exists() for d in others), others

    # The plugin opens it (the simulator keeps the layout: no usr/bin appears in a GKE root) and runs the
    # root's own nvidia-smi to set a time slice.
    hardware = open_hardware("dgx-h100", str(root))
    assert existing_driver_layout(root) == layout
    gpu = hardware.discover().gpus[0]
    hardware.set_time_slice(gpu.uuid, 3)
    assert open_hardware("simulated", str(root)).discover().gpus[0].uuid == gpu.uuid


@pytest.mark.parametrize(
    ("layout", "host_root"),
    [
        ("standard", "/"),
        ("standard", "/run/nvidia/driver"),
        ("rhel", "/"),
        ("gke", "/home/kubernetes/bin/nvidia"),
    ],
)
def test_cdi_mounts_name_the_host_paths_of_each_layout(tmp_path: Path, layout: str, host_root: str) -> None:
    root = tmp_path / "drv"
    init_sim_driver_root(root, "dgx-h100", driver_layout=layout)
    edits = discover_from_driver_root(str(root), host_root, hook_path="/usr/bin/nvidia-cdi-hook")
    mounts = {m.container_path: m.host_path for m in edits.mounts}
    smi, nvml = LAYOUTS[layout]
    lib_dir = str(Path(nvml).parent)
    host = host_root.rstrip("/")
    # containers see the files where the driver root has them (nvidia-ctk does the same), the specs name the
    # host's files
    assert mounts[f"{lib_dir}/libnvidia-ml.so.{VERSION}"] == f"{host}{lib_dir}/libnvidia-ml.so.{VERSION}"
    assert mounts[smi] == f"{host}{smi}"
    assert mounts[smi.replace("nvidia-smi", "nvidia-cuda-mps-control")].startswith(host + "/")
    folders = [h.args for h in edits.hooks if "update-ldcache" in h.args]
    assert folders == [("nvidia-cdi-hook", "update-ldcache", "--folder", lib_dir)]


def test_missing_library_names_every_searched_directory(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    with pytest.raises(HardwareError) as err:
        find_nvml_library(str(tmp_path))
    for directory in ("lib64", "usr/lib64", "usr/lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"):
        assert f"{tmp_path}/{directory}/libnvidia-ml.so.1" in str(err.value)
    assert "/home/kubernetes/bin/nvidia" in str(err.value)  # the hint names GKE's driver root


def test_links_resolve_inside_the_root(tmp_path: Path) -> None:
    """A host driver in /usr/local/nvidia with absolute links in /usr/lib64: the link is followed inside the
    root, never to this machine's /usr/local."""
    real = tmp_path / "usr/local/nvidia/lib64/libnvidia-ml.so.580.1"
    real.parent.mkdir(parents=True)
    real.write_text("")
    link = tmp_path / "usr/lib64/libnvidia-ml.so.1"
    link.parent.mkdir(parents=True)
    link.symlink_to("/usr/local/nvidia/lib64/libnvidia-ml.so.580.1")
    assert driver_layout.find_library(tmp_path, "libnvidia-ml.so.1") == "/usr/lib64/libnvidia-ml.so.1"
    assert driver_layout.resolve_in_root(tmp_path, "/usr/lib64/libnvidia-ml.so.1") == (
        "/usr/local/nvidia/lib64/libnvidia-ml.so.580.1"
    )
    (tmp_path / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (tmp_path / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").symlink_to("/nowhere/libnvidia-ml.so.1")
    assert driver_layout.find_library(tmp_path, "libnvidia-ml.so.1") == "/usr/lib64/libnvidia-ml.so.1"


def test_a_root_keeps_its_layout_unless_forced(tmp_path: Path) -> None:
    root = tmp_path / "drv"
    assert _init_cli(root, "--driver-layout", "gke").returncode == 0
    refused = _init_cli(root, "--driver-layout", "standard")
    assert refused.returncode == 1 and "has the 'gke' driver layout" in refused.stderr
    assert _init_cli(root).returncode == 0  # no layout named: the root's own
    assert existing_driver_layout(root) == "gke"
    assert _init_cli(root, "--driver-layout", "standard", "--force").returncode == 0
    assert existing_driver_layout(root) == "standard"
    assert not (root / "bin" / "nvidia-smi").exists() and not (root / "lib64" / "libnvidia-ml.so.1").exists()
    bad = _init_cli(tmp_path / "other", "--driver-layout", "cos")
    assert bad.returncode == 2 and "invalid choice: 'cos'" in bad.stderr


def test_device_nodes_come_from_the_nodes_dev_when_the_root_has_none(tmp_path: Path) -> None:
    """NVIDIA's devRoot: GKE/COS's driver directory holds only bin/ and lib64/, so device nodes and the MIG
    capability files are the node's own (/dev, /proc); a root with dev/ (host install, GPU Operator, the
    simulator) keeps them."""
    gke = tmp_path / "gke"
    init_sim_driver_root(gke, "dgx-h100", driver_layout="gke")
    assert driver_layout.dev_root(gke) == str(gke) and driver_layout.proc_root(gke) == str(gke)
    assert (
        driver_layout.host_dev_root(str(gke), "/home/kubernetes/bin/nvidia") == "/home/kubernetes/bin/nvidia"
    )
    bare = tmp_path / "bare"  # what GKE's /home/kubernetes/bin/nvidia looks like
    for directory in ("bin", "lib64"):
        shutil.copytree(gke / directory, bare / directory, symlinks=True)
    assert driver_layout.dev_root(bare) == "/" and driver_layout.proc_root(bare) == "/"
    assert driver_layout.host_dev_root(str(bare), "/home/kubernetes/bin/nvidia") == "/"
    assert driver_layout.host_dev_root("/", "/") == "/"
    edits = discover_from_driver_root(str(bare), "/home/kubernetes/bin/nvidia")
    # no device node is named under the driver directory; the libraries are
    assert not any("/home/kubernetes/bin/nvidia/dev" in str(n.host_path) for n in edits.device_nodes)
    mounts = {m.container_path: m.host_path for m in edits.mounts}
    assert mounts["/lib64/libnvidia-ml.so.1"].startswith("/home/kubernetes/bin/nvidia/lib64/libnvidia-ml.so.")
