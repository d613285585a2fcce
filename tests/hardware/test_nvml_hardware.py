"""NvmlHardware over the simulator: discovery, MIG lifecycle, sharing knobs, driver root, loader and CLI."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from dra_gpu.hardware.interface import HardwareError
from dra_gpu.hardware.loader import open_hardware
from dra_gpu.hardware.simulator import StateStore
from dra_gpu.hardware.simulator.state import Fault
from dra_gpu.hardware.types import ComputeMode, MigPlacement

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hw-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _cli(command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`dra-gpu <command> ...` through the sub-command's own entry point (independent of the others)."""
    return subprocess.run(
        [sys.executable, "-m", f"dra_gpu.cli.{command}", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_discovers_dgx_h100_topology(root: Path) -> None:
    result = open_hardware("dgx-h100", str(root), seed="node-a").discover()
    assert result.errors == ()
    assert result.driver_version == "570.133.20" and result.cuda_driver_version == (12, 8)
    assert [g.minor for g in result.gpus] == list(range(8))
    assert [g.numa_node for g in result.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {g.interconnect for g in result.gpus} == {"nvswitch-0"}
    gpu = result.gpus[0]
    assert (gpu.pci_bus_id, gpu.pcie_root) == ("0000:07:00.0", "pci0000:00")
    assert result.gpus[7].pci_bus_id == "0000:bd:00.0" and result.gpus[7].pcie_root == "pci0000:b0"
    assert (gpu.product_name, gpu.architecture, gpu.cuda_compute_capability) == (
        "NVIDIA H100 80GB HBM3",
        "Hopper",
        (9, 0),
    )
    assert gpu.multiprocessors == 132 and gpu.memory_bytes == 81559 * 2**20
    assert gpu.mig_capable and not gpu.mig_enabled and gpu.mig_toggle_without_reset
    starts = {p.name: [pl.start for pl in p.placements] for p in gpu.mig_profiles}
    assert starts == {
        "1g.10gb": [0, 1, 2, 3, 4, 5, 6],
        "1g.10gb+me": [0, 1, 2, 3, 4, 5, 6],
        "1g.20gb": [0, 2, 4, 6],
        "2g.20gb": [0, 2, 4],
        "3g.40gb": [0, 4],
        "4g.40gb": [0],
        "7g.80gb": [0],
    }
    assert len({g.uuid for g in result.gpus}) == 8
    # UUIDs are a function of the seed: same seed, same UUIDs; another node, others
    again = open_hardware("dgx-h100", str(root)).discover()
    assert [g.uuid for g in again.gpus] == [g.uuid for g in result.gpus]


def test_pcie_and_cloud_layouts(root: Path) -> None:
    l40s = open_hardware("pcie-4x-l40s", str(root / "a")).discover()
    assert [g.interconnect for g in l40s.gpus] == [None] * 4
    assert [g.numa_node for g in l40s.gpus] == [0, 0, 1, 1]
    assert not any(g.mig_capable for g in l40s.gpus)
    t4 = open_hardware("single-t4", str(root / "b")).discover()
    assert (t4.gpus[0].numa_node, t4.gpus[0].pci_bus_id, t4.gpus[0].brand) == (None, "0000:00:1e.0", "Tesla")


def test_mig_lifecycle_keeps_capability_files_in_step(root: Path) -> None:
    hw = open_hardware("dgx-h100", str(root))
    gpu = hw.discover().gpus[2]
    device = hw.create_mig_device(gpu.uuid, 9, 4)  # 3g.40gb at 4:4, enables MIG on Hopper
    assert (device.profile, device.gi_id, device.ci_id, device.placement) == (
        "3g.40gb",
        2,
        0,
        MigPlacement(4, 4),
    )
    assert device.uuid.startswith("MIG-") and device.parent_minor == 2
    assert hw.list_mig_devices(gpu.uuid) == [device]
    gi_access = root / "proc/driver/nvidia/capabilities/gpu2/mig/gi2/access"
    ci_access = root / "proc/driver/nvidia/capabilities/gpu2/mig/gi2/ci0/access"
    gi_minor = int(gi_access.read_text().split("\n")[0].split(": ")[1])
    assert gi_access.read_text() == f"DeviceFileMinor: {gi_minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
    ci_minor = int(ci_access.read_text().split("\n")[0].split(": ")[1])
    assert (root / f"dev/nvidia-caps/nvidia-cap{gi_minor}").exists()
    assert (root / f"dev/nvidia-caps/nvidia-cap{ci_minor}").exists()
    assert f"gpu2/gi2/access {gi_minor}" in (root / "proc/driver/nvidia-caps/mig-minors").read_text()
    with pytest.raises(HardwareError, match="INSUFFICIENT_RESOURCES"):
        hw.create_mig_device(gpu.uuid, 19, 5)
    after_failure = hw.list_mig_devices(gpu.uuid)
    assert after_failure == [device]  # nothing half-made left behind
    hw.destroy_mig_device(gpu.uuid, device.gi_id, device.ci_id)
    hw.destroy_mig_device(gpu.uuid, device.gi_id, device.ci_id)  # already gone: fine
    assert hw.list_mig_devices(gpu.uuid) == []
    assert not gi_access.exists() and not (root / f"dev/nvidia-caps/nvidia-cap{gi_minor}").exists()
    hw.set_mig_mode(gpu.uuid, False)
    hw.destroy_mig_device(gpu.uuid, 2, 0)  # MIG off: nothing to destroy, no error


def test_ampere_needs_reset_for_mig_mode(root: Path) -> None:
    hw = open_hardware("dgx-a100", str(root))
    gpu = hw.discover().gpus[0]
    assert not gpu.mig_toggle_without_reset
    with pytest.raises(HardwareError, match="pending until the GPU is reset"):
        hw.create_mig_device(gpu.uuid, 19, 0)
    assert hw.discover().gpus[0].mig_pending
    done = _cli("hardware", "reset", "--driver-root", str(root), "-i", "0")
    assert done.returncode == 0, done.stderr
    device = hw.create_mig_device(gpu.uuid, 19, 6)
    assert device.profile == "1g.5gb" and device.gi_id == 13


def test_sharing_knobs_reach_the_state(root: Path) -> None:
    hw = open_hardware("dgx-h100", str(root))
    uuid = hw.discover().gpus[4].uuid
    hw.set_compute_mode(uuid, ComputeMode.EXCLUSIVE_PROCESS)
    assert hw.get_compute_mode(uuid) == ComputeMode.EXCLUSIVE_PROCESS
    hw.set_time_slice(uuid, 3)  # runs <root>/usr/bin/nvidia-smi twice, as NVIDIA's driver does
    state = StateStore(root / "var/lib/nvml-sim/state.json").read()
    assert (state.gpus[4].compute_mode, state.gpus[4].timeslice) == (0, 3)
    with pytest.raises(HardwareError, match=r"0 \(Default\) \.\. 3"):
        hw.set_time_slice(uuid, 7)


def test_one_broken_gpu_is_reported_and_the_rest_published(root: Path) -> None:
    hw = open_hardware("dgx-h100", str(root))
    with StateStore(root / "var/lib/nvml-sim/state.json").transaction() as state:
        state.faults.append(Fault(5, "nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST))
    result = hw.discover()
    assert [g.index for g in result.gpus] == [0, 1, 2, 3, 4, 6, 7]
    assert len(result.errors) == 1 and result.errors[0].gpu_index == 5
    assert "nvmlDeviceGetMemoryInfo" in result.errors[0].message
    assert "NVML_ERROR_GPU_IS_LOST" in result.errors[0].message


def test_loader_errors_are_actionable(root: Path) -> None:
    with pytest.raises(HardwareError, match=r"unknown hardware 'dgx-z9'.*dgx-h100"):
        open_hardware("dgx-z9", str(root))
    with pytest.raises(HardwareError, match="not a readable directory") as missing:
        open_hardware("real", str(root / "missing"))
    with pytest.raises(HardwareError, match=r"libnvidia-ml\.so\.1 not found") as no_library:
        open_hardware("real", str(root))
    for err in (missing, no_library):  # the root may be the host's or the container's view of it
        assert "--nvidia-driver-root" in str(err.value) and "--container-driver-root" in str(err.value)
        assert "CONTAINER_DRIVER_ROOT" in str(err.value)
    open_hardware("h100-80gb", str(root / "sim"))
    with pytest.raises(HardwareError, match="simulated driver root has placeholder libraries"):
        open_hardware("real", str(root / "sim"))
    with pytest.raises(HardwareError, match="already simulates hardware 'h100-80gb'"):
        open_hardware("dgx-h100", str(root / "sim"))


def test_simulated_driver_root_layout(root: Path) -> None:
    done = _cli("hardware", "init-sim", "--hardware", "dgx-h100", "--driver-root", str(root), "--seed", "n1")
    assert done.returncode == 0, done.stderr
    for node in (
        "dev/nvidia0",
        "dev/nvidia7",
        "dev/nvidiactl",
        "dev/nvidia-uvm",
        "dev/nvidia-uvm-tools",
        "dev/nvidia-caps/nvidia-cap1",
        "dev/nvidia-caps/nvidia-cap2",
    ):
        assert (root / node).exists(), node
    assert (
        root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    ).resolve().name == "libnvidia-ml.so.570.133.20"
    assert (root / "usr/bin/nvidia-cuda-mps-control").stat().st_mode & 0o111
    state = json.loads(_cli("hardware", "state", "--driver-root", str(root), "-o", "json").stdout)
    assert state["hardware"] == "dgx-h100" and state["seed"] == "n1"
    assert [d["minor"] for d in state["devices"]] == list(range(8))


def test_fake_nvidia_smi(root: Path) -> None:
    open_hardware("dgx-h100", str(root))
    smi = str(root / "usr/bin/nvidia-smi")
    query = subprocess.run([smi, "-q", "-i", "0"], capture_output=True, text=True, check=True).stdout
    assert "Product Name                          : NVIDIA H100 80GB HBM3" in query
    assert "Bus Id                            : 00000000:07:00.0" in query
    assert subprocess.run([smi, "mig", "-lgip"], capture_output=True, text=True).stdout.strip() == (
        "No MIG-enabled devices found."
    )
    subprocess.run([smi, "-i", "0", "-mig", "1"], check=True, capture_output=True)
    placements = subprocess.run([smi, "mig", "-lgipp", "-i", "0"], capture_output=True, text=True).stdout
    assert "Profile ID  9 Placements: {0,4}:4" in placements
    bad = subprocess.run([smi, "-i", "9", "-c", "DEFAULT"], capture_output=True, text=True)
    assert bad.returncode != 0 and "No devices were found" in bad.stderr
    done = subprocess.run(
        [smi, "-i", "00000000:0F:00.0", "-c", "EXCLUSIVE_PROCESS"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert StateStore(root / "var/lib/nvml-sim/state.json").read().gpus[1].compute_mode == 3


def test_hardware_cli_lists_profiles() -> None:
    done = _cli("hardware", "list", "-o", "json")
    names = {item["name"] for item in json.loads(done.stdout)}
    assert {
        "dgx-a100",
        "dgx-h100",
        "pcie-4x-l40s",
        "single-t4",
        "a100-40gb",
        "a100-80gb",
        "h100-80gb",
        "h200-141gb",
        "l40s",
        "t4",
        "p4",
        "single-p4",
    } <= names


def test_tesla_p4_discovery(root: Path) -> None:
    result = open_hardware("single-p4", str(root)).discover()
    assert result.errors == () and len(result.gpus) == 1
    assert (result.driver_version, result.cuda_driver_version) == ("535.216.01", (12, 2))
    gpu = result.gpus[0]
    assert (gpu.product_name, gpu.brand, gpu.architecture, gpu.cuda_compute_capability) == (
        "Tesla P4",
        "Tesla",
        "Pascal",
        (6, 1),
    )
    # 2560 CUDA cores at 128 per SM: the core count NVML reports must come back as 20 SMs
    assert (gpu.multiprocessors, gpu.memory_bytes) == (20, 7680 * 2**20)
    assert (gpu.pci_bus_id, gpu.numa_node, gpu.interconnect) == ("0000:00:04.0", None, None)
    assert not gpu.mig_capable and not gpu.mig_enabled and gpu.mig_profiles == ()
    smi = str(root / "usr/bin/nvidia-smi")
    query = subprocess.run([smi, "-q"], capture_output=True, text=True, check=True).stdout
    assert "Device Id                         : 0x1BB310DE" in query
    assert "Product Architecture                  : Pascal" in query
    assert "Timeslice                         : N/A" in query


def test_time_slice_on_tesla_p4_fails_as_on_the_real_card(root: Path) -> None:
    hw = open_hardware("p4", str(root))
    uuid = hw.discover().gpus[0].uuid
    smi = str(root / "usr/bin/nvidia-smi")
    done = subprocess.run(
        [smi, "compute-policy", "-i", uuid, "--set-timeslice", "1"], capture_output=True, text=True
    )
    assert done.returncode == 3
    assert done.stdout.strip() == "Setting time slice is not supported for GPU 00000000:01:00.0."
    with pytest.raises(HardwareError, match=rf"GPU {uuid}: cannot set the time-slice interval to 3") as err:
        hw.set_time_slice(uuid, 3)
    assert "this GPU does not support it" in str(err.value)
    assert "Setting time slice is not supported for GPU 00000000:01:00.0" in str(err.value)
    assert err.value.nvml_code == pynvml.NVML_ERROR_NOT_SUPPORTED
    state = StateStore(root / "var/lib/nvml-sim/state.json").read()
    assert state.gpus[0].timeslice == 0
    hw.set_compute_mode(uuid, ComputeMode.EXCLUSIVE_PROCESS)  # compute mode itself works on a P4
    assert hw.get_compute_mode(uuid) == ComputeMode.EXCLUSIVE_PROCESS


def test_time_slice_failure_that_is_not_unsupported(root: Path) -> None:
    """A lost GPU is not "unsupported": nvidia-smi's exit code tells them apart, and so does the error."""
    hw = open_hardware("t4", str(root))
    uuid = hw.discover().gpus[0].uuid
    with StateStore(root / "var/lib/nvml-sim/state.json").transaction() as state:
        state.faults.append(Fault(0, "nvmlDeviceSetComputeMode", pynvml.NVML_ERROR_GPU_IS_LOST))
    with pytest.raises(
        HardwareError, match=rf"GPU {uuid}: cannot set the compute mode to DEFAULT: .*exited 15"
    ) as err:
        hw.set_time_slice(uuid, 1)
    # a lost GPU, as nvidia-smi's exit code 15 says: what needs it waits for it (sharing's pending cleanup)
    assert err.value.gpu_gone and "does not support" not in str(err.value)


def test_addressing_mode_is_read_or_left_unknown(root: Path) -> None:
    dgx = open_hardware("dgx-h100", str(root / "dgx"), seed="node-a").discover()
    assert {g.addressing_mode for g in dgx.gpus} == {"HMM"}
    for hardware in ("pcie-4x-l40s", "single-t4"):  # NOT_SUPPORTED, FUNCTION_NOT_FOUND
        result = open_hardware(hardware, str(root / hardware), seed="node-a").discover()
        assert result.errors == () and {g.addressing_mode for g in result.gpus} == {None}


def test_addressing_mode_failure_fails_that_gpu_as_nvidia_does(root: Path) -> None:
    hw = open_hardware("dgx-h100", str(root))
    with StateStore(root / "var/lib/nvml-sim/state.json").transaction() as state:
        state.faults.append(Fault(2, "nvmlDeviceGetAddressingMode", pynvml.NVML_ERROR_UNKNOWN))
    result = hw.discover()
    assert [e.gpu_index for e in result.errors] == [2] and 2 not in [g.index for g in result.gpus]
    assert "nvmlDeviceGetAddressingMode failed" in result.errors[0].message


def test_fake_nvidia_smi_applies_a_mig_parted_layout(root: Path) -> None:
    """NVIDIA's quickstart README applies mig-parted's `half-balanced` layout before gpu-test4; the simulated
    nvidia-smi does the same steps (`-mig 1`, a reset on Ampere, `mig -cgi ... -C`) and the driver sees the
    MIG devices as it would after mig-parted."""
    hw = open_hardware("dgx-a100", str(root))
    smi = str(root / "usr/bin/nvidia-smi")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([smi, *args], capture_output=True, text=True, timeout=60)

    assert run("-i", "0,1", "-mig", "1").returncode == 0
    off = run("mig", "-i", "0", "-cgi", "19", "-C")  # pending until the reset: nothing is made
    assert off.returncode != 0 and hw.list_mig_devices(hw.discover().gpus[0].uuid) == []
    assert run("-i", "0,1", "-r").returncode == 0
    # The 3g.20gb first: in the order 1g.5gb,1g.5gb,2g.10gb,3g.20gb the driver puts the 1g.5gb at 6:1 and 4:1
    # and the 2g.10gb at 0:2, and no 3g.20gb fits (the MIG User Guide's "known issue"). mig-parted tries the
    # orders of a layout's profiles until one works; this is the one that does.
    done = run("mig", "-i", "0,1", "-cgi", "3g.20gb,1g.5gb,1g.5gb,2g.10gb", "-C")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("Successfully created GPU instance") == 8
    assert done.stdout.count("Successfully created compute instance") == 8
    gpus = hw.discover().gpus
    for gpu in gpus[:2]:
        made = hw.list_mig_devices(gpu.uuid)
        assert sorted(d.profile for d in made) == ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
        for device in made:  # each with its capability device nodes, as the CDI spec needs them
            access = root / f"proc/driver/nvidia/capabilities/gpu{gpu.minor}/mig/gi{device.gi_id}/access"
            minor = int(access.read_text().split("\n")[0].split(": ")[1])
            assert (root / f"dev/nvidia-caps/nvidia-cap{minor}").exists()
    assert hw.list_mig_devices(gpus[2].uuid) == []
    full = run("mig", "-i", "0", "-cgi", "19")  # no room left: fails, changes nothing
    assert full.returncode != 0 and len(hw.list_mig_devices(gpus[0].uuid)) == 4
    assert full.stderr.splitlines() == [
        "Unable to create a GPU instance on GPU  0 using profile 19: Insufficient Resources",
        "Failed to create GPU instances: Insufficient Resources",
    ]
    # What was made before the refusal stays and is reported, as the real tool does
    assert run("-i", "2", "-mig", "1").returncode == 0 and run("-i", "2", "-r").returncode == 0
    partial = run("mig", "-i", "2", "-cgi", "3g.20gb,3g.20gb,3g.20gb", "-C")
    assert partial.returncode != 0 and partial.stdout.count("Successfully created GPU instance") == 2
    assert "Insufficient Resources" in partial.stderr and len(hw.list_mig_devices(gpus[2].uuid)) == 2
    unknown = run("mig", "-i", "0", "-cgi", "2g.99gb")
    assert unknown.returncode == 2 and "no GPU instance profile '2g.99gb'" in unknown.stderr
    assert "14 (2g.10gb)" in unknown.stderr


def test_dual_gh200_two_gpus_that_differ_only_by_pci_domain(root: Path) -> None:
    """A 2x GH200 node: each superchip's GPU is alone at 01:00.0 of its own PCI domain (0009, 0019), so
    everything that finds a GPU by its address must read the domain; its MIG table is the GH200's (`nvidia-smi
    mig -lgip` on a GH200 96GB: 1g.12gb at 11.00 GiB, ..., 7g.96gb at 93.00 GiB), and NVIDIA's
    extended-resources/mig-1g-12gb setup (seven 1g.12gb per GPU) fills each GPU exactly."""
    hw = open_hardware("dual-gh200", str(root))
    gpus = hw.discover().gpus
    assert [(g.pci_bus_id, g.pcie_root, g.numa_node) for g in gpus] == [
        ("0009:01:00.0", "pci0009:00", 0),
        ("0019:01:00.0", "pci0019:00", 1),
    ]
    assert [g.addressing_mode for g in gpus] == ["ATS", "ATS"]
    assert gpus[0].product_name == "NVIDIA GH200 96GB HBM3" and gpus[0].memory_bytes == 97871 * 2**20
    sizes = {p.name: p.memory_mib for p in gpus[0].mig_profiles}
    assert sizes == {
        "1g.12gb": 11264,
        "1g.12gb+me": 11264,
        "1g.24gb": 23552,
        "2g.24gb": 23552,
        "3g.48gb": 47616,
        "4g.48gb": 47616,
        "7g.96gb": 95232,
    }
    smi = str(root / "usr/bin/nvidia-smi")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([smi, *args], capture_output=True, text=True, timeout=60)

    # `-i` by PCI address picks the GPU of that domain, not the first one at 01:00.0
    only_second = run("-i", "00000019:01:00.0", "-mig", "1")
    assert only_second.returncode == 0, only_second.stderr
    assert "GPU 00000019:01:00.0" in only_second.stdout and "00000009" not in only_second.stdout
    assert [g.mig_enabled for g in hw.discover().gpus] == [False, True]  # Hopper: no reset needed
    assert run("-i", "0", "-mig", "1").returncode == 0
    made = run("mig", "-i", "0,1", "-cgi", ",".join(["1g.12gb"] * 7), "-C")
    assert made.returncode == 0, made.stderr
    for gpu in hw.discover().gpus:
        devices = hw.list_mig_devices(gpu.uuid)
        assert sorted(d.placement.start for d in devices) == list(range(7))
        assert {d.profile for d in devices} == {"1g.12gb"}
    assert run("mig", "-i", "0", "-cgi", "19").returncode != 0  # the GPU is full


def test_a_hopper_1g_24gb_gets_the_compute_instance_that_spans_it(root: Path) -> None:
    """A GH200's 1g.24gb has 26 SMs where compute-instance profile 0 would give a 1g's 16: the real driver's
    `-C` made it a compute instance of profile 7 (1-slice rev1; driver 550.54.15). The driver's own MIG path
    makes the same, and lists a 1g.24gb that nvidia-smi made as a MIG device, not as an empty GPU instance."""
    hw = open_hardware("gh200-96gb", str(root))
    uuid = hw.discover().gpus[0].uuid
    ours = hw.create_mig_device(uuid, 15, 0)  # 1g.24gb at 0:2
    smi = subprocess.run(
        [str(root / "usr/bin/nvidia-smi"), "mig", "-cgi", "15", "-C"], capture_output=True, text=True
    )
    assert "GPU instance ID  5" in smi.stdout and "using profile MIG 1g.24gb (ID  7)" in smi.stdout
    nvml = hw._nvml
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    for gi_id in (ours.gi_id, 5):
        gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
        count = ctypes.c_uint(0)
        cis = (nvml.c_nvmlComputeInstance_t * 1)()
        nvml.nvmlGpuInstanceGetComputeInstances(gpu_instance, 7, cis, ctypes.byref(count))
        assert count.value == 1
    assert [(d.profile, d.gi_id) for d in hw.list_mig_devices(uuid)] == [("1g.24gb", 3), ("1g.24gb", 5)]
    hw.close()
