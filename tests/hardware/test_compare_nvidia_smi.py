"""The discovery-vs-nvidia-smi comparison (dra_gpu/hardware/compare_nvidia_smi.py).

Two kinds of test, kept apart because they prove different things:
- the tool itself: the simulated NVML against the simulated nvidia-smi. Both are made from the same profile
  data, so agreement there proves the tool parses nvidia-smi's XML and placements and matches GPUs, and that
  the two simulated views are consistent, not that either is faithful to a real card;
- fidelity: real cards' nvidia-smi output kept as test data in tests/hardware/data/real/<card>/<capture>/,
  against the simulated NVML of that card's profile, per-machine fields (UUID, bus id, minor, NUMA node,
  driver and CUDA version, the MIG mode that machine was set to) left out. Each capture's _source.md says
  where it was taken (a public repository's file at a commit) and which driver it shows: an A100-SXM4-40GB
  with two 3g.20gb MIG devices (`nvidia-smi -q -x`, driver 510.47.03), an H100 80GB HBM3 and an H200 each
  with MIG off and with MIG devices (`nvidia-smi -q` and `-L`, 590.48.01), an L40S (`-q`, 595.80), a GH200's
  MIG profile list (`mig -lgip`, 550.54.15). A capture that e2e/real_gpu/run_checks.sh takes on a lent GPU
  goes beside them and is compared the same way. Beyond NVML: the simulated `nvidia-smi -L`, `mig -lgip` and
  `mig -cgi ... -C` against what the real tools printed (those captures, and the creation sequences NVIDIA's
  MIG User Guide and others published), the SMs of compute instances of part of a GPU instance.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from dra_gpu.hardware.compare_nvidia_smi import (
    Check,
    SmiLog,
    compare,
    compare_card,
    compare_placements,
    compare_profiles,
    parse_lgip,
    parse_query_text,
    parse_xml,
)
from dra_gpu.hardware.loader import open_hardware
from dra_gpu.hardware.profiles import GPU_PROFILES, GpuProfile
from dra_gpu.hardware.types import DiscoveryResult

REPO = Path(__file__).resolve().parents[2]
REAL_CAPTURES = Path(__file__).resolve().parent / "data" / "real"
CAPTURE_XML = "nvidia-smi-q-x.xml"  # the names e2e/real_gpu/run_checks.sh gives the captured files
CAPTURE_QUERY = "nvidia-smi-q.txt"
CAPTURE_LGIP = "nvidia-smi-mig-lgip.txt"
CAPTURE_LGIPP = "nvidia-smi-mig-lgipp.txt"
CAPTURE_LIST = "nvidia-smi-L.txt"  # only in the public captures: run_checks.sh does not take it
GH200_LOG = REAL_CAPTURES / "nvidia-gh200-96gb-hbm3" / "cuanschutz-slurm-mig-log"


@pytest.mark.parametrize(("hardware", "fields"), [("dgx-h100", 83), ("dual-gh200", 23)])
def test_the_tool_parses_the_simulated_nvidia_smi(hardware: str, fields: int) -> None:
    """The comparison tool on the simulator's own nvidia-smi: it reads every field and matches every GPU
    (dual-gh200: two GPUs at 01:00.0 of PCI domains 0009 and 0019, matched by their whole address). Both
    sides come from the same profile data: this is no evidence of fidelity to a real card."""
    done = subprocess.run(
        [sys.executable, "-m", "dra_gpu.hardware.compare_nvidia_smi", "--hardware", hardware],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{fields}/{fields} fields agree" in done.stdout


def test_differences_are_reported_field_by_field() -> None:
    root = tempfile.mkdtemp(prefix="cmp-", dir="/tmp")
    try:
        hardware = open_hardware("h100-80gb", root)
        discovery = hardware.discover()
        xml = subprocess.run(
            [f"{root}/usr/bin/nvidia-smi", "-q", "-x"], capture_output=True, text=True, check=True
        ).stdout
    finally:
        shutil.rmtree(root, ignore_errors=True)
    edited = xml.replace("81559 MiB", "81920 MiB").replace("<minor_number>0<", "<minor_number>4<")
    bad = [c for c in compare(discovery, edited) if not c.ok]
    assert [(c.field, c.nvidia_smi, c.discovered) for c in bad] == [
        ("minor number", "4", "0"),
        ("memory MiB", "81920", "81559"),
    ]
    placements = "GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5}:1\n"
    assert [c.field for c in compare(discovery, xml, placements) if not c.ok] == ["MIG profile 19 placements"]


def _simulated(profile: str) -> tuple[DiscoveryResult, str]:
    """The discovery and the `nvidia-smi -q -x` of a simulated node with one GPU of `profile`."""
    root = tempfile.mkdtemp(prefix="cmp-", dir="/tmp")
    try:
        hardware = open_hardware(profile, root)
        discovery = hardware.discover()
        xml = subprocess.run(
            [f"{root}/usr/bin/nvidia-smi", "-q", "-x"], capture_output=True, text=True, check=True
        ).stdout
        hardware.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return discovery, xml


def test_a_capture_from_another_machine_differs_only_in_per_machine_fields() -> None:
    """compare_card leaves out what belongs to the machine, not the card, and still reports the card's own
    facts (here a memory size the simulator would have wrong)."""
    discovery, xml = _simulated("h100-80gb")
    other_machine = (
        re.sub(r"<uuid>[^<]+</uuid>", "<uuid>GPU-00000000-1111-2222-3333-444444444444</uuid>", xml)
        .replace("<minor_number>0<", "<minor_number>3<")
        .replace(f"<driver_version>{discovery.driver_version}<", "<driver_version>580.159.04<")
    )
    other_machine = re.sub(r'<gpu id="[^"]+">', '<gpu id="00000000:9A:00.0">', other_machine)
    assert [c for c in compare(discovery, other_machine) if not c.ok]  # the plain comparison sees them
    assert [c for c in compare_card(discovery, other_machine) if not c.ok] == []
    wrong_memory = other_machine.replace("81559 MiB", "81920 MiB")
    bad = [(c.field, c.nvidia_smi, c.discovered) for c in compare_card(discovery, wrong_memory) if not c.ok]
    assert bad == [("memory MiB", "81920", "81559")]


def _captures() -> list[Path]:
    """Every folder under data/real/ that holds a capture: <card>/<capture>/ (or <card>/ as run_checks.sh
    saves it)."""
    names = (CAPTURE_XML, CAPTURE_QUERY, CAPTURE_LGIP)
    return sorted({p.parent for name in names for p in REAL_CAPTURES.rglob(name)})


def _card(capture: Path) -> str:
    return capture.relative_to(REAL_CAPTURES).parts[0]


def _folder_name(product_name: str) -> str:
    """The folder e2e/real_gpu/run_checks.sh saves a card's captures in: "NVIDIA H100 80GB HBM3" ->
    "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", product_name.lower()).strip("-")


def _profile_of(card: str) -> GpuProfile:
    found = [p for p in GPU_PROFILES.values() if _folder_name(p.product_name) == card]
    assert found, f"no simulator profile for the captured card {card!r} (dra_gpu/hardware/profiles.py)"
    return found[0]


def _read_capture(capture: Path) -> SmiLog | None:
    """The capture's `nvidia-smi -q` as the comparison reads it: the XML where there is one, else the text
    report, with the MIG devices' profile names from `nvidia-smi -L` where it was captured; None where the
    capture has only `mig` lists."""
    listed = capture / CAPTURE_LIST
    list_text = listed.read_text() if listed.exists() else ""
    if (capture / CAPTURE_XML).exists():
        return parse_xml((capture / CAPTURE_XML).read_text(), list_text)
    if (capture / CAPTURE_QUERY).exists():
        return parse_query_text((capture / CAPTURE_QUERY).read_text(), list_text)
    return None


def _optional(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _card_checks(capture: Path, discovery: DiscoveryResult | None = None) -> list[Check]:
    profile = _profile_of(_card(capture))
    if discovery is None:
        discovery, _ = _simulated(profile.key)
    checks = compare_profiles(discovery, _optional(capture / CAPTURE_LGIP))
    log = _read_capture(capture)
    if log is None:
        return checks + compare_placements(discovery, _optional(capture / CAPTURE_LGIPP))
    checks += compare_card(discovery, log, _optional(capture / CAPTURE_LGIPP))
    # what the profile holds beyond the discovery: the PCI device id NVML and sysfs report
    for index, gpu in enumerate(log.gpus):
        checks.append(
            Check(f"index {index}", "PCI device id", gpu.pci_device_id, f"{profile.pci_device_id:08X}")
        )
    return checks


def test_real_captures_are_committed_with_their_source() -> None:
    """The fidelity test runs on data, not on nothing: the captures are there, each with a _source.md that
    names where it came from and the driver version it shows."""
    captures = _captures()
    assert {_card(c) for c in captures} >= {
        "nvidia-a100-sxm4-40gb",
        "nvidia-h100-80gb-hbm3",
        "nvidia-h200",
        "nvidia-gh200-96gb-hbm3",
        "nvidia-l40s",
    }
    for capture in captures:
        source = capture / "_source.md"
        assert source.exists(), f"{capture} has no _source.md saying where it was taken"
        log = _read_capture(capture)
        assert re.search(r"driver \d+\.\d+", source.read_text()), f"{source} names no driver version"
        assert log is None or log.driver_version in source.read_text(), source


@pytest.mark.parametrize("capture", _captures(), ids=lambda p: str(p.relative_to(REAL_CAPTURES)))
def test_the_simulated_card_agrees_with_a_real_capture(capture: Path) -> None:
    """Fidelity: what a real card's nvidia-smi said against the simulated NVML of the same card profile: name,
    brand, architecture, memory, compute mode, MIG capability, PCI device id; for each MIG device its profile,
    the placement its GPU-instance id stands for, memory, SMs and engines; for each MIG profile that
    `mig -lgip` lists its name, instance count, memory, SMs and engines."""
    log = _read_capture(capture)
    if log is not None:
        assert [_folder_name(g.product_name) for g in log.gpus] == [_card(capture)]
    checks = _card_checks(capture)
    bad = [c for c in checks if not c.ok]
    assert not bad, "\n".join(
        f"{c.gpu} {c.field}: real {c.nvidia_smi!r}, simulated {c.discovered!r}" for c in bad
    )
    assert len(checks) >= 8


def _with_profile(discovery: DiscoveryResult, name: str, **changes: Any) -> DiscoveryResult:
    """The discovery with one MIG profile of its (one) GPU changed, as a simulator with that number wrong
    would discover it."""
    gpu = discovery.gpus[0]
    profiles = tuple(dataclasses.replace(p, **changes) if p.name == name else p for p in gpu.mig_profiles)
    return dataclasses.replace(discovery, gpus=(dataclasses.replace(gpu, mig_profiles=profiles),))


def test_a_simulator_that_diverges_from_a_real_card_fails() -> None:
    """The fidelity comparison on real captures catches a wrong profile number: the H100's 2g.20gb memory as
    the simulator had it before a real card was measured (20091 MiB; NVML says 20096), an L40S memory size
    1 MiB off, a 3g.20gb of an A100 with the wrong SM count (no profile of its size has 40 SMs), a GH200
    2g.24gb with 2 SMs too few and a second 1g.12gb+me allowed."""
    discovery, _ = _simulated("h100-80gb")
    h100_mig = REAL_CAPTURES / "nvidia-h100-80gb-hbm3" / "nvidia-gpu-exporter-mig-590.48.01"
    checks = _card_checks(h100_mig, _with_profile(discovery, "2g.20gb", memory_mib=20091))
    assert [(c.field, c.nvidia_smi, c.discovered) for c in checks if not c.ok] == [
        ("MIG device 1 memory MiB", "20096", "20091")
    ]

    discovery, _ = _simulated("l40s")
    smaller = dataclasses.replace(
        discovery, gpus=(dataclasses.replace(discovery.gpus[0], memory_bytes=46067 << 20),)
    )
    checks = _card_checks(REAL_CAPTURES / "nvidia-l40s" / "nvidia-gpu-exporter-595.80", smaller)
    assert [(c.field, c.nvidia_smi, c.discovered) for c in checks if not c.ok] == [
        ("memory MiB", "46068", "46067")
    ]

    discovery, _ = _simulated("a100-40gb")
    a100 = REAL_CAPTURES / "nvidia-a100-sxm4-40gb" / "netdata-510.47.03"
    checks = _card_checks(a100, _with_profile(discovery, "3g.20gb", multiprocessors=40))
    assert [(c.field, c.discovered) for c in checks if not c.ok] == [
        ("MIG device 0 profile", "no such profile"),
        ("MIG device 1 profile", "no such profile"),
    ]

    discovery, _ = _simulated("gh200-96gb")
    wrong = _with_profile(
        _with_profile(discovery, "2g.24gb", multiprocessors=30),
        "1g.12gb+me",
        max_instances=7,
    )
    checks = _card_checks(GH200_LOG, wrong)
    assert [(c.field, c.nvidia_smi, c.discovered) for c in checks if not c.ok] == [
        ("MIG profile 20 instances", "1", "7"),
        ("MIG profile 14 SMs", "32", "30"),
    ]


def test_lgipp_is_read_in_both_of_its_forms() -> None:
    """Real `mig -lgipp` prints "Placement :" (singular) for a profile with one start, as the MIG User Guide
    shows; both forms are compared, so a wrong 4g or 7g placement is not passed over."""
    discovery, _ = _simulated("h100-80gb")
    text = (
        "GPU  0 Profile ID  9 Placements: {0,4}:4\n"
        "GPU  0 Profile ID  5 Placement : {0}:4\n"
        "GPU  0 Profile ID  0 Placement : {0}:8\n"
    )
    checks = compare(discovery, "<nvidia_smi_log/>", text)
    placements = [(c.field, c.nvidia_smi, c.discovered) for c in checks if "placements" in c.field]
    assert placements == [
        ("MIG profile 0 placements", "[0]:8", "[0]:8"),
        ("MIG profile 5 placements", "[0]:4", "[0]:4"),
        ("MIG profile 9 placements", "[0, 4]:4", "[0, 4]:4"),
    ]
    wrong = text.replace("{0}:8", "{0}:7")
    assert [
        c.field
        for c in compare(discovery, "<nvidia_smi_log/>", wrong)
        if not c.ok and "placements" in c.field
    ] == ["MIG profile 0 placements"]


def test_compute_instances_of_part_of_a_gpu_instance_get_the_real_sm_counts(tmp_path: Path) -> None:
    """The H200 capture's 1c.3g.71gb and 2c.3g.71gb MIG devices, compute instances of one 3g.71gb GPU
    instance, have 16 and 32 SMs; the simulated NVML's compute-instance profiles of a 3g.71gb must say the
    same."""
    capture = REAL_CAPTURES / "nvidia-h200" / "nvidia-gpu-exporter-mig-590.48.01"
    log = _read_capture(capture)
    assert log is not None
    real = {d.ci_slices: d.multiprocessors for d in log.gpus[0].mig_devices if d.ci_slices}
    assert real == {1: 16, 2: 32}
    hardware = open_hardware("h200-141gb", str(tmp_path / "root"))
    try:
        uuid = hardware.discover().gpus[0].uuid
        hardware.set_mig_mode(uuid, True)
        device = hardware.create_mig_device(uuid, 9, 4)  # 3g.71gb at 4:4, GPU instance 2 as in the capture
        nvml = hardware._nvml
        gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(nvml.nvmlDeviceGetHandleByIndex(0), device.gi_id)
        shared = nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        simulated = {
            slices: nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gpu_instance, ci_profile, shared
            ).multiprocessorCount
            for slices, ci_profile in ((1, 0), (2, 1))
        }
    finally:
        hardware.close()
    assert device.gi_id == 2
    assert simulated == real


def test_an_a100_compute_instance_of_part_of_a_gpu_instance_has_a_plain_profiles_sms(tmp_path: Path) -> None:
    """The MIG User Guide's `nvidia-smi mig -lcip -gi 1` on an A100-SXM4-40GB 3g.20gb: 1c.3g.20gb 14 SMs,
    2c.3g.20gb 28, 3g.20gb 42, and the names."""
    root = tmp_path / "root"
    _simulated_nvidia_smi("a100-40gb", root)
    hardware = open_hardware("a100-40gb", str(root))
    try:
        assert hardware.discover().gpus[0].mig_enabled
        nvml = hardware._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        gpu_instance = nvml.nvmlDeviceCreateGpuInstance(handle, 9)
        shared = nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        infos = [
            nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gpu_instance, p, shared) for p in (0, 1, 2)
        ]
    finally:
        hardware.close()
    assert [(i.name, i.multiprocessorCount) for i in infos] == [
        ("MIG 1c.3g.20gb", 14),
        ("MIG 2c.3g.20gb", 28),
        ("MIG 3g.20gb", 42),
    ]


def _simulated_nvidia_smi(profile: str, root: Path, *commands: list[str]) -> list[str]:
    """The simulated `nvidia-smi`'s output for each command, on a fresh node of one `profile` GPU in MIG
    mode."""
    open_hardware(profile, str(root)).close()
    smi = str(root / "usr/bin/nvidia-smi")
    for step in (["-i", "0", "-mig", "1"], ["-i", "0", "-r"]):  # an A100 takes the MIG mode at a reset
        subprocess.run([smi, *step], capture_output=True, text=True, check=True)
    return [subprocess.run([smi, *argv], capture_output=True, text=True).stdout for argv in commands]


def test_the_simulated_mig_profile_list_reads_as_the_real_one(tmp_path: Path) -> None:
    """Anything that reads the real `nvidia-smi mig -lgip` table (the fidelity test above, an operator's
    script) must read the simulated one the same way: on a fresh GH200 in MIG mode, the same rows as the real
    GH200 printed."""
    real = parse_lgip((GH200_LOG / CAPTURE_LGIP).read_text())
    assert len(real) == 7
    (simulated,) = _simulated_nvidia_smi("gh200-96gb", tmp_path / "root", ["mig", "-lgip"])
    assert parse_lgip(simulated) == real
    assert simulated == (GH200_LOG / CAPTURE_LGIP).read_text()  # column for column, as driver 550.54.15


def test_the_simulated_mig_device_list_reads_as_the_real_one(tmp_path: Path) -> None:
    """`nvidia-smi -L` on the H200 capture's MIG layout (a 3g.71gb at 4:4 split into 1c and 2c compute
    instances, a 2g.35gb at 0:2, two 1g.18gb at 2:1 and 3:1) reads as the real one, UUIDs aside: the profile
    names, "1c."/"2c." included, in the same columns, the devices in the same order."""
    real = (REAL_CAPTURES / "nvidia-h200" / "nvidia-gpu-exporter-mig-590.48.01" / CAPTURE_LIST).read_text()
    root = tmp_path / "root"
    hardware = open_hardware("h200-141gb", str(root))
    try:
        uuid = hardware.discover().gpus[0].uuid
        hardware.set_mig_mode(uuid, True)
        for profile_id, start in ((14, 0), (19, 2), (19, 3)):
            hardware.create_mig_device(uuid, profile_id, start)
        nvml = hardware._nvml
        placement = nvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = 4, 4
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        gpu_instance = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 9, placement)
        for ci_profile in (0, 1):  # 1 slice, then 2
            nvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, ci_profile)
    finally:
        hardware.close()
    listed = subprocess.run([str(root / "usr/bin/nvidia-smi"), "-L"], capture_output=True, text=True).stdout

    def masked(text: str) -> list[str]:
        return [re.sub(r"UUID: [^)]+", "UUID: ...", line) for line in text.splitlines()]

    assert masked(listed) == masked(real)


# `nvidia-smi mig -cgi` on an empty GPU as published, and the GPU-instance ids the real driver gave, in order
# (the observations profiles.default_placement_order models): NVIDIA's MIG User Guide ("Instance Geometry",
# an A100-SXM4-40GB), a public nvidia-smi usage note (an H100 80GB HBM3), a Microsoft Tech Community post of
# 2024-08 (an A100 80GB), the GH200 capture above (driver 550.54.15). None is first fit.
PUBLISHED_CREATIONS = [
    ("a100-40gb", "19,14,5", [13, 5, 1]),
    ("a100-40gb", "9,19,14,19", [2, 7, 4, 8]),
    ("a100-40gb", "14,19,19,19,19,19", [5, 13, 7, 8, 9, 10]),
    ("a100-40gb", "9,9", [2, 1]),
    ("h100-80gb", "19,19,19,19,19,19,19", [13, 11, 12, 7, 8, 9, 10]),
    ("a100-80gb", "14,14,14,20", [5, 3, 4, 13]),
    ("gh200-96gb", "15,15,15", [5, 3, 4]),
]


@pytest.mark.parametrize(("profile", "wanted", "gi_ids"), PUBLISHED_CREATIONS)
def test_gpu_instances_land_where_the_real_driver_put_them(
    tmp_path: Path, profile: str, wanted: str, gi_ids: list[int]
) -> None:
    (created,) = _simulated_nvidia_smi(profile, tmp_path / "root", ["mig", "-cgi", wanted, "-C"])
    assert [int(m) for m in re.findall(r"created GPU instance ID +(\d+)", created)] == gi_ids


def test_the_placement_the_mig_user_guide_warns_about_fails_as_on_hardware(tmp_path: Path) -> None:
    """The MIG User Guide's "known issue": `-cgi 19,19,14,9` on an A100 puts the 1g.5gb at 6:1 and 4:1 and
    the 2g.10gb at 0:2, leaving no 4:4 or 0:4 for the 3g.20gb: Insufficient Resources. An expectation that
    sets up MIG with the 3g.20gb last would pass on the simulator and fail on a real A100."""
    root = tmp_path / "root"
    _simulated_nvidia_smi("a100-40gb", root, [])
    done = subprocess.run(
        [str(root / "usr/bin/nvidia-smi"), "mig", "-cgi", "19,19,14,9"], capture_output=True, text=True
    )
    assert [int(m) for m in re.findall(r"created GPU instance ID +(\d+)", done.stdout)] == [13, 11, 3]
    assert done.returncode != 0
    assert "Unable to create a GPU instance on GPU  0 using profile 9: Insufficient Resources" in done.stderr


def test_the_compute_instance_of_a_media_extension_instance_is_named_without_me(tmp_path: Path) -> None:
    """Real `-cgi 14,14,14,20 -C` on an A100 80GB (Microsoft Tech Community, 2024-08): the 1g.10gb+me GPU
    instance's compute instance is "MIG 1g.10gb (ID  0)"."""
    (created,) = _simulated_nvidia_smi("a100-80gb", tmp_path / "root", ["mig", "-cgi", "14,14,14,20", "-C"])
    assert created.splitlines()[-1] == (
        "Successfully created compute instance ID  0 on GPU  0 GPU instance ID 13 using profile MIG 1g.10gb "
        "(ID  0)"
    )


def test_the_simulated_mig_create_places_instances_as_the_real_driver(tmp_path: Path) -> None:
    """Where a GPU instance lands decides which profiles still fit next to it, so the simulated
    `nvidia-smi mig -cgi 15,15,15 -C` on a fresh GH200 must say what the real one said: the same GPU-instance
    ids in the same order, the same compute-instance profile."""
    real = (GH200_LOG / "nvidia-smi-mig-cgi-15-15-15-C.txt").read_text()
    (simulated,) = _simulated_nvidia_smi("gh200-96gb", tmp_path / "root", ["mig", "-cgi", "15,15,15", "-C"])
    assert simulated == real
