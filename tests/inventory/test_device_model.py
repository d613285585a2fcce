"""The device model built from simulated discovery: names, attributes, counters, and MIG exclusion by
counters."""

from __future__ import annotations

import dataclasses
import itertools
import math
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from dra_gpu.hardware.interface import HardwareError
from dra_gpu.hardware.loader import open_hardware
from dra_gpu.hardware.nvml_hardware import NvmlHardware
from dra_gpu.hardware.profiles import GPU_PROFILES
from dra_gpu.hardware.sim_driver_root import open_simulated_nvml
from dra_gpu.hardware.types import DiscoveryResult
from dra_gpu.inventory import mig_geometry, naming
from dra_gpu.inventory.device_model import ModelOptions, build_device_model, semver
from dra_gpu.inventory.model import Device, DeviceKind, DeviceModel
from tests.support.device_model_checks import fit_together, memory_slices


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="inv-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _discover(root: Path, hardware: str) -> tuple[NvmlHardware, DiscoveryResult]:
    hw = open_hardware(hardware, str(root))
    return hw, hw.discover()


def test_dgx_h100_devices_and_order(root: Path) -> None:
    _, discovery = _discover(root, "dgx-h100")
    model = build_device_model(discovery, ModelOptions(dynamic_mig=True, fractional=True))
    assert len(model.devices) == 8 * (1 + 25 + 1)
    names = [d.name for d in model.devices]
    assert names[0] == "gpu-0" and names[26] == "gpu-0-shared" and names[27] == "gpu-1"
    assert "gpu-3-mig-1g10gb-me-20-6" in names and "gpu-7-mig-7g80gb-0-0" in names
    first_1g = [n for n in names if n.startswith("gpu-0-mig-1g10gb-19-")]
    assert first_1g[0] == "gpu-0-mig-1g10gb-19-6"  # highest start first (see device_model docstring)
    assert len(set(names)) == len(names) and all(naming.is_dns_label(n) for n in names)
    assert [c.name for c in model.counter_sets] == [f"gpu-{i}-counter-set" for i in range(8)]
    assert model.warnings == ()


def test_attribute_sets_per_type_and_limits(root: Path) -> None:
    _, discovery = _discover(root, "dgx-h100")
    model = build_device_model(discovery)
    keys_by_kind: dict[DeviceKind, set[frozenset[str]]] = {}
    for device in model.devices:
        keys_by_kind.setdefault(device.kind, set()).add(frozenset(device.attributes))
        assert len(device.attributes) + len(device.capacity) <= 32
        for attr in device.attributes.values():
            if isinstance(attr.value, str):
                assert len(attr.value.encode()) <= 64
    assert all(len(sets) == 1 for sets in keys_by_kind.values())
    gpu = model.by_name()["gpu-4"]
    assert {k: a.value for k, a in gpu.attributes.items()} == {
        "type": "gpu",
        "uuid": discovery.gpus[4].uuid,
        "productName": "NVIDIA H100 80GB HBM3",
        "brand": "Nvidia",
        "architecture": "Hopper",
        "cudaComputeCapability": "9.0.0",
        "driverVersion": "570.133.20",
        "cudaDriverVersion": "12.8.0",
        "resource.kubernetes.io/pciBusID": "0000:87:00.0",
        "resource.kubernetes.io/pcieRoot": "pci0000:80",
        "resource.kubernetes.io/numaNode": (1,),
        "addressingMode": "HMM",
        "interconnect": "nvswitch-0",
    }
    assert gpu.attributes["resource.kubernetes.io/numaNode"].kind == "ints"  # a scalar `int` unless lists
    assert gpu.attributes["cudaComputeCapability"].kind == "version"
    mig = model.by_name()["gpu-4-mig-3g40gb-9-4"]
    assert "uuid" not in mig.attributes  # dynamic: the instance does not exist yet
    assert mig.attributes["parentUUID"].value == discovery.gpus[4].uuid
    assert (mig.attributes["profile"].value, mig.attributes["placementStart"].value) == ("3g.40gb", 4)
    assert {k: c.value for k, c in mig.capacity.items()} == {
        "memory": round(39.5 * 1024) * 2**20,
        "multiprocessors": 60,
        "copyEngines": 3,
        "decoders": 3,
        "encoders": 0,
        "jpegEngines": 3,
        "ofaEngines": 0,
    }
    assert mig.consumes_counters[0].counters["memory-slice-4"] == 1
    assert "memory-slice-3" not in mig.consumes_counters[0].counters


def test_whole_gpu_carries_the_largest_mig_engine_counts_only_with_dynamic_mig(root: Path) -> None:
    """As NVIDIA's DynamicMIG whole GPU (`maxCapacities`): a selector such as `copyEngines >= 8` matches the
    whole GPU, each engine count the largest of the GPU's MIG devices; without dynamic MIG, as NVIDIA's
    plain whole GPU, no engine counts."""
    _, discovery = _discover(root, "dgx-h100")
    dynamic = build_device_model(discovery).by_name()
    migs = [d for d in dynamic.values() if d.kind is DeviceKind.MIG_DYNAMIC and d.parent_minor == 0]
    engines = ("copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines")
    largest = {name: max(m.capacity[name].value for m in migs) for name in engines}
    assert largest == {"copyEngines": 8, "decoders": 7, "encoders": 0, "jpegEngines": 7, "ofaEngines": 1}
    whole = dynamic["gpu-0"]
    assert {name: whole.capacity[name].value for name in engines} == largest
    assert whole.capacity["memory"].value == discovery.gpus[0].memory_bytes  # the device's own
    assert whole.capacity["multiprocessors"].value == discovery.gpus[0].multiprocessors
    plain = build_device_model(discovery, ModelOptions(dynamic_mig=False)).by_name()["gpu-0"]
    assert set(plain.capacity) == {"memory", "multiprocessors"}


def test_share_device(root: Path) -> None:
    _, discovery = _discover(root, "single-t4")
    model = build_device_model(discovery)
    share = model.by_name()["gpu-0-shared"]
    assert share.kind == DeviceKind.GPU_SHARE and share.allow_multiple_allocations
    assert share.attributes["type"].value == "gpu-share"
    # no NUMA node, no addressing mode (R535 lacks nvmlDeviceGetAddressingMode): left out, as NVIDIA does
    assert (
        "resource.kubernetes.io/numaNode" not in share.attributes and "addressingMode" not in share.attributes
    )
    assert share.attributes["interconnect"].value == "pcie"
    assert share.attributes["driverVersion"].value == "535.183.1"  # "535.183.01" as strict semver
    memory, compute = share.capacity["memory"], share.capacity["compute"]
    assert memory.value == 15360 * 2**20 and memory.request_policy is not None
    assert (memory.request_policy.valid_range_min, memory.request_policy.valid_range_step) == (2**30, 2**30)
    assert compute.value == 100 and compute.request_policy is not None
    assert (compute.request_policy.default, compute.request_policy.valid_range_min) == (10, 5)
    gpu = model.by_name()["gpu-0"]
    assert share.consumes_counters == gpu.consumes_counters  # whole GPU and shares exclude each other
    assert not fit_together(model, [gpu, share])
    no_share = build_device_model(discovery, ModelOptions(fractional=False))
    assert [d.name for d in no_share.devices] == ["gpu-0"] and no_share.counter_sets == ()


def test_ampere_in_mig_mode_publishes_no_parent(root: Path) -> None:
    hw, discovery = _discover(root, "dgx-a100")
    a100 = discovery.gpus[0]
    with pytest.raises(HardwareError, match="pending"):  # Ampere: MIG mode changes at the next reset
        hw.set_mig_mode(a100.uuid, True)
    nvml = open_simulated_nvml(root)
    nvml.nvmlInit()
    nvml.reset_gpu(0)
    instance = hw.create_mig_device(a100.uuid, 14, 2)  # 2g.10gb at 2:2
    discovery = hw.discover()
    # Created for one of our claims: every placement stays published (the claim's counters exclude it).
    owned = {(a100.uuid, instance.gi_id)}
    dynamic = build_device_model(discovery, ModelOptions(dynamic_mig=True), owned_mig=owned)
    gpu0 = [d for d in dynamic.devices if d.parent_minor == 0]
    assert all(d.kind == DeviceKind.MIG_DYNAMIC for d in gpu0) and len(gpu0) == 25
    # Made out of band: published with its uuid, the placements it overlaps withheld.
    foreign = [d for d in build_device_model(discovery).devices if d.parent_minor == 0]
    assert [d.name for d in foreign if d.kind == DeviceKind.MIG_STATIC] == ["gpu-0-mig-2g10gb-14-2"]
    assert all(not (memory_slices(d) & {2, 3}) for d in foreign if d.kind == DeviceKind.MIG_DYNAMIC)
    assert dynamic.by_name()["gpu-1"].kind == DeviceKind.GPU  # MIG disabled: whole GPU, no MIG (needs reset)
    assert not any(d.name.startswith("gpu-1-mig-") for d in dynamic.devices)
    static = build_device_model(discovery, ModelOptions(dynamic_mig=False))
    gpu0 = [d for d in static.devices if d.parent_minor == 0]
    assert [d.name for d in gpu0] == ["gpu-0-mig-2g10gb-14-2"]
    assert gpu0[0].kind == DeviceKind.MIG_STATIC and gpu0[0].attributes["uuid"].value == instance.uuid
    assert gpu0[0].mig is not None and (gpu0[0].mig.gi_id, gpu0[0].mig.ci_id) == (
        instance.gi_id,
        instance.ci_id,
    )
    hw.destroy_mig_device(a100.uuid, instance.gi_id, instance.ci_id)
    empty = build_device_model(hw.discover(), ModelOptions(dynamic_mig=False))
    assert any("MIG enabled but no MIG devices" in w for w in empty.warnings)


def _mig_devices(model: DeviceModel, minor: int) -> list[Device]:
    return [d for d in model.devices if d.parent_minor == minor and d.kind == DeviceKind.MIG_DYNAMIC]


@pytest.mark.parametrize("hardware", ["h100-80gb", "a100-40gb", "a100-80gb", "h200-141gb"])
def test_counters_allow_exactly_the_valid_mig_configurations(root: Path, hardware: str) -> None:
    """Overlapping memory slices never fit together; every configuration the hardware allows does fit; and
    the counters accept nothing else (exhaustive over all sets the counters accept)."""
    hw, discovery = _discover(root, hardware)
    if not discovery.gpus[0].mig_toggle_without_reset:  # Ampere publishes MIG devices only in MIG mode
        nvml = open_simulated_nvml(root)
        nvml.nvmlInit()
        nvml.nvmlDeviceSetMigMode(nvml.nvmlDeviceGetHandleByIndex(0), 1)
        nvml.reset_gpu(0)
        discovery = hw.discover()
    model = build_device_model(discovery)
    devices = _mig_devices(model, 0)
    gpu = discovery.gpus[0]
    for a, b in itertools.combinations(devices, 2):
        if memory_slices(a) & memory_slices(b):
            assert not fit_together(model, [a, b]), (a.name, b.name)
    by_key = {(d.mig.gi_profile_id, d.mig.placement_start): d for d in devices if d.mig}
    valid = {
        frozenset((p.profile.gi_profile_id, p.start) for p in config)
        for config in mig_geometry.valid_configurations(gpu.mig_profiles)
    }
    assert len(valid) > 100
    for config in valid:
        assert fit_together(model, [by_key[k] for k in config]), sorted(config)
    accepted: set[frozenset[tuple[int, int]]] = set()

    def grow(chosen: list[Device], start: int) -> None:
        for i in range(start, len(devices)):
            candidate = [*chosen, devices[i]]
            if fit_together(model, candidate):
                accepted.add(
                    frozenset((d.mig.gi_profile_id, d.mig.placement_start) for d in candidate if d.mig)
                )
                grow(candidate, i + 1)

    grow([], 0)
    assert accepted == valid
    whole = model.by_name().get("gpu-0")
    if gpu.mig_toggle_without_reset:
        assert whole is not None and fit_together(model, [whole])
        assert not any(fit_together(model, [whole, d]) for d in devices)
    else:
        assert whole is None


@pytest.mark.parametrize("hardware", ["h100-80gb", "a100-40gb", "a100-80gb", "h200-141gb"])
def test_largest_totals_are_those_of_the_largest_valid_configurations(root: Path, hardware: str) -> None:
    """The GPU's counters are the most any valid configuration uses of each: the same as summing every
    configuration `valid_configurations` yields (the counters' shared capacity rests on it)."""
    _hw, discovery = _discover(root, hardware)
    profiles = discovery.gpus[0].mig_profiles
    names = ["memory", *(name for _c, name, _f in mig_geometry.ENGINE_DIMENSIONS)]
    configurations = list(mig_geometry.valid_configurations(profiles))
    brute = {name: max(sum(p.amount(name) for p in config) for config in configurations) for name in names}
    assert mig_geometry.max_configuration_totals(profiles) == brute
    assert brute["memory"] > 0 and brute["multiprocessors"] > 0


def test_every_mig_device_consumes_its_memory_slices(root: Path) -> None:
    _, discovery = _discover(root, "h100-80gb")
    model = build_device_model(discovery)
    for device in _mig_devices(model, 0):
        consumed: Mapping[str, int] = device.consumes_counters[0].counters
        slices = {int(k.rsplit("-", 1)[1]) for k in consumed if k.startswith("memory-slice-")}
        assert slices == memory_slices(device)


def test_naming_round_trip() -> None:
    name = naming.mig_device_name(3, "1g.10gb+me", 20, 6)
    assert name == "gpu-3-mig-1g10gb-me-20-6"
    parsed = naming.parse_mig_device_name(name)
    assert parsed is not None and (
        parsed.minor,
        parsed.profile_label,
        parsed.gi_profile_id,
        parsed.placement_start,
    ) == (3, "1g10gb-me", 20, 6)
    assert naming.parse_gpu_minor("gpu-12-shared") == 12 and naming.parse_gpu_minor("gpu-x") is None
    assert naming.parse_mig_device_name("gpu-1") is None


# Every profile-name form NVIDIA's driver can meet, with the device name it publishes. Source:
# kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/mig.go, MigSpecTuple.ToCanonicalName (dots
# removed, then toRFC1123Compliant: lower case, [^a-z0-9-.] -> "-", "-" trimmed) fed with go-nvlib's
# MigProfileInfo.String() ("<G>g.<GB>gb", "+" attributes joined by ",", or "-" negative attributes: me,
# me.all, gfx); the full GPU from deviceinfo.go GpuInfo.CanonicalName ("gpu-%d" of the minor).
# (The profile ids below are illustrative: a name embeds whatever id NVML reports.)
@pytest.mark.parametrize(
    ("profile", "gi_profile_id", "start", "expected"),
    [
        ("1g.10gb", 19, 6, "gpu-0-mig-1g10gb-19-6"),
        ("7g.80gb", 0, 0, "gpu-0-mig-7g80gb-0-0"),
        ("1g.10gb+me", 20, 0, "gpu-0-mig-1g10gb-me-20-0"),
        ("1g.10gb-me", 47, 1, "gpu-0-mig-1g10gb-me-47-1"),
        ("1g.24gb+me.all", 50, 2, "gpu-0-mig-1g24gb-meall-50-2"),
        ("2g.48gb-me", 51, 4, "gpu-0-mig-2g48gb-me-51-4"),
        ("1g.24gb+gfx", 47, 3, "gpu-0-mig-1g24gb-gfx-47-3"),
        ("4g.96gb+gfx", 32, 0, "gpu-0-mig-4g96gb-gfx-32-0"),
        ("MIG 1g.10gb+me,gfx", 20, 0, "gpu-0-mig-mig-1g10gb-me-gfx-20-0"),  # every odd character -> "-"
        ("1g.10gb+", 19, 0, "gpu-0-mig-1g10gb-19-0"),  # trailing "-" trimmed
    ],
)
def test_mig_names_match_nvidia(profile: str, gi_profile_id: int, start: int, expected: str) -> None:
    name = naming.mig_device_name(0, profile, gi_profile_id, start)
    assert name == expected and naming.is_dns_label(name)
    parsed = naming.parse_mig_device_name(name)
    assert parsed is not None and (parsed.gi_profile_id, parsed.placement_start) == (gi_profile_id, start)


def test_gpu_and_counter_names_match_nvidia() -> None:
    assert naming.gpu_device_name(12) == "gpu-12"  # deviceinfo.go: GpuInfo.CanonicalName
    # partitions.go: GetSharedCounterSetName, memsliceCounterName
    assert naming.counter_set_name(3) == "gpu-3-counter-set"
    assert naming.memory_slice_counter(5) == "memory-slice-5"


def _go_nvlib_profile_gb(memory_mib: int, device_mib: int) -> int:
    """The `<GB>` of a MIG profile name as go-nvlib computes it (mig_profile.go getMigMemorySizeGB, which
    NVIDIA's driver uses for names and the `profile` attribute): the profile's share of the device rounded up
    to 1/8, times the device's memory in whole GB rounded up, rounded half away from zero."""
    share = math.ceil(memory_mib / device_mib * 8) / 8
    return math.floor(share * math.ceil(device_mib / 1024) + 0.5)


@pytest.mark.parametrize("gpu", sorted(GPU_PROFILES))
def test_simulated_profile_names_are_what_nvidia_computes(gpu: str) -> None:
    """We take the profile name NVML reports; NVIDIA's driver computes it. On every simulated GPU the two
    agree, so device names and `profile` attributes are NVIDIA's for the same hardware."""
    board = GPU_PROFILES[gpu]
    for spec in board.mig_profiles:
        gb = int(spec.name.split(".")[1].split("gb")[0])
        assert gb == _go_nvlib_profile_gb(spec.memory_mib, board.memory_mib), spec.name


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("570.133.20", "570.133.20"),
        ("535.183.01", "535.183.1"),
        ("550.54", "550.54.0"),
        ("470", "470.0.0"),
        ("garbage", "0.0.0"),
    ],
)
def test_driver_version_as_semver(raw: str, expected: str) -> None:
    assert semver(raw) == expected


def test_pre_volta_gpu_gets_no_share_device(root: Path) -> None:
    """Fractional shares are enforced by Volta MPS limits: a Tesla P4 (6.1) publishes only the whole GPU."""
    _, discovery = _discover(root, "single-p4")
    model = build_device_model(discovery, ModelOptions(dynamic_mig=True, fractional=True))
    assert [(d.name, d.kind) for d in model.devices] == [("gpu-0", DeviceKind.GPU)]
    gpu = model.devices[0]
    assert gpu.consumes_counters == () and model.counter_sets == ()  # nothing else shares it
    assert (gpu.attributes["architecture"].value, gpu.attributes["cudaComputeCapability"].value) == (
        "Pascal",
        "6.1.0",
    )
    assert {k: c.value for k, c in gpu.capacity.items()} == {"memory": 7680 * 2**20, "multiprocessors": 20}
    assert len(model.warnings) == 1
    assert "gpu-0-shared not published" in model.warnings[0] and "6.1" in model.warnings[0]
    assert "Tesla P4" in model.warnings[0] and discovery.gpus[0].uuid in model.warnings[0]
    assert build_device_model(discovery, ModelOptions(fractional=False)).warnings == ()  # not asked: no noise


@pytest.mark.parametrize(("capability", "shared"), [((6, 2), False), ((7, 0), True)])
def test_share_device_needs_volta(root: Path, capability: tuple[int, int], shared: bool) -> None:
    """The cut-off is compute capability 7.0 (Volta), whatever the board is called."""
    _, discovery = _discover(root, "single-p4")
    gpu = dataclasses.replace(discovery.gpus[0], cuda_compute_capability=capability)
    model = build_device_model(dataclasses.replace(discovery, gpus=(gpu,)))
    assert ("gpu-0-shared" in model.by_name()) is shared
    assert (model.warnings == ()) is shared
