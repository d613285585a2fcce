"""The discovery-vs-nvidia-smi fidelity check: agrees on the simulator, reports each difference."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dra_gpu.hardware.compare_nvidia_smi import compare
from dra_gpu.hardware.loader import open_hardware

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("hardware", "fields"), [("dgx-h100", 75), ("dual-gh200", 21)])
def test_simulator_agrees_with_its_nvidia_smi(hardware: str, fields: int) -> None:
    """dual-gh200: two GPUs at 01:00.0 of PCI domains 0009 and 0019, matched by their whole address."""
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
