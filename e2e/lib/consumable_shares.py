"""Restart the host-process kubelet plugin with another `--consumable-shares` mode (env CONSUMABLE_SHARES) and
wait until every whole GPU of the node is published accordingly. One plugin serves one mode, so the tests of
NVIDIA's consumable-shares examples switch modes around each example and switch back afterwards."""

from __future__ import annotations

from e2e.lib.driver import HostDriver
from e2e.lib.waiting import wait_until


def slices_follow(driver: HostDriver, shared: bool) -> bool:
    """Every whole GPU of the node published as --consumable-shares says (the slices are updated one by one,
    so one GPU alone could be ahead of the others)."""
    gpus = [
        d
        for s in driver.slices()
        for d in s["spec"].get("devices") or []
        if d.get("attributes", {}).get("type", {}).get("string") == "gpu"
    ]
    return bool(gpus) and all(bool(d.get("allowMultipleAllocations")) == shared for d in gpus)


def restart_with_shares(driver: HostDriver, shares: str) -> None:
    """`shares`: disabled, memory, unlimited or a positive integer (NVIDIA's values)."""
    driver.stop_plugin()
    driver.start_plugin(env={"CONSUMABLE_SHARES": shares})
    driver.wait_plugin_ready()
    wait_until(
        lambda: slices_follow(driver, shares != "disabled") or None,
        timeout_s=90,
        what=f"the slices to follow --consumable-shares={shares}",
        explain=driver.log_tail,
    )
