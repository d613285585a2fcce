"""Dynamic MIG with MIG devices that already exist: ours (owned by checkpointed claims) change nothing; ones
made out of band are published as they are and hide the whole GPU, the share device and the placements they
overlap."""

from __future__ import annotations

import ctypes
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_gpu.hardware.loader import open_hardware
from dra_gpu.hardware.nvml_hardware import NvmlHardware
from dra_gpu.hardware.sim_driver_root import open_simulated_nvml
from dra_gpu.hardware.types import GpuInfo, MigInstance
from dra_gpu.inventory import mig_geometry
from dra_gpu.inventory.device_model import ModelOptions, build_device_model
from dra_gpu.inventory.model import DeviceKind, DeviceModel
from dra_gpu.slices.slice_builder import build_slices
from dra_gpu.slices.slice_validation import validate_slices
from tests.support.device_model_checks import fit_together, memory_slices

PROFILE_2G = 14  # 2g.20gb on H100: placements 0, 2, 4 (two memory slices each)
PROFILE_3G = 9  # 3g.40gb on H100: placements 0, 4 (four memory slices each)


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="oob-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def hw(root: Path) -> NvmlHardware:
    return open_hardware("h100-80gb", str(root))


def _gpu(hw: NvmlHardware) -> GpuInfo:
    return hw.discover().gpus[0]


def _all_placements(gpu: GpuInfo) -> set[tuple[int, int, int]]:
    """(gi profile id, start, size) of every placement the GPU offers when empty."""
    return {(p.gi_profile_id, pl.start, pl.size) for p in gpu.mig_profiles for pl in p.placements}


def _dynamic(model: DeviceModel) -> set[tuple[int, int, int]]:
    return {
        (d.mig.gi_profile_id, d.mig.placement_start, d.mig.placement_size)
        for d in model.devices
        if d.kind is DeviceKind.MIG_DYNAMIC and d.mig is not None
    }


def test_out_of_band_instance_is_published_and_hides_what_it_overlaps(hw: NvmlHardware) -> None:
    empty = build_device_model(hw.discover())
    instance = hw.create_mig_device(_gpu(hw).uuid, PROFILE_2G, 2)  # slices 2-3, made by "an administrator"
    discovery = hw.discover()
    gpu = discovery.gpus[0]
    model = build_device_model(discovery)
    names = model.by_name()

    assert "gpu-0" not in names and "gpu-0-shared" not in names
    static = names["gpu-0-mig-2g20gb-14-2"]
    assert static.kind is DeviceKind.MIG_STATIC and static.attributes["uuid"].value == instance.uuid
    assert static.mig is not None and (static.mig.uuid, static.mig.gi_id, static.mig.ci_id) == (
        instance.uuid,
        instance.gi_id,
        instance.ci_id,
    )
    # The same attributes and capacities as the dynamic device it replaces, plus its uuid.
    replaced = empty.by_name()["gpu-0-mig-2g20gb-14-2"]
    assert set(static.attributes) == set(replaced.attributes) | {"uuid"}
    assert {k: v for k, v in static.attributes.items() if k != "uuid"} == dict(replaced.attributes)
    assert static.capacity == replaced.capacity and static.consumes_counters == replaced.consumes_counters
    assert {"memory-slice-2", "memory-slice-3"} <= set(static.consumes_counters[0].counters)

    # Exactly the placements that do not overlap slices 2-3 stay, and the counters are those of the empty GPU.
    expected = {
        (pid, start, size)
        for pid, start, size in _all_placements(gpu)
        if not {2, 3} & set(range(start, start + size))
    }
    assert _dynamic(model) == expected and expected and (PROFILE_3G, 4, 4) in expected
    assert model.counter_sets == empty.counter_sets
    # With the instance allocated (as it is, in effect), each remaining placement fits exactly when the
    # hardware could hold both.
    profiles = {p.gi_profile_id: p for p in gpu.mig_profiles}
    taken = mig_geometry.Placement(profiles[PROFILE_2G], 2)
    for device in model.devices:
        if device.kind is DeviceKind.MIG_DYNAMIC and device.mig is not None:
            other = mig_geometry.Placement(profiles[device.mig.gi_profile_id], device.mig.placement_start)
            valid = mig_geometry.is_valid_configuration((taken, other), gpu.mig_profiles)
            assert fit_together(model, [static, device]) is valid, device.name
    assert any(instance.uuid in w and "made outside this driver" in w for w in model.warnings)

    # The slices stay valid (same attribute set per type apart from the static device's uuid).
    for version in ((1, 34), (1, 36)):
        assert validate_slices(build_slices(model, "node-a", version), version) == []


def test_instance_owned_by_a_claim_changes_nothing(hw: NvmlHardware) -> None:
    before = build_device_model(hw.discover())
    gpu = _gpu(hw)
    ours = hw.create_mig_device(gpu.uuid, PROFILE_3G, 4)
    after = hw.discover()
    assert after.gpus[0].mig_enabled and after.gpus[0].mig_instances == (ours,)
    assert build_device_model(after, owned_mig={(gpu.uuid, ours.gi_id)}) == before
    # The owned set names GPU instances of one GPU: the same id on another GPU does not count.
    assert build_device_model(after, owned_mig={("GPU-other", ours.gi_id)}) != before


def test_owned_and_out_of_band_instances_on_one_gpu(hw: NvmlHardware) -> None:
    gpu = _gpu(hw)
    ours = hw.create_mig_device(gpu.uuid, PROFILE_3G, 4)  # slices 4-7, a claim's
    theirs = hw.create_mig_device(gpu.uuid, PROFILE_2G, 0)  # slices 0-1, an administrator's
    model = build_device_model(hw.discover(), owned_mig={(gpu.uuid, ours.gi_id)})
    names = model.by_name()
    assert "gpu-0" not in names and "gpu-0-shared" not in names
    statics = [d for d in model.devices if d.kind is DeviceKind.MIG_STATIC]
    assert [d.attributes["uuid"].value for d in statics] == [theirs.uuid]
    dynamic = [d for d in model.devices if d.kind is DeviceKind.MIG_DYNAMIC]
    assert all(not memory_slices(d) & {0, 1} for d in dynamic)
    assert "gpu-0-mig-3g40gb-9-4" in names  # the claim's device stays: its counters already exclude it
    assert any(memory_slices(d) & {4, 5, 6, 7} for d in dynamic)


def test_gpu_instance_with_two_compute_instances_is_one_device(hw: NvmlHardware, root: Path) -> None:
    """A device name stands for a GPU instance: the second compute instance is named in a warning."""
    gpu = _gpu(hw)
    hw.set_mig_mode(gpu.uuid, True)
    nvml = open_simulated_nvml(root)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
    placement = nvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = 4, 4
    gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, PROFILE_3G, ctypes.byref(placement))
    ci_profile = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, 0, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )
    for _ in range(2):
        nvml.nvmlGpuInstanceCreateComputeInstance(gi, int(ci_profile.id))
    discovery = hw.discover()
    instances: tuple[MigInstance, ...] = discovery.gpus[0].mig_instances
    assert len(instances) == 2 and instances[0].gi_id == instances[1].gi_id

    model = build_device_model(discovery)
    statics = [d for d in model.devices if d.kind is DeviceKind.MIG_STATIC]
    assert [(d.name, d.attributes["uuid"].value) for d in statics] == [
        ("gpu-0-mig-3g40gb-9-4", instances[0].uuid)
    ]
    assert any(instances[1].uuid in w and "not published separately" in w for w in model.warnings)
    names = [d.name for d in model.devices]
    assert len(names) == len(set(names))
    # Owned (by GPU instance), both compute instances are the claim's: nothing changes.
    owned = build_device_model(discovery, owned_mig={(gpu.uuid, instances[0].gi_id)})
    assert not any(d.kind is DeviceKind.MIG_STATIC for d in owned.devices) and "gpu-0" in owned.by_name()


def test_gpu_instance_without_compute_instance_takes_its_slices(hw: NvmlHardware, root: Path) -> None:
    """`nvidia-smi mig -cgi` without `-C`: no MIG device exists, yet the placement is occupied."""
    empty = build_device_model(hw.discover())
    gpu = _gpu(hw)
    hw.set_mig_mode(gpu.uuid, True)
    nvml = open_simulated_nvml(root)
    nvml.nvmlInit()
    placement = nvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = 0, 4
    nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
        nvml.nvmlDeviceGetHandleByUUID(gpu.uuid), PROFILE_3G, ctypes.byref(placement)
    )
    discovery = hw.discover()
    bare = discovery.gpus[0].mig_empty_gpu_instances
    assert discovery.gpus[0].mig_instances == () and len(bare) == 1
    assert (bare[0].gi_profile_id, bare[0].placement.start, bare[0].placement.size) == (PROFILE_3G, 0, 4)

    model = build_device_model(discovery)
    names = model.by_name()
    assert "gpu-0" not in names and "gpu-0-shared" not in names
    assert not any(d.kind is DeviceKind.MIG_STATIC for d in model.devices)  # nothing usable in it
    assert _dynamic(model) == {(pid, start, size) for pid, start, size in _dynamic(empty) if start >= 4}
    assert any(f"gi {bare[0].gi_id} at 0:4" in w for w in model.warnings)
    # Ours (a prepare between creating the GPU instance and its compute instance): nothing changes.
    assert build_device_model(discovery, owned_mig={(gpu.uuid, bare[0].gi_id)}) == empty


def test_static_mig_mode_ignores_the_owned_set(hw: NvmlHardware) -> None:
    """Without dynamic MIG every existing instance is published, whoever made it."""
    gpu = _gpu(hw)
    instance = hw.create_mig_device(gpu.uuid, PROFILE_2G, 2)
    discovery = hw.discover()
    options = ModelOptions(dynamic_mig=False)
    plain = build_device_model(discovery, options)
    assert build_device_model(discovery, options, owned_mig={(gpu.uuid, instance.gi_id)}) == plain
    assert [d.name for d in plain.devices] == ["gpu-0-mig-2g20gb-14-2"]


def test_gpu_in_mig_mode_is_not_offered_whole(hw: NvmlHardware) -> None:
    """MIG mode switched on out of band (or left on): no MIG device yet, but CUDA would see no whole GPU."""
    before = build_device_model(hw.discover()).by_name()
    gpu = _gpu(hw)
    assert "gpu-0" in before and "gpu-0-shared" in before
    hw.set_mig_mode(gpu.uuid, True)
    model = build_device_model(hw.discover())
    names = model.by_name()
    assert "gpu-0" not in names and "gpu-0-shared" not in names
    assert any(d.kind is DeviceKind.MIG_DYNAMIC and d.parent_minor == 0 for d in model.devices)
    hw.set_mig_mode(gpu.uuid, False)
    assert "gpu-0" in build_device_model(hw.discover()).by_name()
