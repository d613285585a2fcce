"""Run the host-process kubelet plugin on another simulated node for a while: a fresh driver root of another
hardware layout, prepared out of band as an admin would (`nvidia-smi` steps: MIG mode, a mig-parted layout),
then the node's own plugin again.

NVIDIA's quickstart gpu-test4 is written for A100s with MIG mode on and a mig-parted layout applied (its
README), extended-resources/mig-1g-12gb for two GH200s with seven 1g.12gb each; the suite's node is a DGX
H100. One node, one plugin: the plugin is restarted on the other root, the pool is published anew (the
scheduler sees the other hardware), and afterwards the original plugin (its recorded command line) publishes
the node's own devices again. Host mode only: a DaemonSet's pods cannot switch hardware.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from dra_gpu.hardware import profiles
from e2e.lib.driver import FAULT_ENV, PLUGIN, HostDriver
from e2e.lib.waiting import wait_until


def published_products(driver: HostDriver) -> set[str]:
    """productName of every GPU and MIG device in the newest complete generation of the node's pool (a GPU
    whose MIG devices were made out of band is published through those alone: its whole-GPU device is
    withheld)."""
    slices = driver.wait_slices()
    return {
        str(((d.get("attributes") or {}).get("productName") or {}).get("string"))
        for s in slices
        for d in s["spec"].get("devices") or []
        if ((d.get("attributes") or {}).get("type") or {}).get("string") in ("gpu", "mig")
    }


def wait_published(driver: HostDriver, hardware: str) -> None:
    """Until the node's pool shows exactly the GPUs of `hardware` (a layout of `dra-gpu hardware list`)."""
    want = {slot.profile.product_name for slot in profiles.resolve_layout(hardware).slots}
    wait_until(
        lambda: published_products(driver) == want or None,
        timeout_s=90,
        what=f"the node's ResourceSlices to show the GPUs of {hardware} ({sorted(want)})",
        explain=driver.log_tail,
    )


def run_nvidia_smi(driver_root: Path, steps: Sequence[str]) -> None:
    """Each step's arguments to the simulated root's nvidia-smi, in order; a failing step stops the test."""
    smi = driver_root / "usr" / "bin" / "nvidia-smi"
    for step in steps:
        done = subprocess.run(
            [str(smi), *shlex.split(step)], capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"`nvidia-smi {step}` on {driver_root} failed: {done.stderr}")


@contextlib.contextmanager
def plugin_on_hardware(driver: HostDriver, hardware: str, nvidia_smi: Sequence[str]) -> Iterator[HostDriver]:
    """The host plugin serving a fresh simulated `hardware` node prepared with `nvidia_smi`, as a HostDriver
    whose settings (hardware, driver root) are that node's; the original plugin again on exit."""
    original = driver.processes.get(PLUGIN)
    if original is None:
        raise RuntimeError("the host plugin was never started: nothing to switch")
    root = driver.settings.artifacts / f"driver-root-{hardware}"
    shutil.rmtree(root, ignore_errors=True)
    settings = replace(driver.settings, hardware=hardware, driver_root=root)
    other = HostDriver(settings, driver.kubectl, driver.node_name)
    other.init_sim()
    run_nvidia_smi(root, nvidia_smi)
    log = driver.settings.artifacts / "plugin.log"
    driver.stop_plugin()
    try:
        argv, env = other.plugin_command()
        other.processes.start(PLUGIN, argv, log, env=env)
        other.wait_plugin_ready()
        wait_published(other, hardware)
        yield other
    finally:
        other.stop_plugin()
        own_env = {k: v for k, v in original.env.items() if k not in FAULT_ENV}
        driver.processes.start(PLUGIN, original.argv, log, env=own_env)
        driver.wait_plugin_ready()
        wait_published(driver, driver.settings.hardware)
        shutil.rmtree(root, ignore_errors=True)
