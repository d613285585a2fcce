"""The simulated nodes a soak runs on, and the ResourceSlices the plugin would publish for them (built with
the plugin's own model code from the same simulated hardware), so that the soak allocates claims as the
scheduler would without the plugin publishing anything."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_gpu.hardware.loader import open_hardware
from dra_gpu.hardware.sim_driver_root import state_path
from dra_gpu.hardware.simulator.state import StateStore
from dra_gpu.inventory.consumable_shares import parse_consumable_shares
from dra_gpu.inventory.device_model import ModelOptions, build_device_model
from dra_gpu.slices.slice_builder import build_slices
from tests.plugin.plugin_harness import SimNode

KUBERNETES_VERSION = (1, 35)


@dataclass(frozen=True)
class Profile:
    name: str
    hardware: str
    consumable_shares: str = "disabled"  # the plugin's CONSUMABLE_SHARES
    mig_enabled_gpus: tuple[int, ...] = ()  # GPUs an administrator put in MIG mode before the plugin started
    kinds: tuple[str, ...] = ()  # the claim kinds (claim_kinds.KINDS) this node can serve
    env: Mapping[str, str] = field(default_factory=dict)

    def plugin_env(self) -> dict[str, str]:
        return {"CONSUMABLE_SHARES": self.consumable_shares, **self.env}


PROFILES = {
    # Hopper: MIG devices made on demand on any GPU, exclusive whole GPUs, fractional shares.
    "dgx-h100": Profile(
        "dgx-h100",
        "dgx-h100",
        kinds=(
            "whole",
            "time-slicing",
            "mps",
            "mig",
            "mig-mps",
            "fraction",
            "admin",
            "mixed",
        ),
    ),
    # Ampere: MIG only where the mode was enabled (GPUs 0-3), and NVIDIA's consumable shares (at most 4
    # claims per whole GPU) on the others.
    "dgx-a100": Profile(
        "dgx-a100",
        "dgx-a100",
        consumable_shares="4",
        mig_enabled_gpus=(0, 1, 2, 3),
        kinds=("consumable", "consumable-mps", "consumable-memory", "mig", "mig-mps", "fraction", "admin"),
    ),
}


def prepare_node(profile: Profile, node: SimNode) -> None:
    """Put the node's simulated GPUs in the state the profile starts from (MIG mode enabled on some)."""
    if not profile.mig_enabled_gpus:
        return
    with StateStore(state_path(node.driver_root)).transaction() as state:
        for index in profile.mig_enabled_gpus:
            state.gpus[index].mig_current = True
            state.gpus[index].mig_pending = True


def node_slices(profile: Profile, node: SimNode) -> list[dict[str, Any]]:
    """The ResourceSlices of the node as the plugin publishes them (same discovery, same model options)."""
    discovery = open_hardware(node.hardware, str(node.driver_root), seed=node.name).discover()
    options = ModelOptions(consumable_shares=parse_consumable_shares(profile.consumable_shares))
    return build_slices(build_device_model(discovery, options), node.name, KUBERNETES_VERSION)
