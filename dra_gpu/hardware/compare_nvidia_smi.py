"""Discovery fidelity check: what NvmlHardware discovers versus what `nvidia-smi` reports. Read-only.

On a GPU machine: `python -m dra_gpu.hardware.compare_nvidia_smi --hardware real --nvidia-driver-root /`. It
runs the driver root's `nvidia-smi -q -x` (usr/bin, or bin/ on GKE; and `mig -lgipp` for GPUs in MIG
mode), discovers the GPUs through NVML as the plugin does, and prints one line per compared field; the exit
code is 1 when anything differs. Nothing is changed on the machine. With a simulator profile it checks the
simulator against its own fake `nvidia-smi`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass

from dra_gpu.hardware import driver_layout
from dra_gpu.hardware.interface import HardwareError
from dra_gpu.hardware.loader import REAL, open_hardware
from dra_gpu.hardware.types import ComputeMode, DiscoveryResult, GpuInfo, normalize_bus_id

_COMPUTE_MODES = {
    "Default": ComputeMode.DEFAULT,
    "Exclusive_Process": ComputeMode.EXCLUSIVE_PROCESS,
    "Prohibited": ComputeMode.PROHIBITED,
    "Exclusive_Thread": ComputeMode.EXCLUSIVE_THREAD,
}
_PLACEMENTS = re.compile(r"GPU\s+(\d+)\s+Profile ID\s+(\d+)\s+Placements:\s*\{([\d,]*)\}:(\d+)")


@dataclass(frozen=True)
class Check:
    gpu: str
    field: str
    nvidia_smi: str
    discovered: str

    @property
    def ok(self) -> bool:
        return self.nvidia_smi == self.discovered


def _smi_path(driver_root: str) -> str:
    candidate = driver_layout.binary_path(driver_root, "nvidia-smi")
    if os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("nvidia-smi")
    if found is None:
        raise HardwareError(
            f"nvidia-smi not found under {driver_root} (in {', '.join(driver_layout.BINARY_DIRS[1:])}) nor "
            "on PATH"
        )
    return found


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0 and not done.stdout:
        raise HardwareError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def _text(node: ET.Element, path: str) -> str:
    found = node.find(path)
    return (found.text or "").strip() if found is not None else ""


def compare(discovery: DiscoveryResult, smi_xml: str, placements_text: str = "") -> list[Check]:
    """Every comparable field, GPU by GPU (matched by PCI bus id). Pure: takes the tools' outputs as text."""
    root = ET.fromstring(smi_xml)
    checks = [Check("-", "driver version", _text(root, "driver_version"), discovery.driver_version)]
    cuda = _text(root, "cuda_version")
    checks.append(Check("-", "CUDA version", cuda, ".".join(map(str, discovery.cuda_driver_version))))
    by_bus = {g.pci_bus_id: g for g in discovery.gpus}
    smi_gpus = root.findall("gpu")
    checks.append(
        Check("-", "GPU count", str(len(smi_gpus)), str(len(discovery.gpus) + len(discovery.errors)))
    )
    for error in discovery.errors:
        checks.append(Check(f"index {error.gpu_index}", "discovery", "ok", error.message))
    for node in smi_gpus:
        bus = normalize_bus_id(node.get("id", ""))
        gpu = by_bus.get(bus)
        if gpu is None:
            checks.append(Check(bus, "present in discovery", "yes", "no"))
            continue
        checks.extend(_gpu_checks(bus, node, gpu))
    return checks + _placement_checks(discovery, placements_text)


# Facts of one machine, not of the card: a capture from another machine differs in these and nothing else.
PER_MACHINE_FIELDS = frozenset({"uuid", "minor number", "NUMA node", "driver version", "CUDA version"})


def compare_card(discovery: DiscoveryResult, smi_xml: str, placements_text: str = "") -> list[Check]:
    """A real card's captured `nvidia-smi -q -x` (and `mig -lgipp`) against the discovery of another machine
    with the same card, typically the simulated NVML of that card's profile: GPUs matched in order (the
    bus ids are each machine's own), the per-machine fields (PER_MACHINE_FIELDS) left out. Pure."""
    root = ET.fromstring(smi_xml)
    smi_gpus = root.findall("gpu")
    gpus = sorted(discovery.gpus, key=lambda g: g.index)
    checks = [Check("-", "GPU count", str(len(smi_gpus)), str(len(gpus)))]
    for node, gpu in zip(smi_gpus, gpus, strict=False):
        checks += [
            c for c in _gpu_checks(f"index {gpu.index}", node, gpu) if c.field not in PER_MACHINE_FIELDS
        ]
    return checks + _placement_checks(discovery, placements_text)


def _placement_checks(discovery: DiscoveryResult, placements_text: str) -> list[Check]:
    checks: list[Check] = []
    smi_placements: dict[tuple[int, int], tuple[list[int], int]] = {}
    for match in _PLACEMENTS.finditer(placements_text):
        starts = [int(s) for s in match[3].split(",") if s]
        smi_placements[(int(match[1]), int(match[2]))] = (starts, int(match[4]))
    for (index, profile_id), (starts, size) in sorted(smi_placements.items()):
        gpu_by_index = next((g for g in discovery.gpus if g.index == index), None)
        profile = (
            next((p for p in gpu_by_index.mig_profiles if p.gi_profile_id == profile_id), None)
            if (gpu_by_index)
            else None
        )
        found = f"{[p.start for p in profile.placements]}:{profile.memory_slices}" if profile else "missing"
        checks.append(
            Check(f"index {index}", f"MIG profile {profile_id} placements", f"{starts}:{size}", found)
        )
    return checks


def _gpu_checks(bus: str, node: ET.Element, gpu: GpuInfo) -> list[Check]:
    memory = _text(node, "fb_memory_usage/total").replace(" MiB", "")
    numa = _text(node, "numa_node")
    checks = [
        Check(bus, "product name", _text(node, "product_name"), gpu.product_name),
        Check(bus, "uuid", _text(node, "uuid"), gpu.uuid),
        Check(bus, "minor number", _text(node, "minor_number"), str(gpu.minor)),
        Check(bus, "memory MiB", memory, str(gpu.memory_bytes // 2**20)),
        Check(bus, "brand", _text(node, "product_brand").lower(), gpu.brand.lower()),
        Check(
            bus,
            "compute mode",
            _text(node, "compute_mode"),
            next((k for k, v in _COMPUTE_MODES.items() if v == gpu.compute_mode), "?"),
        ),
    ]
    arch = _text(node, "product_architecture")
    if arch:
        checks.append(Check(bus, "architecture", arch, gpu.architecture))
    if numa:
        checks.append(Check(bus, "NUMA node", numa, "N/A" if gpu.numa_node is None else str(gpu.numa_node)))
    current = _text(node, "mig_mode/current_mig")
    if current:
        mig = ("Enabled" if gpu.mig_enabled else "Disabled") if gpu.mig_capable else "N/A"
        checks.append(Check(bus, "MIG mode", current, mig))
    return checks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compare_nvidia_smi", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hardware", default=REAL)
    parser.add_argument("--nvidia-driver-root", dest="driver_root", default=None)
    args = parser.parse_args(argv)
    temp = None
    root = args.driver_root or ("/" if args.hardware == REAL else tempfile.mkdtemp(prefix="cmp-", dir="/tmp"))
    if args.driver_root is None and args.hardware != REAL:
        temp = root
    try:
        hardware = open_hardware(args.hardware, root)
        discovery = hardware.discover()
        smi = _smi_path(root)
        xml_text = _run([smi, "-q", "-x"])
        placements = _run([smi, "mig", "-lgipp"]) if any(g.mig_enabled for g in discovery.gpus) else ""
        hardware.close()
    except HardwareError as err:
        print(f"compare_nvidia_smi: {err}", file=sys.stderr)
        return 2
    finally:
        if temp:
            shutil.rmtree(temp, ignore_errors=True)
    checks = compare(discovery, xml_text, placements)
    for check in checks:
        mark = "ok  " if check.ok else "DIFF"
        print(
            f"{mark} {check.gpu:<14} {check.field:<32} nvidia-smi={check.nvidia_smi!r} "
            f"discovered={check.discovered!r}"
        )
    bad = sum(not c.ok for c in checks)
    print(f"{len(checks) - bad}/{len(checks)} fields agree")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
