"""MIG devices under a running plugin with dynamic MIG (simulated DGX H100, real apiserver): one made out of
band is published as it is and the placements it overlaps, the whole GPU and its share device are withdrawn;
the MIG devices our own claims get never change the published slices, across a restart too."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from dra_gpu.hardware.loader import open_hardware
from dra_gpu.hardware.nvml_hardware import NvmlHardware
from dra_gpu.inventory.device_model import build_device_model
from tests.plugin.kubelet_client import ClaimId, KubeletClient
from tests.plugin.plugin_harness import ClaimFactory, PluginProcess, Result, SimNode

pytestmark = pytest.mark.apiserver

PROFILE_2G = 14  # 2g.20gb: two memory slices; placements 0, 2, 4


def expected(node: SimNode, owned: set[tuple[str, int]] | None = None) -> set[str]:
    """What the plugin should publish for the simulated hardware as it is now."""
    discovery = open_hardware(node.hardware, str(node.driver_root)).discover()
    return {d.name for d in build_device_model(discovery, owned_mig=owned or set()).devices}


def of_gpu(names: set[str] | dict[str, Any], minor: int) -> set[str]:
    return {n for n in names if n == f"gpu-{minor}" or n.startswith(f"gpu-{minor}-")}


def memory_slices(device: dict[str, Any]) -> set[int]:
    attrs = device["attributes"]
    start = attrs["placementStart"]["int"]
    return set(range(start, start + attrs["memorySlices"]["int"]))


def uuid_of(hardware: NvmlHardware, minor: int) -> str:
    return next(g.uuid for g in hardware.discover().gpus if g.minor == minor)


def test_out_of_band_mig_device_is_published_and_hides_what_it_overlaps(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    plugin = start_plugin(extra_args=["--publish-slices", "true", "--rediscovery-interval", "3600"])
    before = claims.wait_published(lambda d: set(d) == expected(node))
    assert {"gpu-2", "gpu-2-shared", "gpu-2-mig-1g10gb-19-3", "gpu-2-mig-3g40gb-9-4"} <= set(before)

    hardware = open_hardware(node.hardware, str(node.driver_root))
    theirs = hardware.create_mig_device(uuid_of(hardware, 2), PROFILE_2G, 2)  # slices 2-3, an admin's
    plugin.proc.send_signal(signal.SIGHUP)
    after = claims.wait_published(lambda d: "gpu-2" not in d)

    assert "gpu-2-shared" not in after
    static = after["gpu-2-mig-2g20gb-14-2"]
    assert static["attributes"]["uuid"] == {"string": theirs.uuid}
    assert set(static["attributes"]) == set(before["gpu-2-mig-2g20gb-14-2"]["attributes"]) | {"uuid"}
    mig = {n: d for n, d in after.items() if n.startswith("gpu-2-mig-") and n != static["name"]}
    assert mig and all(not memory_slices(d) & {2, 3} for d in mig.values())
    withheld = {
        n for n in of_gpu(before, 2) if n.startswith("gpu-2-mig-") and memory_slices(before[n]) & {2, 3}
    }
    assert set(mig) == of_gpu(before, 2) - withheld - {"gpu-2", "gpu-2-shared", static["name"]}
    assert "gpu-2-mig-3g40gb-9-4" in mig and "gpu-2-mig-1g10gb-19-3" not in mig
    assert {n for n in after if n not in of_gpu(after, 2)} == {
        n for n in before if n not in of_gpu(before, 2)
    }
    assert set(after) == expected(node)

    # A claim can use the administrator's device as it is: nothing is created, nothing destroyed after.
    kubelet = KubeletClient(node.registration_socket)
    try:
        name, uid = claims.make("oob", [Result("m", static["name"])])
        claim = ClaimId(namespace="oob", uid=uid, name=name)
        assert kubelet.prepare([claim]).claims[uid].error == ""
        spec = json.loads((node.cdi_root / f"k8s.gpu.nvidia.com-claim_{uid}.json").read_text())
        assert f"DRA_GPU_DEVICES={theirs.uuid}" in spec["containerEdits"]["env"]
        assert node.mig_instances() == [(theirs.parent_uuid, theirs.gi_id)]
        assert kubelet.unprepare([claim]).claims[uid].error == ""
        assert node.mig_instances() == [(theirs.parent_uuid, theirs.gi_id)]
    finally:
        kubelet.close()

    # Once the administrator destroys it, every placement is free again, but the GPU is offered whole only
    # once MIG mode is off too (in MIG mode CUDA sees no whole GPU).
    hardware.destroy_mig_device(theirs.parent_uuid, theirs.gi_id, theirs.ci_id)
    plugin.proc.send_signal(signal.SIGHUP)
    freed = claims.wait_published(
        lambda d: "gpu-2-mig-2g20gb-14-2" in d and "uuid" not in d["gpu-2-mig-2g20gb-14-2"]["attributes"]
    )
    assert "gpu-2" not in freed and "gpu-2-shared" not in freed
    hardware.set_mig_mode(theirs.parent_uuid, False)
    plugin.proc.send_signal(signal.SIGHUP)
    assert set(claims.wait_published(lambda d: "gpu-2" in d)) == set(before)


def test_our_own_mig_devices_never_change_the_slices(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    args = ["--publish-slices", "true", "--rediscovery-interval", "0.3"]
    plugin = start_plugin(extra_args=args)
    before = claims.wait_published(lambda d: set(d) == expected(node))
    kubelet = KubeletClient(node.registration_socket)
    name, uid = claims.make("ours", [Result("m", "gpu-3-mig-3g40gb-9-4")])
    claim = ClaimId(namespace="ours", uid=uid, name=name)
    try:
        assert kubelet.prepare([claim]).claims[uid].error == ""
    finally:
        kubelet.close()
    ours = node.mig_instances()
    assert len(ours) == 1

    # Re-discovery runs all the time; a change elsewhere shows it did while our device existed.
    hardware = open_hardware(node.hardware, str(node.driver_root))
    theirs = hardware.create_mig_device(uuid_of(hardware, 5), PROFILE_2G, 0)
    during = claims.wait_published(lambda d: "gpu-5" not in d)
    assert of_gpu(during, 3) == of_gpu(before, 3)  # the claim's device and everything it overlaps stay
    assert "gpu-5-mig-2g20gb-14-0" in during

    # A restart: the checkpoint says the instance is ours (kept, model unchanged); the admin's stays too.
    plugin.stop()
    plugin = start_plugin(extra_args=args)
    assert set(node.mig_instances()) == {*ours, (theirs.parent_uuid, theirs.gi_id)}
    restarted = claims.wait_published(lambda d: set(d) == set(during))
    assert of_gpu(restarted, 3) == of_gpu(before, 3) and set(restarted) == expected(node, owned=set(ours))
    time.sleep(1.5)  # several re-discoveries later, still the same
    assert set(claims.published_devices()) == set(during)

    kubelet = KubeletClient(node.registration_socket)
    try:
        assert kubelet.unprepare([claim]).claims[uid].error == ""
    finally:
        kubelet.close()
    assert set(node.mig_instances()) == {(theirs.parent_uuid, theirs.gi_id)}
    time.sleep(1.5)  # several re-discoveries after the claim's device is gone: nothing changed
    assert set(claims.published_devices()) == set(during)


def test_our_leftover_is_destroyed_before_publishing_not_published_as_foreign(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """Killed after creating a claim's MIG device but before checkpointing it: at start-up the leftover is
    destroyed first, then the model is built, so it is never published as someone else's device."""
    name, uid = claims.make("leftover", [Result("m", "gpu-4-mig-1g10gb-19-0")])
    claim = ClaimId(namespace="leftover", uid=uid, name=name)
    doomed = start_plugin(env={"DRA_GPU_FAULT_KILL_AT": "prepare-group-0-applied"})
    kubelet = KubeletClient(node.registration_socket)
    try:
        with pytest.raises(grpc.RpcError):
            kubelet.prepare([claim])
    finally:
        kubelet.close()
    assert doomed.wait_dead() == -signal.SIGKILL
    assert len(node.mig_instances()) == 1  # created, never checkpointed

    start_plugin(extra_args=["--publish-slices", "true", "--rediscovery-interval", "3600"])
    assert node.mig_instances() == []
    full = expected(node)
    devices = claims.wait_published(lambda d: set(d) == full)
    assert {"gpu-4", "gpu-4-shared"} <= set(devices) and not any(
        "uuid" in d["attributes"] for n, d in devices.items() if n.startswith("gpu-4-mig-")
    )
