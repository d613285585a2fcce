"""`--hardware simulated` (chart `hardware: simulated`): serve what a prepared simulated driver root holds.

One DaemonSet then covers test nodes with different simulated hardware (the kind cluster's DGX H100 and L40S
nodes), as one DaemonSet covers different real GPUs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_gpu.hardware.interface import HardwareError
from dra_gpu.hardware.loader import PREPARED_SIMULATOR, known_hardware, open_hardware
from dra_gpu.hardware.sim_driver_root import init_sim_driver_root


@pytest.mark.parametrize("layout, gpus, product", [("dgx-h100", 8, "H100"), ("pcie-4x-l40s", 4, "L40S")])
def test_serves_the_layout_the_root_was_made_with(
    tmp_path: Path, layout: str, gpus: int, product: str
) -> None:
    init_sim_driver_root(tmp_path, layout, seed="node-a")
    hardware = open_hardware(PREPARED_SIMULATOR, str(tmp_path))
    try:
        discovered = hardware.discover()
    finally:
        hardware.close()
    assert len(discovered.gpus) == gpus
    assert all(product in g.product_name for g in discovered.gpus)
    # The root keeps its identity: the same UUIDs as a second open by profile name with the same seed.
    again = open_hardware(layout, str(tmp_path))
    try:
        assert [g.uuid for g in again.discover().gpus] == [g.uuid for g in discovered.gpus]
    finally:
        again.close()


def test_an_unprepared_root_is_an_error_that_says_how_to_prepare_it(tmp_path: Path) -> None:
    with pytest.raises(HardwareError) as err:
        open_hardware(PREPARED_SIMULATOR, str(tmp_path))
    message = str(err.value)
    assert "dra-gpu hardware init-sim --hardware <profile>" in message
    assert str(tmp_path) in message and "dgx-h100" in message
    assert not any(tmp_path.iterdir()), "nothing may be written into a root that holds no simulated GPUs"


def test_simulated_is_a_known_hardware_name() -> None:
    assert PREPARED_SIMULATOR in known_hardware()
