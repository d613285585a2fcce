"""The discovery-vs-nvidia-smi comparison (dra_gpu/hardware/compare_nvidia_smi.py).

Two kinds of test, kept apart because they prove different things:
- the tool itself: the simulated NVML against the simulated nvidia-smi. Both are made from the same profile
  data, so agreement there proves the tool parses nvidia-smi's XML and placements and matches GPUs, and that
  the two simulated views are consistent, not that either is faithful to a real card;
- fidelity: a real card's nvidia-smi, captured on a lent GPU by e2e/real_gpu/run_checks.sh into
  tests/hardware/data/real/<card>/, against the simulated NVML of that card's profile, per-machine fields
  (UUID, bus id, minor, NUMA node, driver and CUDA version) left out. Skipped while no capture is committed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dra_gpu.hardware.compare_nvidia_smi import compare, compare_card
from dra_gpu.hardware.loader import open_hardware
from dra_gpu.hardware.profiles import GPU_PROFILES
from dra_gpu.hardware.types import DiscoveryResult

REPO = Path(__file__).resolve().parents[2]
REAL_CAPTURES = Path(__file__).resolve().parent / "data" / "real"
CAPTURE_XML = "nvidia-smi-q-x.xml"  # the names e2e/real_gpu/run_checks.sh gives the captured files
CAPTURE_LGIPP = "nvidia-smi-mig-lgipp.txt"


@pytest.mark.parametrize(("hardware", "fields"), [("dgx-h100", 75), ("dual-gh200", 21)])
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
    return sorted(p.parent for p in REAL_CAPTURES.glob(f"*/{CAPTURE_XML}"))


def _profile_of(product_name: str) -> str:
    found = [key for key, profile in GPU_PROFILES.items() if profile.product_name == product_name]
    assert found, (
        f"no simulator profile for the captured card {product_name!r} (dra_gpu/hardware/profiles.py)"
    )
    return found[0]


@pytest.mark.parametrize("capture", _captures() or [None], ids=lambda p: p.name if p else "none")
def test_the_simulated_card_agrees_with_a_real_capture(capture: Path | None) -> None:
    """Fidelity: what a real card's nvidia-smi said (captured read-only on a lent GPU) against the simulated
    NVML of the same card profile."""
    if capture is None:
        pytest.skip(
            "no real nvidia-smi capture in tests/hardware/data/real/ yet: e2e/real_gpu/run_checks.sh saves "
            "them on the next lent GPU (see e2e/real_gpu/README.md)"
        )
    xml = (capture / CAPTURE_XML).read_text()
    lgipp = capture / CAPTURE_LGIPP
    product = ET.fromstring(xml).findtext("gpu/product_name", "").strip()
    discovery, _ = _simulated(_profile_of(product))
    checks = compare_card(discovery, xml, lgipp.read_text() if lgipp.exists() else "")
    bad = [c for c in checks if not c.ok]
    assert not bad, "\n".join(
        f"{c.gpu} {c.field}: real {c.nvidia_smi!r}, simulated {c.discovered!r}" for c in bad
    )
