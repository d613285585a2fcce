"""Built-in GPU profiles and node layouts for the simulator.

Numbers come from the MIG tables in `docs`/`nvidia-conventions.md` §12 (NVIDIA MIG User Guide plus `nvidia-smi
mig
-lgip`/`-lgipp` outputs). Where that table marks a value unconfirmed we use the neighbouring part's value and
say so
next to it. H200-141GB uses NVIDIA's published H200 profile names and IDs with the H100 geometry; its MIG
memory sizes, like the H100 80GB's, are what NVML reported on a real card.

Pure data and pure functions: no NVML, no files.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from dra_gpu.hardware.types import normalize_bus_id

# NVML_DEVICE_ARCH_* values (pynvml constants, copied as plain ints so this module stays import-light)
ARCH_PASCAL = 4
ARCH_TURING = 6
ARCH_AMPERE = 7
ARCH_ADA = 8
ARCH_HOPPER = 9

ARCHITECTURE_NAMES = {
    ARCH_PASCAL: "Pascal",
    ARCH_TURING: "Turing",
    ARCH_AMPERE: "Ampere",
    ARCH_ADA: "Ada Lovelace",
    ARCH_HOPPER: "Hopper",
}

# NVML_BRAND_* values
BRAND_TESLA = 2
BRAND_NVIDIA = 14

# NVML_GPU_INSTANCE_PROFILE_* enum -> the numeric profile id (`info.id`) it reports on A100/H100-class parts.
GI_ENUM_1_SLICE = 0
GI_ENUM_2_SLICE = 1
GI_ENUM_3_SLICE = 2
GI_ENUM_4_SLICE = 3
GI_ENUM_7_SLICE = 4
GI_ENUM_1_SLICE_REV1 = 7  # "+me": one slice with all media engines
GI_ENUM_1_SLICE_REV2 = 9  # one compute slice with two memory slices

MEMORY_SLICES = 8
COMPUTE_SLICES = 7


@dataclass(frozen=True)
class MigProfileSpec:
    """One GPU-instance profile row of a MIG table."""

    name: str  # "1g.10gb"
    gi_enum: int  # NVML_GPU_INSTANCE_PROFILE_* passed to GetGpuInstanceProfileInfo
    gi_profile_id: int  # info.id (19, 20, 15, 14, 9, 5, 0)
    compute_slices: int
    memory_slices: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    max_instances: int
    starts: tuple[int, ...]  # valid placement starts on an empty GPU


@dataclass(frozen=True)
class GpuProfile:
    """A GPU model: what NVML reports about one board of this kind."""

    key: str  # "h100-80gb"
    product_name: str
    brand: int  # NVML_BRAND_*
    architecture: int  # NVML_DEVICE_ARCH_*
    cuda_compute_capability: tuple[int, int]
    memory_mib: int  # nvmlDeviceGetMemoryInfo().total / MiB
    multiprocessors: int
    pci_device_id: int  # nvmlPciInfo_t.pciDeviceId (device << 16 | vendor 0x10de)
    nvlinks: int = 0  # NVLink links per GPU (A100: 12, H100/H200: 18); used only in NVSwitch layouts
    mig_profiles: tuple[MigProfileSpec, ...] = ()
    # Whether `nvidia-smi compute-policy --set-timeslice` works on this board. A per-board fact, not an
    # architecture cut-off: the Tesla P4 refuses it (NVIDIA DRA driver issues #41, #81, #363) while NVIDIA
    # notes that other Pascal parts with compute preemption accept it.
    supports_timeslice: bool = True

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    @property
    def mig_toggle_without_reset(self) -> bool:
        """Hopper and newer switch MIG mode immediately; Ampere only sets the pending mode until a GPU
        reset."""
        return self.mig_capable and self.architecture >= ARCH_HOPPER


def _gib(value: float) -> int:
    """GiB as printed by `nvidia-smi mig -lgip` -> MiB as NVML's memorySizeMB."""
    return round(value * 1024)


_STARTS_1 = (0, 1, 2, 3, 4, 5, 6)
_STARTS_1_REV2 = (0, 2, 4, 6)
_STARTS_2 = (0, 2, 4)
_STARTS_3 = (0, 4)
_STARTS_4 = (0,)
_STARTS_7 = (0,)


def _ampere_profiles(names: tuple[str, ...], gib: tuple[float, ...]) -> tuple[MigProfileSpec, ...]:
    """A100 geometry: 98 SMs in 7 slices, 5 NVDEC, 1 JPEG, 1 OFA, no NVENC (MIG guide, `-lgip` on A100)."""
    n1, n1me, n1r2, n2, n3, n4, n7 = names
    g1, g1r2, g2, g3, g7 = gib
    return (
        MigProfileSpec(n1, GI_ENUM_1_SLICE, 19, 1, 1, _gib(g1), 14, 1, 0, 0, 0, 0, 7, _STARTS_1),
        # +me placements and 1g.<2 slices> rows: unconfirmed for A100, taken from the H100 output (§12).
        MigProfileSpec(n1me, GI_ENUM_1_SLICE_REV1, 20, 1, 1, _gib(g1), 14, 1, 1, 0, 1, 1, 1, _STARTS_1),
        MigProfileSpec(
            n1r2, GI_ENUM_1_SLICE_REV2, 15, 1, 2, _gib(g1r2), 14, 1, 1, 0, 0, 0, 4, _STARTS_1_REV2
        ),
        MigProfileSpec(n2, GI_ENUM_2_SLICE, 14, 2, 2, _gib(g2), 28, 2, 1, 0, 0, 0, 3, _STARTS_2),
        MigProfileSpec(n3, GI_ENUM_3_SLICE, 9, 3, 4, _gib(g3), 42, 3, 2, 0, 0, 0, 2, _STARTS_3),
        MigProfileSpec(n4, GI_ENUM_4_SLICE, 5, 4, 4, _gib(g3), 56, 4, 2, 0, 0, 0, 1, _STARTS_4),
        MigProfileSpec(n7, GI_ENUM_7_SLICE, 0, 7, 8, _gib(g7), 98, 7, 5, 0, 1, 1, 1, _STARTS_7),
    )


def _hopper_profiles(names: tuple[str, ...], gib: tuple[float, ...]) -> tuple[MigProfileSpec, ...]:
    """H100 SXM geometry: 132 SMs, 7 NVDEC, 7 NVJPG, 1 OFA, no NVENC; CE 1/1/1/2/3/4/8 (`-lgip` on H100)."""
    n1, n1me, n1r2, n2, n3, n4, n7 = names
    g1, g1r2, g2, g3, g7 = gib
    return (
        MigProfileSpec(n1, GI_ENUM_1_SLICE, 19, 1, 1, _gib(g1), 16, 1, 1, 0, 1, 0, 7, _STARTS_1),
        MigProfileSpec(n1me, GI_ENUM_1_SLICE_REV1, 20, 1, 1, _gib(g1), 16, 1, 1, 0, 1, 1, 1, _STARTS_1),
        MigProfileSpec(
            n1r2, GI_ENUM_1_SLICE_REV2, 15, 1, 2, _gib(g1r2), 26, 1, 1, 0, 1, 0, 4, _STARTS_1_REV2
        ),
        MigProfileSpec(n2, GI_ENUM_2_SLICE, 14, 2, 2, _gib(g2), 32, 2, 2, 0, 2, 0, 3, _STARTS_2),
        MigProfileSpec(n3, GI_ENUM_3_SLICE, 9, 3, 4, _gib(g3), 60, 3, 3, 0, 3, 0, 2, _STARTS_3),
        MigProfileSpec(n4, GI_ENUM_4_SLICE, 5, 4, 4, _gib(g3), 64, 4, 4, 0, 4, 0, 1, _STARTS_4),
        MigProfileSpec(n7, GI_ENUM_7_SLICE, 0, 7, 8, _gib(g7), 132, 8, 7, 0, 7, 1, 1, _STARTS_7),
    )


A100_40GB = GpuProfile(
    key="a100-40gb",
    product_name="NVIDIA A100-SXM4-40GB",
    brand=BRAND_NVIDIA,
    architecture=ARCH_AMPERE,
    cuda_compute_capability=(8, 0),
    memory_mib=40960,
    multiprocessors=108,
    pci_device_id=0x20B010DE,
    nvlinks=12,
    mig_profiles=_ampere_profiles(
        ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
        (4.75, 9.62, 9.62, 19.50, 39.25),
    ),
)

A100_80GB = GpuProfile(
    key="a100-80gb",
    product_name="NVIDIA A100-SXM4-80GB",
    brand=BRAND_NVIDIA,
    architecture=ARCH_AMPERE,
    cuda_compute_capability=(8, 0),
    memory_mib=81920,
    multiprocessors=108,
    pci_device_id=0x20B210DE,
    nvlinks=12,
    mig_profiles=_ampere_profiles(
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        (9.50, 19.50, 19.50, 39.50, 79.25),  # 1g.20gb size unconfirmed (§12): same as 2g.20gb
    ),
)

H100_80GB = GpuProfile(
    key="h100-80gb",
    product_name="NVIDIA H100 80GB HBM3",
    brand=BRAND_NVIDIA,
    architecture=ARCH_HOPPER,
    cuda_compute_capability=(9, 0),
    memory_mib=81559,
    multiprocessors=132,
    pci_device_id=0x233010DE,
    nvlinks=18,
    mig_profiles=_hopper_profiles(
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        # NVML's sizes on a real H100 80GB HBM3 (driver 580.159.04, 2026-11-25): 9984, 20096, 20096, 40448 and
        # 81152 MiB; nvidia-smi prints 20096 MiB as "19.62" GiB
        (9.75, 19.625, 19.625, 39.50, 79.25),
    ),
)

H200_141GB = GpuProfile(
    key="h200-141gb",
    product_name="NVIDIA H200",
    brand=BRAND_NVIDIA,
    architecture=ARCH_HOPPER,
    cuda_compute_capability=(9, 0),
    memory_mib=143771,
    multiprocessors=132,
    pci_device_id=0x233510DE,
    nvlinks=18,
    mig_profiles=_hopper_profiles(
        ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        # NVML's sizes on a real H200 (driver 580.159.04, 2026-11-26): 16384, 33280, 33280, 71424 and
        # 143360 MiB
        (16.0, 32.5, 32.5, 69.75, 140.0),
    ),
)

# The Hopper GPU of a GH200 Grace Hopper superchip, 96GB HBM3 variant. NVML's name as DCGM and CUDA report it
# (nvidia-smi's table prints "NVIDIA GH200 480GB" for the superchip on some drivers); 97871 MiB total as
# nvidia-smi prints it; PCI device 0x2342. MIG names and sizes from `nvidia-smi mig -lgip` on a GH200 (11.00,
# 23.00, 23.00, 46.50 and 93.00 GiB; SM, CE and engine counts as the H100 SXM's, which `_hopper_profiles`
# already has).
GH200_96GB = GpuProfile(
    key="gh200-96gb",
    product_name="NVIDIA GH200 96GB HBM3",
    brand=BRAND_NVIDIA,
    architecture=ARCH_HOPPER,
    cuda_compute_capability=(9, 0),
    memory_mib=97871,
    multiprocessors=132,
    pci_device_id=0x234210DE,
    nvlinks=18,
    mig_profiles=_hopper_profiles(
        ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"),
        (11.0, 23.0, 23.0, 46.5, 93.0),
    ),
)

L40S = GpuProfile(
    key="l40s",
    product_name="NVIDIA L40S",
    brand=BRAND_NVIDIA,
    architecture=ARCH_ADA,
    cuda_compute_capability=(8, 9),
    memory_mib=46068,
    multiprocessors=142,
    pci_device_id=0x26B910DE,
)

T4 = GpuProfile(
    key="t4",
    product_name="Tesla T4",
    brand=BRAND_TESLA,
    architecture=ARCH_TURING,
    cuda_compute_capability=(7, 5),
    memory_mib=15360,
    multiprocessors=40,
    pci_device_id=0x1EB810DE,
)

# Pascal GP104, PCIe, 75 W. 2560 CUDA cores at 128 per SM (compute capability 6.1) = 20 SMs. 8 GiB GDDR5,
# of which current drivers report 7680 MiB as the total (older ones printed 7611 MiB). No MIG, no NVLink.
P4 = GpuProfile(
    key="p4",
    product_name="Tesla P4",
    brand=BRAND_TESLA,
    architecture=ARCH_PASCAL,
    cuda_compute_capability=(6, 1),
    memory_mib=7680,
    multiprocessors=20,
    pci_device_id=0x1BB310DE,
    supports_timeslice=False,
)

GPU_PROFILES: dict[str, GpuProfile] = {
    p.key: p for p in (A100_40GB, A100_80GB, H100_80GB, H200_141GB, GH200_96GB, L40S, T4, P4)
}


@dataclass(frozen=True)
class GpuSlot:
    """Where one GPU sits in a node: PCI address, NUMA node, interconnect."""

    profile: GpuProfile
    pci_bus: int  # the bus number of "0000:<bus>:00.0"
    pcie_root: str  # "pci0000:00"
    numa_node: int | None
    interconnect: str | None  # "nvswitch-0"; None for PCIe-only
    pci_device: int = 0  # the device number of "0000:<bus>:<device>.0"
    pci_domain: int = 0  # the domain of "<domain>:<bus>:<device>.0"; non-zero on Grace systems (GH200: 0009)


@dataclass(frozen=True)
class NodeLayout:
    key: str
    description: str
    slots: tuple[GpuSlot, ...]
    driver_version: str = "570.133.20"
    cuda_driver_version: int = 12080  # nvmlSystemGetCudaDriverVersion_v2: 1000*major + 10*minor
    # What nvmlDeviceGetAddressingMode reports (NVML_DEVICE_ADDRESSING_MODE_*: 0 none, 1 HMM, 2 ATS), a
    # property of the platform (kernel, open kernel modules, coherent CPU-GPU link), not of the GPU model.
    # None: the platform does not support the query (NOT_SUPPORTED); R535 drivers lack the call altogether.
    addressing_mode: int | None = None


# DGX A100/H100 bus numbers as `nvidia-smi` lists them on those systems (GPU 0-3 on NUMA 0, 4-7 on NUMA 1).
_DGX_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)
_DGX_ROOTS = (
    "pci0000:00",
    "pci0000:00",
    "pci0000:40",
    "pci0000:40",
    "pci0000:80",
    "pci0000:80",
    "pci0000:b0",
    "pci0000:b0",
)


def _dgx(profile: GpuProfile) -> tuple[GpuSlot, ...]:
    return tuple(
        GpuSlot(profile, bus, root, 0 if i < 4 else 1, "nvswitch-0")
        for i, (bus, root) in enumerate(zip(_DGX_BUSES, _DGX_ROOTS, strict=True))
    )


NODE_LAYOUTS: dict[str, NodeLayout] = {
    layout.key: layout
    for layout in (
        NodeLayout("dgx-a100", "DGX A100: 8x A100-SXM4-40GB on NVSwitch, two NUMA nodes", _dgx(A100_40GB)),
        NodeLayout(
            "dgx-h100",
            "DGX H100: 8x H100 80GB HBM3 on NVSwitch, two NUMA nodes, HMM (open kernel modules)",
            _dgx(H100_80GB),
            addressing_mode=1,
        ),
        NodeLayout(
            "dual-gh200",
            "2x GH200 96GB Grace Hopper superchips, one NUMA node each, ATS (coherent NVLink-C2C)",
            # Each superchip's GPU sits alone in its own PCI domain (0009 and 0019), as on real GH200 systems
            (
                GpuSlot(GH200_96GB, 0x01, "pci0009:00", 0, None, pci_domain=0x0009),
                GpuSlot(GH200_96GB, 0x01, "pci0019:00", 1, None, pci_domain=0x0019),
            ),
            addressing_mode=2,
        ),
        NodeLayout(
            "pcie-4x-l40s",
            "4x L40S on PCIe only, two NUMA nodes",
            (
                GpuSlot(L40S, 0x17, "pci0000:16", 0, None),
                GpuSlot(L40S, 0x31, "pci0000:30", 0, None),
                GpuSlot(L40S, 0xB1, "pci0000:b0", 1, None),
                GpuSlot(L40S, 0xCA, "pci0000:c9", 1, None),
            ),
        ),
        NodeLayout(
            "single-t4",
            "one Tesla T4 (cloud VM at 00:1e.0, no NUMA information)",
            (GpuSlot(T4, 0x00, "pci0000:00", None, None, pci_device=0x1E),),
            driver_version="535.183.01",
            cuda_driver_version=12020,
        ),
        NodeLayout(
            "single-p4",
            "one Tesla P4, pre-Volta (cloud VM at 00:04.0, no NUMA information)",
            (GpuSlot(P4, 0x00, "pci0000:00", None, None, pci_device=0x04),),
            driver_version="535.216.01",  # R535 LTS: a branch that still supports Pascal
            cuda_driver_version=12020,
        ),
    )
}


def known_hardware_names() -> list[str]:
    """Every name `--hardware` accepts besides `real`: node layouts first, then single-GPU profiles."""
    return sorted(NODE_LAYOUTS) + sorted(GPU_PROFILES)


class UnknownHardwareError(ValueError):
    pass


def resolve_layout(name: str) -> NodeLayout:
    """A node layout by name; a single-GPU profile name gives a one-GPU node with that GPU."""
    if name in NODE_LAYOUTS:
        return NODE_LAYOUTS[name]
    if name in GPU_PROFILES:
        profile = GPU_PROFILES[name]
        return NodeLayout(
            name, f"one {profile.product_name}", (GpuSlot(profile, 0x01, "pci0000:00", 0, None),)
        )
    raise UnknownHardwareError(
        f"unknown hardware {name!r}: use 'real' or one of {', '.join(known_hardware_names())}"
    )


@dataclass(frozen=True)
class SimulatedGpu:
    """One concrete simulated GPU: a slot plus its identity on a given node."""

    index: int
    minor: int
    uuid: str
    slot: GpuSlot

    @property
    def profile(self) -> GpuProfile:
        return self.slot.profile

    @property
    def pci_bus_id(self) -> str:
        """NVML's busId format: 8-digit domain, upper-case hex ("00000000:07:00.0")."""
        return f"{self.slot.pci_domain:08X}:{self.slot.pci_bus:02X}:{self.slot.pci_device:02X}.0"

    @property
    def sysfs_bus_id(self) -> str:
        """The same address as sysfs names it: 4-digit domain, lower case ("0000:07:00.0")."""
        return normalize_bus_id(self.pci_bus_id)


def gpu_uuid(seed: str, index: int) -> str:
    """A stable `GPU-xxxxxxxx-...` UUID derived from the node seed (node name) and the GPU's position."""
    digest = hashlib.sha256(f"dra-gpu-sim/{seed}/{index}".encode()).digest()
    return "GPU-" + str(uuid.UUID(bytes=digest[:16], version=4))


def mig_uuid(parent_uuid: str, gi_id: int, ci_id: int, serial: int) -> str:
    """A `MIG-...` UUID; `serial` makes a re-created instance get a new UUID, as on hardware."""
    digest = hashlib.sha256(f"{parent_uuid}/{gi_id}/{ci_id}/{serial}".encode()).digest()
    return "MIG-" + str(uuid.UUID(bytes=digest[:16], version=4))


def simulated_gpus(layout: NodeLayout, seed: str) -> tuple[SimulatedGpu, ...]:
    """NVML enumerates GPUs in PCI order; minor numbers follow the same order on these systems."""
    ordered = sorted(layout.slots, key=lambda s: (s.pci_domain, s.pcie_root, s.pci_bus, s.pci_device))
    return tuple(SimulatedGpu(i, i, gpu_uuid(seed, i), slot) for i, slot in enumerate(ordered))


# Where the driver puts a GPU instance it is not told the placement of (`nvmlDeviceCreateGpuInstance`, what
# `nvidia-smi mig -cgi` calls): the free start it tries first, by (placement size, starts of the profile). Not
# first fit, and not the placement that leaves most room (that would put a 1g.24gb at 6:2, not 4:2). Observed:
# - NVIDIA MIG User Guide, "Instance Geometry" (A100-40GB; the driver is not named): `-cgi 19,14,5` gives
#   GPU instances 13, 5, 1 (6:1, 4:2, 0:4); `-cgi 19,19,14,9` 13, 11, 3 (6:1, 4:1, 0:2) and then fails with
#   Insufficient Resources for the 3g.20gb (the guide's "known issue": name 3g.20gb first); `-cgi 9,19,14,19`
#   gives 2, 7, 4, 8 (4:4, 0:1, 2:2, 1:1); `-cgi 14,19,19,19,19,19` gives 5, 13, 7, 8, 9, 10;
# - `-cgi 19,19,19,19,19,19,19 -C` on an H100 80GB HBM3 (a public nvidia-smi usage note on GitHub; the driver
#   is not named): 13, 11, 12, 7, 8, 9, 10;
# - `-cgi 14,14,14,20 -C` on an A100 80GB of an Azure VM (Microsoft Tech Community blog post "End-to-end
#   Stable Diffusion test on Azure NC A100/H100 MIG", 2024-08): 5, 3, 4, 13;
# - `-cgi 15,15,15 -C` on a GH200, driver 550.54.15 (2024-07-27, tests/hardware/data/real/
#   nvidia-gh200-96gb-hbm3/cuanschutz-slurm-mig-log): 5, 3, 4 (4:2, 0:2, 2:2). The fourth 1g.24gb, at 6:2,
#   was never observed before the others: it is put last.
# Profiles of other geometries keep first fit (their starts in order).
_DEFAULT_PLACEMENT_ORDER: dict[tuple[int, tuple[int, ...]], tuple[int, ...]] = {
    (1, _STARTS_1): (6, 4, 5, 0, 1, 2, 3),
    (2, _STARTS_2): (4, 0, 2),
    (2, _STARTS_1_REV2): (4, 0, 2, 6),
    (4, _STARTS_3): (4, 0),
}


def default_placement_order(spec: MigProfileSpec) -> tuple[int, ...]:
    """The starts of `spec` in the order the driver tries them when no placement is given."""
    return _DEFAULT_PLACEMENT_ORDER.get((spec.memory_slices, spec.starts), spec.starts)


def compute_instance_multiprocessors(profile: GpuProfile, gi: MigProfileSpec, ci_slices: int) -> int:
    """SMs of a compute instance of `ci_slices` compute slices inside a GPU instance of profile `gi`: all of
    the GPU instance's where it spans it, else those of the plain GPU-instance profile of that many slices (a
    1g's, a 2g's...), not a share of the GPU instance's. Observed on an H200, driver 590.48.01 (2026-07-03,
    tests/hardware/data/real/nvidia-h200/nvidia-gpu-exporter-mig-590.48.01): 1c.3g.71gb has 16 SMs and
    2c.3g.71gb 32 where the 3g.71gb has 60; on an A100 (MIG User Guide, `-lcip -gi 1`) 1c.3g.20gb 14 and
    2c.3g.20gb 28, the same rule."""
    if ci_slices >= gi.compute_slices:
        return gi.multiprocessors
    plain = (GI_ENUM_1_SLICE, GI_ENUM_2_SLICE, GI_ENUM_3_SLICE, GI_ENUM_4_SLICE, GI_ENUM_7_SLICE)
    same_size = [p for p in profile.mig_profiles if p.gi_enum in plain and p.compute_slices == ci_slices]
    return same_size[0].multiprocessors if same_size else gi.multiprocessors * ci_slices // gi.compute_slices


# NVML_COMPUTE_INSTANCE_PROFILE_* enum (the CI profile id on hardware) -> compute slices
CI_PROFILE_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}
CI_PROFILE_1_SLICE_REV1 = 7
# Compute-instance sizes a GPU instance of N compute slices offers (`nvidia-smi mig -lcip`).
_CI_SIZES_FOR_GI = {1: (1,), 2: (1, 2), 3: (1, 2, 3), 4: (1, 2, 4), 7: (1, 2, 3, 4, 7)}


def _plain_one_slice_multiprocessors(profile: GpuProfile) -> int:
    return next(p.multiprocessors for p in profile.mig_profiles if p.gi_enum == GI_ENUM_1_SLICE)


def compute_instance_profiles(profile: GpuProfile, gi: MigProfileSpec) -> dict[int, int]:
    """The compute-instance profiles (id -> compute slices) a GPU instance of profile `gi` offers. A one-slice
    GPU instance with more SMs than a plain 1g (Hopper's 1g.24gb: 26 against 16) has one, the 1-slice rev1
    profile (id 7) spanning it: `nvidia-smi mig -cgi 15,15,15 -C` on a GH200, driver 550.54.15 (2024-07-27,
    tests/hardware/data/real/nvidia-gh200-96gb-hbm3/cuanschutz-slurm-mig-log), made compute instances of
    profile 7. Whether such a GPU instance also offers profile 0 (16 SMs) was not observed: it does not here.
    An A100's 1g.10gb has a plain 1g's 14 SMs and keeps profile 0."""
    if gi.compute_slices == 1 and gi.multiprocessors > _plain_one_slice_multiprocessors(profile):
        return {CI_PROFILE_1_SLICE_REV1: 1}
    sizes = _CI_SIZES_FOR_GI.get(gi.compute_slices, (gi.compute_slices,))
    return {ci: n for ci, n in CI_PROFILE_SLICES.items() if n in sizes}


def full_compute_instance_profile(profile: GpuProfile, gi: MigProfileSpec) -> int:
    """The compute-instance profile that spans a GPU instance of profile `gi` (what `-cgi ... -C` makes)."""
    offered = compute_instance_profiles(profile, gi)
    return next(ci for ci, n in offered.items() if n == gi.compute_slices)


def compute_instance_name(gi: MigProfileSpec, ci_slices: int) -> str:
    """The compute-instance profile's name: the GPU instance's, with "Nc." in front for part of it, without
    "+me" (`-cgi 14,14,14,20 -C` on an A100 80GB, Microsoft Tech Community post of 2024-08: the 1g.10gb+me GPU
    instance's compute instance is "MIG 1g.10gb (ID 0)")."""
    base = gi.name.removesuffix("+me")
    return base if ci_slices >= gi.compute_slices else f"{ci_slices}c.{base}"


def gpu_instance_id(start: int, size: int) -> int:
    """GPU-instance id for a placement, as the driver assigns it (swizzle id): 8 slices -> 0, halves -> 1-2,
    quarters -> 3-6, eighths -> 7-14. Overlapping placements never share an id, so ids are unique per GPU."""
    if size >= 8:
        return 0
    if size >= 4:
        return 1 + start // 4
    if size >= 2:
        return 3 + start // 2
    return 7 + start
