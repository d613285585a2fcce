"""The publishing plan (pure): generations, obsolete slices, minimal writes."""

from __future__ import annotations

import copy
from typing import Any

from dra_gpu.hardware.types import ComputeMode, DiscoveryResult, GpuInfo
from dra_gpu.inventory.device_model import build_device_model
from dra_gpu.slices.slice_builder import build_slices
from dra_gpu.slices.slice_sync import comparable, plan_sync


def _gpu(minor: int) -> GpuInfo:
    return GpuInfo(
        index=minor,
        minor=minor,
        uuid=f"GPU-{minor:08d}-0000-4000-8000-000000000000",
        product_name="Tesla T4",
        brand="Tesla",
        architecture="Turing",
        cuda_compute_capability=(7, 5),
        memory_bytes=16 * 2**30,
        multiprocessors=40,
        pci_bus_id=f"0000:{minor + 1:02x}:00.0",
        pcie_root="pci0000:00",
        numa_node=0,
        interconnect=None,
        mig_capable=False,
        mig_enabled=False,
        mig_pending=False,
        mig_toggle_without_reset=False,
        compute_mode=ComputeMode.DEFAULT,
    )


def _desired(gpus: int) -> Any:
    model = build_device_model(DiscoveryResult("550.54.15", (12, 4), tuple(_gpu(i) for i in range(gpus))))
    return lambda generation: build_slices(model, "n1", (1, 36), generation, "uid-1")


def _published(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the server returns: our objects plus uid/resourceVersion, quantities in canonical form."""
    out = copy.deepcopy(slices)
    for i, item in enumerate(out):
        item["metadata"].update(uid=f"u{i}", resourceVersion=str(100 + i))
        for device in item["spec"].get("devices", []):
            if "compute" in device["capacity"]:  # same values, other spellings
                device["capacity"]["compute"]["requestPolicy"]["default"] = "1e1"
                device["capacity"]["memory"]["value"] = str(16 * 2**30)
    return out


def test_first_publish_creates_everything_at_generation_1() -> None:
    plan = plan_sync([], "n1", _desired(2), last_generation=0)
    assert plan.generation == 1 and not plan.deletes and not plan.updates
    assert [c["metadata"]["name"] for c in plan.creates] == [f"n1-gpu.nvidia.com-{i}" for i in range(3)]


def test_nothing_to_do_when_published_matches() -> None:
    existing = _published(_desired(2)(1))
    assert plan_sync(existing, "n1", _desired(2), last_generation=1).empty


def test_quantities_compare_by_value() -> None:
    existing = _published(_desired(1)(1))
    existing[1]["spec"]["devices"][0]["capacity"]["memory"]["value"] = str(16 * 2**30)  # "16Gi" spelled out
    assert comparable(existing[1]) == comparable(_desired(1)(1)[1])
    assert plan_sync(existing, "n1", _desired(1), last_generation=1).empty


def test_one_edited_slice_is_updated_in_place() -> None:
    existing = _published(_desired(2)(4))
    existing[2]["spec"]["devices"][0]["attributes"]["brand"] = {"string": "edited"}
    plan = plan_sync(existing, "n1", _desired(2), last_generation=4)
    assert plan.generation == 4 and not plan.creates and not plan.deletes
    assert [u["metadata"] for u in plan.updates] == [
        {
            "name": "n1-gpu.nvidia.com-2",
            "resourceVersion": "102",
            "ownerReferences": existing[2]["metadata"]["ownerReferences"],
        }
    ]


def test_deleted_slice_is_recreated_without_new_generation() -> None:
    existing = _published(_desired(2)(3))
    del existing[1]
    plan = plan_sync(existing, "n1", _desired(2), last_generation=3)
    assert plan.generation == 3 and [c["metadata"]["name"] for c in plan.creates] == ["n1-gpu.nvidia.com-1"]
    assert not plan.updates


def test_wiped_pool_comes_back_with_a_higher_generation() -> None:
    plan = plan_sync([], "n1", _desired(2), last_generation=3)
    assert plan.generation == 4 and len(plan.creates) == 3


def test_model_change_bumps_generation_and_deletes_obsolete_first() -> None:
    existing = _published(_desired(3)(2))  # 1 counters slice + 3 device slices
    plan = plan_sync(existing, "n1", _desired(1), last_generation=2)
    assert plan.generation == 3
    assert [d.name for d in plan.deletes] == ["n1-gpu.nvidia.com-2", "n1-gpu.nvidia.com-3"]
    assert plan.deletes[0].uid == "u2" and plan.deletes[0].resource_version == "102"
    assert [u["spec"]["pool"] for u in plan.updates] == [
        {"name": "n1", "generation": 3, "resourceSliceCount": 2}
    ] * 2


def test_foreign_and_stale_slices_are_obsolete() -> None:
    existing = _published(_desired(1)(5))
    stale = copy.deepcopy(existing[0])
    stale["metadata"].update(name="n1-gpu.nvidia.com-old", uid="stale")
    stale["spec"]["pool"]["generation"] = 2
    other_pool = copy.deepcopy(existing[1])
    other_pool["metadata"].update(name="x-1", uid="other")
    other_pool["spec"]["pool"]["name"] = "elsewhere"
    plan = plan_sync([*existing, stale, other_pool], "n1", _desired(1), last_generation=5)
    assert sorted(d.uid for d in plan.deletes) == ["other", "stale"]
    assert plan.generation == 6  # obsolete slices force a new generation, so consumers drop the old view


def test_equivalent_forms_are_not_rewritten() -> None:
    existing = _published(_desired(1)(1))
    for item in existing:
        for device in item["spec"].get("devices", []):
            device.pop("allowMultipleAllocations", None)  # as a server without DRAConsumableCapacity keeps it
    forms = {}
    for have, want in zip(existing, _desired(1)(1), strict=True):
        forms[have["metadata"]["name"]] = (comparable(want), comparable(have))
    assert not plan_sync(existing, "n1", _desired(1), last_generation=1).empty
    same = plan_sync(
        existing,
        "n1",
        _desired(1),
        last_generation=1,
        equivalent=lambda name, have, want: forms.get(name) == (want, have),
    )
    assert same.empty
