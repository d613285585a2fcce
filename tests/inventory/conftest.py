"""`discovery`: a simulated DGX H100's discovery, made once per module (the consumable-shares tests)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_gpu.hardware.loader import open_hardware
from dra_gpu.hardware.types import DiscoveryResult


@pytest.fixture(scope="module")
def discovery() -> Iterator[DiscoveryResult]:
    root = Path(tempfile.mkdtemp(prefix="shares-", dir="/tmp"))
    try:
        yield open_hardware("dgx-h100", str(root)).discover()
    finally:
        shutil.rmtree(root, ignore_errors=True)
