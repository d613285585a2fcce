"""NVIDIA's consumable shares (`--consumable-shares`): the flag, the devices it changes and their slices."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dra_gpu.hardware.types import DiscoveryResult
from dra_gpu.inventory.consumable_shares import (
    DISABLED,
    ConsumableShares,
    apply_consumable_shares,
    parse_consumable_shares,
)
from dra_gpu.inventory.device_model import ModelOptions, build_device_model
from dra_gpu.inventory.model import Capacity, Device, DeviceKind, RequestPolicy
from dra_gpu.slices.slice_builder import build_slices
from dra_gpu.slices.slice_validation import validate_slices

MIB = 2**20


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", DISABLED),
        ("disabled", DISABLED),
        (" memory ", ConsumableShares("memory")),
        ("unlimited", ConsumableShares("unlimited")),
        ("4", ConsumableShares("count", 4)),
    ],
)
def test_flag_values(text: str, expected: ConsumableShares) -> None:
    assert parse_consumable_shares(text) == expected


@pytest.mark.parametrize("text", ["0", "-2", "+3", "1.5", "Memory", "mem", "4x"])
def test_bad_flag_value_names_the_flag_and_the_choices(text: str) -> None:
    with pytest.raises(
        ValueError, match=r"--consumable-shares \(CONSUMABLE_SHARES\) .*'memory', 'unlimited'"
    ):
        parse_consumable_shares(text)


def _wire_device(slices: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for s in slices:
        for device in s["spec"].get("devices", []):
            if device["name"] == name:
                return dict(device)
    raise AssertionError(f"{name} not in the slices")


def test_disabled_changes_nothing(discovery: DiscoveryResult) -> None:
    off = ModelOptions(consumable_shares=DISABLED)
    assert build_device_model(discovery, off) == build_device_model(discovery)


@pytest.mark.parametrize(
    ("flag", "memory_policy"),
    [
        ("unlimited", {"default": "0", "validRange": {"min": "0", "max": "81559Mi", "step": "1Mi"}}),
        ("memory", {"default": "81559Mi", "validRange": {"min": "1Mi", "max": "81559Mi", "step": "1Mi"}}),
        ("4", {"default": "0", "validRange": {"min": "0", "max": "81559Mi", "step": "1Mi"}}),
    ],
)
@pytest.mark.parametrize("kubernetes", [(1, 34), (1, 35), (1, 37)])
def test_gpu_devices_per_mode(
    discovery: DiscoveryResult, flag: str, memory_policy: dict[str, Any], kubernetes: tuple[int, int]
) -> None:
    model = build_device_model(discovery, ModelOptions(consumable_shares=parse_consumable_shares(flag)))
    plain = build_device_model(discovery)
    gpu_memory = plain.by_name()["gpu-0"].capacity["memory"].value
    assert gpu_memory - gpu_memory % MIB == 81559 * MIB  # the simulated H100's memory, whole MiB
    slices = build_slices(model, "node-a", kubernetes)
    assert validate_slices(slices, kubernetes) == []
    gpu = _wire_device(slices, "gpu-0")
    assert gpu["allowMultipleAllocations"] is True
    assert gpu["capacity"]["memory"] == {"value": "81559Mi", "requestPolicy": memory_policy}
    if flag == "4":
        assert gpu["capacity"]["shares"] == {
            "value": "4",
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
        }
    else:
        assert "shares" not in gpu["capacity"]
    # the rest of the whole GPU is as before: attributes, counters, SM count and engine counts, the latter
    # consumed only when a claim asks for them (without a policy each claim would take them all)
    before = _wire_device(build_slices(plain, "node-a", kubernetes), "gpu-0")
    assert {k: v for k, v in gpu.items() if k not in ("allowMultipleAllocations", "capacity")} == {
        k: v for k, v in before.items() if k != "capacity"
    }
    assert set(gpu["capacity"]) - {"shares"} == set(before["capacity"])
    assert {"multiprocessors", "copyEngines", "decoders"} <= set(before["capacity"])
    for name, published in before["capacity"].items():
        if name == "memory":
            continue
        value = published["value"]
        assert gpu["capacity"][name] == {
            "value": value,
            "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": value}},
        }
    # MIG placements made at prepare and our own share devices keep their policies
    for device in model.devices:
        if device.kind is DeviceKind.MIG_DYNAMIC:
            assert not device.allow_multiple_allocations and "shares" not in device.capacity
        if device.kind is DeviceKind.GPU_SHARE:
            assert device == plain.by_name()[device.name]
        if device.kind is DeviceKind.GPU:
            assert device.allow_multiple_allocations


def test_existing_mig_devices_are_shared_too(discovery: DiscoveryResult) -> None:
    placement = next(d for d in build_device_model(discovery).devices if d.kind is DeviceKind.MIG_DYNAMIC)
    # the shape of a MIG device that exists
    existing = dataclasses.replace(placement, kind=DeviceKind.MIG_STATIC)
    shared = apply_consumable_shares(existing, ConsumableShares("count", 3))
    memory = placement.capacity["memory"].value
    assert shared.allow_multiple_allocations
    assert shared.capacity["memory"].request_policy == RequestPolicy(
        default=0, valid_range_min=0, valid_range_max=memory, valid_range_step=MIB
    )
    assert shared.capacity["shares"].value == 3
    copy_engines = placement.capacity["copyEngines"].value
    assert shared.capacity["copyEngines"] == Capacity(
        copy_engines, request_policy=RequestPolicy(default=0, valid_range_min=0, valid_range_max=copy_engines)
    )
    assert apply_consumable_shares(placement, ConsumableShares("count", 3)) == placement


def test_memory_not_a_whole_mib_is_rounded_down() -> None:
    device = Device(
        name="gpu-0",
        kind=DeviceKind.GPU,
        parent_uuid="GPU-x",
        parent_minor=0,
        attributes={},
        capacity={"memory": Capacity(10 * MIB + 123, binary_si=True)},
    )
    shared = apply_consumable_shares(device, ConsumableShares("memory"))
    assert shared.capacity["memory"].value == 10 * MIB
    assert shared.capacity["memory"].request_policy == RequestPolicy(
        default=10 * MIB, valid_range_min=MIB, valid_range_max=10 * MIB, valid_range_step=MIB
    )


@pytest.mark.apiserver
@pytest.mark.parametrize("flag", ["memory", "unlimited", "8"])
def test_the_api_server_stores_the_shared_devices_as_published(
    kube_apiserver: Any, discovery: DiscoveryResult, flag: str
) -> None:
    """The real kube-apiserver (1.37, or 1.34 with KUBERNETES_VERSION=1.34) takes every mode's slices and
    keeps allowMultipleAllocations and the request policies (its DRAConsumableCapacity gate is on in the
    tests' control plane); a policy the API rejected (e.g. max not a multiple of step) would fail here."""
    import uuid

    from kubernetes import client

    version = kube_apiserver.version()
    release = (int(version["major"]), int(version["minor"].rstrip("+")))
    model = build_device_model(discovery, ModelOptions(consumable_shares=parse_consumable_shares(flag)))
    slices = build_slices(model, f"shares-{uuid.uuid4().hex[:6]}", release)
    api = client.CustomObjectsApi(kube_apiserver.api_client())
    try:
        for item in slices:
            api.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", item)
        stored: list[dict[str, Any]] = [
            api.get_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", item["metadata"]["name"])
            for item in slices
        ]
        assert _wire_device(stored, "gpu-0") == _wire_device(slices, "gpu-0")
        assert _wire_device(stored, "gpu-0")["allowMultipleAllocations"] is True
    finally:
        for item in slices:
            api.delete_cluster_custom_object(
                "resource.k8s.io", "v1", "resourceslices", item["metadata"]["name"]
            )
