"""Discovery fidelity check: what NvmlHardware discovers versus what `nvidia-smi` reports. Read-only.

On a GPU machine: `python -m dra_gpu.hardware.compare_nvidia_smi --hardware real --nvidia-driver-root /`. It
runs the driver root's `nvidia-smi -q -x` (usr/bin, or bin/ on GKE; and `mig -lgipp` and `mig -lgip` for
GPUs in MIG mode), discovers the GPUs through NVML as the plugin does, and prints one line per compared
field; the exit code is 1 when anything differs. Nothing is changed on the machine. With a simulator profile
it checks the simulator against its own fake `nvidia-smi`. The fidelity test (tests/hardware/
test_compare_nvidia_smi.py) runs the same comparison on real cards' output kept as test data.
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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

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
# `mig -lgipp` prints "Placements:" for several starts, "Placement :" for a single start
_PLACEMENTS = re.compile(r"GPU\s+(\d+)\s+Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([\d,]*)\}:(\d+)")
# `nvidia-smi -L`: "  MIG 2c.3g.71gb  Device  1: (UUID: ...)"; "2c." names a compute instance of 2 slices
_LIST_MIG = re.compile(r"^\s+MIG\s+(?:(\d+)c\.)?(\S+)\s+Device\s+(\d+):", re.MULTILINE)
_ENGINES = ("copy engines", "decoders", "encoders", "JPEG engines", "OFA engines")
# `mig -lgip`: two table rows a profile, "|   0  MIG 1g.12gb   19   7/7   11.00   No   16   1   0   |"
# (GPU, name, id, free/total instances, GiB, P2P, SMs, DEC, ENC) and "|   1   1   0   |" (CE, JPEG, OFA)
_LGIP = re.compile(
    r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+\S+\s+(\d+)\s+(\d+)\s+(\d+)\s*\|\s*\n"
    r"\|\s+(\d+)\s+(\d+)\s+(\d+)\s*\|",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Check:
    gpu: str
    field: str
    nvidia_smi: str
    discovered: str

    @property
    def ok(self) -> bool:
        return self.nvidia_smi == self.discovered


@dataclass(frozen=True)
class SmiMigDevice:
    """One MIG device as `nvidia-smi -q` (text or XML) shows it; `profile` where `nvidia-smi -L` named it."""

    index: int
    gi_id: int
    ci_id: int
    multiprocessors: int
    engines: tuple[int, int, int, int, int]  # in _ENGINES order
    memory_mib: int
    profile: str = ""  # the GPU-instance profile ("3g.71gb"), from `nvidia-smi -L`
    ci_slices: int = 0  # the "2" of "2c.3g.71gb"; 0 where the compute instance spans its GPU instance


@dataclass(frozen=True)
class SmiGpu:
    """The fields of one GPU that nvidia-smi's `-q` and `-q -x` both print and the comparison uses."""

    bus_id: str
    product_name: str
    brand: str
    architecture: str
    uuid: str
    minor: str
    memory_mib: str
    compute_mode: str
    numa_node: str
    mig_mode: str  # current MIG mode: "Enabled", "Disabled", "N/A"; "" where not printed
    pci_device_id: str  # "233010DE"
    mig_devices: tuple[SmiMigDevice, ...] = ()


@dataclass(frozen=True)
class SmiLog:
    driver_version: str
    cuda_version: str
    gpus: tuple[SmiGpu, ...]


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


def _int(value: str) -> int:
    return int(value.split()[0]) if value and value.split()[0].isdigit() else -1


def _engines(counts: Iterable[int]) -> tuple[int, int, int, int, int]:
    ce, dec, enc, jpg, ofa = counts
    return ce, dec, enc, jpg, ofa


def _named(devices: list[SmiMigDevice], list_text: str) -> tuple[SmiMigDevice, ...]:
    """The MIG devices with the profile names `nvidia-smi -L` gives them (matched by device index)."""
    names = {int(m[3]): (m[2], int(m[1] or 0)) for m in _LIST_MIG.finditer(list_text)}
    return tuple(
        replace(d, profile=names[d.index][0], ci_slices=names[d.index][1]) if d.index in names else d
        for d in devices
    )


def parse_xml(smi_xml: str, list_text: str = "") -> SmiLog:
    """`nvidia-smi -q -x` (and optionally `nvidia-smi -L` for the MIG devices' profile names)."""
    root = ET.fromstring(smi_xml)
    gpus = []
    for node in root.findall("gpu"):
        devices = [
            SmiMigDevice(
                index=_int(_text(mig, "index")),
                gi_id=_int(_text(mig, "gpu_instance_id")),
                ci_id=_int(_text(mig, "compute_instance_id")),
                multiprocessors=_int(_text(mig, "device_attributes/shared/multiprocessor_count")),
                engines=_engines(
                    _int(_text(mig, f"device_attributes/shared/{tag}"))
                    for tag in (
                        "copy_engine_count",
                        "decoder_count",
                        "encoder_count",
                        "jpg_count",
                        "ofa_count",
                    )
                ),
                memory_mib=_int(_text(mig, "fb_memory_usage/total")),
            )
            for mig in node.findall("mig_devices/mig_device")
        ]
        gpus.append(
            SmiGpu(
                bus_id=node.get("id", ""),
                product_name=_text(node, "product_name"),
                brand=_text(node, "product_brand"),
                architecture=_text(node, "product_architecture"),
                uuid=_text(node, "uuid"),
                minor=_text(node, "minor_number"),
                memory_mib=_text(node, "fb_memory_usage/total").replace(" MiB", ""),
                compute_mode=_text(node, "compute_mode"),
                numa_node=_text(node, "numa_node"),
                mig_mode=_text(node, "mig_mode/current_mig"),
                pci_device_id=_text(node, "pci/pci_device_id").upper(),
                mig_devices=_named(devices, list_text),
            )
        )
    return SmiLog(_text(root, "driver_version"), _text(root, "cuda_version"), tuple(gpus))


@dataclass
class _Entry:
    key: str
    value: str
    children: list[_Entry]

    def get(self, path: str) -> str:
        head, _, rest = path.partition("/")
        child = next((c for c in self.children if c.key == head), None)
        if child is None:
            return ""
        return child.get(rest) if rest else child.value

    def all(self, key: str) -> list[_Entry]:
        return [c for c in self.children if c.key == key]


def _outline(query_text: str) -> _Entry:
    """`nvidia-smi -q` as a tree: each "Key : value" line, nested by its indentation (4 spaces a level)."""
    root = _Entry("", "", [])
    stack: list[tuple[int, _Entry]] = [(-1, root)]
    for line in query_text.splitlines():
        if not line.strip() or line.lstrip().startswith("="):
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 4
        key, _, value = line.strip().partition(" : ")
        entry = _Entry(key.rstrip(" :").strip(), value.strip(), [])
        while stack[-1][0] >= depth:
            stack.pop()
        stack[-1][1].children.append(entry)
        stack.append((depth, entry))
    return root


def parse_query_text(query_text: str, list_text: str = "") -> SmiLog:
    """`nvidia-smi -q` (the text report) and optionally `nvidia-smi -L`, into the fields `-q -x` gives."""
    root = _outline(query_text)
    gpus = []
    for node in (c for c in root.children if c.key.startswith("GPU ") and not c.value):
        devices = [
            SmiMigDevice(
                index=_int(mig.get("Index")),
                gi_id=_int(mig.get("GPU Instance ID")),
                ci_id=_int(mig.get("Compute Instance ID")),
                multiprocessors=_int(mig.get("Device Attributes/Shared/Multiprocessor count")),
                engines=_engines(
                    _int(mig.get(f"Device Attributes/Shared/{name} count"))
                    for name in ("Copy Engine", "Decoder", "Encoder", "JPG", "OFA")
                ),
                memory_mib=_int(mig.get("Shared FB Memory Usage/Total") or mig.get("FB Memory Usage/Total")),
            )
            for mig in node.all("MIG Device")
        ]
        gpus.append(
            SmiGpu(
                bus_id=node.key.removeprefix("GPU ").strip(),
                product_name=node.get("Product Name"),
                brand=node.get("Product Brand"),
                architecture=node.get("Product Architecture"),
                uuid=node.get("GPU UUID"),
                minor=node.get("Minor Number"),
                memory_mib=node.get("FB Memory Usage/Total").replace(" MiB", ""),
                compute_mode=node.get("Compute Mode"),
                numa_node=node.get("NUMA Node ID"),
                mig_mode=node.get("MIG Mode/Current"),
                pci_device_id=node.get("PCI/Device Id").removeprefix("0x").upper(),
                mig_devices=_named(devices, list_text),
            )
        )
    return SmiLog(root.get("Driver Version"), root.get("CUDA Version"), tuple(gpus))


def compare(discovery: DiscoveryResult, smi_xml: str, placements_text: str = "") -> list[Check]:
    """Every comparable field, GPU by GPU (matched by PCI bus id). Pure: takes the tools' outputs as text."""
    smi = parse_xml(smi_xml)
    checks = [Check("-", "driver version", smi.driver_version, discovery.driver_version)]
    cuda = ".".join(map(str, discovery.cuda_driver_version))
    checks.append(Check("-", "CUDA version", smi.cuda_version, cuda))
    by_bus = {g.pci_bus_id: g for g in discovery.gpus}
    checks.append(
        Check("-", "GPU count", str(len(smi.gpus)), str(len(discovery.gpus) + len(discovery.errors)))
    )
    for error in discovery.errors:
        checks.append(Check(f"index {error.gpu_index}", "discovery", "ok", error.message))
    for smi_gpu in smi.gpus:
        bus = normalize_bus_id(smi_gpu.bus_id)
        gpu = by_bus.get(bus)
        if gpu is None:
            checks.append(Check(bus, "present in discovery", "yes", "no"))
            continue
        checks.extend(_gpu_checks(bus, smi_gpu, gpu))
    return checks + compare_placements(discovery, placements_text)


# Facts of one machine, not of the card: a capture from another machine differs in these and nothing else. The
# MIG mode is that machine's setting (the card's capability is compared as "MIG capable").
PER_MACHINE_FIELDS = frozenset(
    {"uuid", "minor number", "NUMA node", "driver version", "CUDA version", "MIG mode"}
)


def compare_card(discovery: DiscoveryResult, smi: str | SmiLog, placements_text: str = "") -> list[Check]:
    """A real card's captured nvidia-smi (`-q -x` as text, or an SmiLog from parse_xml/parse_query_text; and
    `mig -lgipp`) against the discovery of another machine with the same card, typically the simulated NVML of
    that card's profile: GPUs matched in order (the bus ids are each machine's own), the per-machine fields
    (PER_MACHINE_FIELDS) left out, and each captured MIG device checked against the discovered MIG profile it
    belongs to. Pure."""
    log = parse_xml(smi) if isinstance(smi, str) else smi
    gpus = sorted(discovery.gpus, key=lambda g: g.index)
    checks = [Check("-", "GPU count", str(len(log.gpus)), str(len(gpus)))]
    for smi_gpu, gpu in zip(log.gpus, gpus, strict=False):
        where = f"index {gpu.index}"
        checks += [c for c in _gpu_checks(where, smi_gpu, gpu) if c.field not in PER_MACHINE_FIELDS]
        for device in smi_gpu.mig_devices:
            checks += _mig_device_checks(where, device, gpu)
    return checks + compare_placements(discovery, placements_text)


def compare_placements(discovery: DiscoveryResult, placements_text: str) -> list[Check]:
    """`nvidia-smi mig -lgipp` (each profile's placement starts and size) against the discovered profiles of
    the GPU with the same index. Pure."""
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


@dataclass(frozen=True)
class LgipRow:
    """One GPU-instance profile as `nvidia-smi mig -lgip` prints it (numbers kept as printed)."""

    gpu: int
    name: str
    profile_id: int
    free: str
    total: str
    memory_gib: str  # "19.62"
    sms: str
    decoders: str
    encoders: str
    copy_engines: str
    jpeg_engines: str
    ofa_engines: str


def parse_lgip(lgip_text: str) -> list[LgipRow]:
    return [LgipRow(int(m[1]), m[2], int(m[3]), *m.groups()[3:]) for m in _LGIP.finditer(lgip_text)]


_LGIP_FIELDS = (
    "instances", "memory GiB", "SMs", "decoders", "encoders", "copy engines", "JPEG engines", "OFA engines"
)  # fmt: skip


def compare_profiles(discovery: DiscoveryResult, lgip_text: str) -> list[Check]:
    """`nvidia-smi mig -lgip` (GPU-instance profiles: name, total instances, memory, SMs, engines) against the
    discovered MIG profiles of the GPU with the same index. The memory is compared as nvidia-smi prints it, in
    GiB to two places; the free count is left out (it depends on what that machine had created). Pure."""
    checks: list[Check] = []
    for row in parse_lgip(lgip_text):
        where, label = f"index {row.gpu}", f"MIG profile {row.profile_id}"
        gpu = next((g for g in discovery.gpus if g.index == row.gpu), None)
        profile = (
            next((p for p in gpu.mig_profiles if p.gi_profile_id == row.profile_id), None) if gpu else None
        )
        if profile is None:
            checks.append(Check(where, f"{label} ({row.name})", "present", "missing"))
            continue
        checks.append(Check(where, f"{label} name", row.name, profile.name))
        seen = (row.total, row.memory_gib, row.sms, row.decoders, row.encoders, row.copy_engines,
                row.jpeg_engines, row.ofa_engines)  # fmt: skip
        discovered = (profile.max_instances, f"{profile.memory_mib / 1024:.2f}", profile.multiprocessors,
                      profile.decoders, profile.encoders, profile.copy_engines, profile.jpeg_engines,
                      profile.ofa_engines)  # fmt: skip
        for field, real, simulated in zip(_LGIP_FIELDS, seen, discovered, strict=True):
            checks.append(Check(where, f"{label} {field}", real, str(simulated)))
    return checks


def _gi_placement(gi_id: int) -> tuple[int, int]:
    """(start, size) of the GPU instance with this id, as the driver numbers them (the inverse of
    profiles.gpu_instance_id): 0 the whole GPU, 1-2 the halves, 3-6 the quarters, 7-14 the eighths."""
    if gi_id == 0:
        return 0, 8
    if gi_id <= 2:
        return (gi_id - 1) * 4, 4
    if gi_id <= 6:
        return (gi_id - 3) * 2, 2
    return gi_id - 7, 1


def _mig_device_checks(where: str, device: SmiMigDevice, gpu: GpuInfo) -> list[Check]:
    """A captured MIG device against the discovered profile of its GPU instance: the profile nvidia-smi -L
    named, or else the one whose memory slices (from the GPU-instance id) and SM count fit."""
    label = f"MIG device {device.index}"
    start, size = _gi_placement(device.gi_id)
    if device.profile:
        profile = next((p for p in gpu.mig_profiles if p.name == device.profile), None)
    else:
        fits = [
            p
            for p in gpu.mig_profiles
            if (p.memory_slices, p.multiprocessors) == (size, device.multiprocessors)
        ]
        # a plain profile rather than its "+me" twin of the same size and SMs: only -L tells them apart
        profile = min(fits, key=lambda p: "+" in p.name, default=None)
    wanted = device.profile or f"{size} memory slices, {device.multiprocessors} SMs"
    if profile is None:
        return [Check(where, f"{label} profile", wanted, "no such profile")]
    valid = [(p.start, p.size) for p in profile.placements]
    checks = [Check(where, f"{label} profile", device.profile, profile.name)] if device.profile else []
    checks += [
        Check(where, f"{label} GPU instance {device.gi_id} placement", f"{start}:{size}",
              f"{start}:{size}" if (start, size) in valid else f"not one of {valid}"),
        Check(where, f"{label} memory MiB", str(device.memory_mib), str(profile.memory_mib)),
    ]  # fmt: skip
    if not device.ci_slices:  # a compute instance of part of its GPU instance has only some of its SMs
        checks.append(Check(where, f"{label} SMs", str(device.multiprocessors), str(profile.multiprocessors)))
    engines = (
        profile.copy_engines,
        profile.decoders,
        profile.encoders,
        profile.jpeg_engines,
        profile.ofa_engines,
    )
    for name, seen, simulated in zip(_ENGINES, device.engines, engines, strict=True):
        checks.append(Check(where, f"{label} {name}", str(seen), str(simulated)))
    return checks


def _gpu_checks(bus: str, smi: SmiGpu, gpu: GpuInfo) -> list[Check]:
    checks = [
        Check(bus, "product name", smi.product_name, gpu.product_name),
        Check(bus, "uuid", smi.uuid, gpu.uuid),
        Check(bus, "minor number", smi.minor, str(gpu.minor)),
        Check(bus, "memory MiB", smi.memory_mib, str(gpu.memory_bytes // 2**20)),
        Check(bus, "brand", smi.brand.lower(), gpu.brand.lower()),
        Check(
            bus,
            "compute mode",
            smi.compute_mode,
            next((k for k, v in _COMPUTE_MODES.items() if v == gpu.compute_mode), "?"),
        ),
    ]
    if smi.architecture:
        checks.append(Check(bus, "architecture", smi.architecture, gpu.architecture))
    if smi.numa_node:
        numa = "N/A" if gpu.numa_node is None else str(gpu.numa_node)
        checks.append(Check(bus, "NUMA node", smi.numa_node, numa))
    if smi.mig_mode:
        mig = ("Enabled" if gpu.mig_enabled else "Disabled") if gpu.mig_capable else "N/A"
        checks.append(Check(bus, "MIG mode", smi.mig_mode, mig))
        capable = "no" if smi.mig_mode == "N/A" else "yes"
        checks.append(Check(bus, "MIG capable", capable, "yes" if gpu.mig_capable else "no"))
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
        mig = any(g.mig_enabled for g in discovery.gpus)  # both lists need a GPU in MIG mode
        placements = _run([smi, "mig", "-lgipp"]) if mig else ""
        profile_list = _run([smi, "mig", "-lgip"]) if mig else ""
        hardware.close()
    except HardwareError as err:
        print(f"compare_nvidia_smi: {err}", file=sys.stderr)
        return 2
    finally:
        if temp:
            shutil.rmtree(temp, ignore_errors=True)
    checks = compare(discovery, xml_text, placements) + compare_profiles(discovery, profile_list)
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
