"""DiscoveryResult -> DeviceModel: what the node offers, in DRA terms (pure).

What each GPU contributes:
- whole GPU `gpu-<minor>` (type `gpu`), unless the GPU is in MIG mode (a GPU in MIG mode is no usable whole
  GPU), except while that MIG mode only serves MIG devices this driver made for claims on a GPU that can
  switch it off at run time (then the counters keep the whole GPU unallocatable and the slice stays still);
- dynamic MIG (`ModelOptions.dynamic_mig`): every (profile, placement) pair as a `mig` device, on GPUs that
  can
  create MIG devices now: Hopper+ whatever the MIG mode (the plugin enables MIG on demand), Ampere only while
  MIG is
  already enabled (enabling it needs a GPU reset). Instances that exist are split by `owned_mig`, the
  (parent UUID, GPU-instance id) pairs the plugin created for checkpointed claims: an owned instance changes
  nothing (the scheduler already accounts for it through its claim's allocation and counters, and hiding the
  allocated device would strand the claim); any other instance (made out of band, e.g. with nvidia-smi or
  mig-parted; the plugin destroys only leftovers of its own at start-up) is published as a `mig` device with
  its `uuid` (kind MIG_STATIC), and the whole GPU, the share device and every placement whose memory slices
  overlap it are left out, so the pool offers only what is really free. A GPU instance without a compute
  instance is no device, but takes its memory slices all the same;
- static MIG (dynamic_mig off): the MIG devices that exist now (type `mig`, with their `uuid`); MIG enabled
  without
  instances contributes nothing and a warning;
- fractional share `gpu-<minor>-shared` (type `gpu-share`, `ModelOptions.fractional`) wherever the whole GPU
  is
  published and the GPU is Volta (compute capability 7.0) or newer: `allowMultipleAllocations`, consumable
  `memory` and `compute` (percent of SMs). Shares are enforced with MPS's per-client limits
  (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`), which only Volta MPS has; on
  older GPUs (Tesla P4) the share device is left out with a warning and only the whole GPU is published.

Exclusion comes only from counters (set `gpu-<minor>-counter-set`): the whole GPU and the share device consume
every
counter, a MIG device its engines, memory and `memory-slice-<i>` counters (see `mig_geometry`).

Order (the scheduler takes the first device that fits, within a slice in list order): GPUs by minor number
(numeric,
not string order); per GPU the whole GPU, then MIG devices profile by profile in NVML's order with the
placements of
a profile from the highest start to the lowest, then the share device. Highest start first fills memory from
the top,
keeping the low starts that the large profiles need (4g and 7g only fit at 0) free as long as possible.

Attributes: NVIDIA's names and types (`type`, `uuid`, `productName`, `brand`, `architecture`,
`cudaComputeCapability`, `driverVersion`, `cudaDriverVersion`, `resource.kubernetes.io/pciBusID`,
`resource.kubernetes.io/pcieRoot`, `resource.kubernetes.io/numaNode` (left out when the platform reports
none), `addressingMode` (`HMM`, `ATS` or `None`; left out where NVML cannot tell), and on MIG `parentUUID`,
`profile`) plus ours: `interconnect` (`nvswitch-0`, `nvlink` or `pcie`), and on MIG `placementStart`,
`memorySlices`, `computeSlices` (ints). Dynamic MIG devices have no `uuid` (the instance does not exist yet);
otherwise every device of one type has the same attribute set.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

from dra_gpu.hardware.types import (
    DiscoveryResult,
    GpuInfo,
    MigGpuInstance,
    MigInstance,
    MigPlacement,
    MigProfileInfo,
)
from dra_gpu.inventory import mig_geometry, naming
from dra_gpu.inventory.consumable_shares import DISABLED, ConsumableShares, apply_consumable_shares
from dra_gpu.inventory.model import (
    Attribute,
    Capacity,
    CounterConsumption,
    CounterSet,
    Device,
    DeviceKind,
    DeviceModel,
    MigSpec,
    RequestPolicy,
)

GIB = 1024 * 1024 * 1024
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
NUMA_NODE = "resource.kubernetes.io/numaNode"
SHARE_COMPUTE_PERCENT = 100
# Volta MPS: the first compute capability whose MPS enforces per-client SM and memory limits.
MIN_SHARE_COMPUTE_CAPABILITY = (7, 0)


@dataclass(frozen=True)
class ModelOptions:
    dynamic_mig: bool = True
    fractional: bool = True
    share_memory_step: int = GIB  # smallest memory a share request may ask for, and its granularity
    share_compute_min: int = 5  # percent of SMs
    share_compute_default: int = 10
    # NVIDIA's --consumable-shares: whole GPUs and existing MIG devices shared by several claims
    consumable_shares: ConsumableShares = DISABLED


# (parent GPU UUID, GPU-instance id) of the MIG instances the plugin created for checkpointed claims
OwnedMig = Collection[tuple[str, int]]

_VERSION_PARTS = re.compile(r"^\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")


def semver(version: str) -> str:
    """A driver version as strict semver: "535.183.01" -> "535.183.1", "550.54" -> "550.54.0"."""
    match = _VERSION_PARTS.match(version)
    if match is None:
        return "0.0.0"
    return ".".join(str(int(part or 0)) for part in match.groups())


def _common_attributes(gpu: GpuInfo, discovery: DiscoveryResult) -> dict[str, Attribute]:
    cc_major, cc_minor = gpu.cuda_compute_capability
    cuda_major, cuda_minor = discovery.cuda_driver_version
    attrs = {
        "productName": Attribute("string", gpu.product_name[:64]),
        "brand": Attribute("string", gpu.brand),
        "architecture": Attribute("string", gpu.architecture),
        "cudaComputeCapability": Attribute("version", f"{cc_major}.{cc_minor}.0"),
        "driverVersion": Attribute("version", semver(discovery.driver_version)),
        "cudaDriverVersion": Attribute("version", f"{cuda_major}.{cuda_minor}.0"),
        PCI_BUS_ID: Attribute("string", gpu.pci_bus_id),
        "interconnect": Attribute("string", gpu.interconnect or "pcie"),
    }
    if gpu.pcie_root:
        attrs[PCIE_ROOT] = Attribute("string", gpu.pcie_root)
    if gpu.numa_node is not None and gpu.numa_node >= 0:
        # A one-element list (KEP-5491/6072): the slice builder publishes it as `int` unless list-typed
        # attributes are on (then `ints: [n]`), as NVIDIA's driver does; left out when unknown, as there.
        attrs[NUMA_NODE] = Attribute("ints", (gpu.numa_node,))
    if gpu.addressing_mode is not None:
        attrs["addressingMode"] = Attribute("string", gpu.addressing_mode)
    return attrs


def _dynamic_mig_possible(gpu: GpuInfo) -> bool:
    return gpu.mig_capable and bool(gpu.mig_profiles) and (gpu.mig_toggle_without_reset or gpu.mig_enabled)


def _publishes_whole_gpu(gpu: GpuInfo, options: ModelOptions, owned_mig: OwnedMig) -> bool:
    """MIG mode on: CUDA sees only MIG devices, so a whole-GPU allocation would hand out a GPU no container
    can use (prepare does not switch MIG mode off), and the GPU is not offered whole. One exception keeps the
    slices still while claims come and go: MIG mode that is on only because of MIG devices this driver made
    for claims (Hopper+, dynamic MIG), where the counters already keep the whole GPU from being allocated
    and the driver switches MIG mode off again with the last of them."""
    if not gpu.mig_enabled:
        return True
    ids = [i.gi_id for i in gpu.mig_instances] + [g.gi_id for g in gpu.mig_empty_gpu_instances]
    ours = any((gpu.uuid, gi_id) in owned_mig for gi_id in ids)
    return options.dynamic_mig and gpu.mig_toggle_without_reset and ours


def _supports_shares(gpu: GpuInfo) -> bool:
    return gpu.cuda_compute_capability >= MIN_SHARE_COMPUTE_CAPABILITY


def _counter_set(gpu: GpuInfo, with_mig: bool) -> CounterSet:
    counters: dict[str, int] = {"multiprocessors": gpu.multiprocessors, "memory": gpu.memory_bytes}
    if with_mig:
        totals = mig_geometry.max_configuration_totals(gpu.mig_profiles)
        for _capacity, name, _field in mig_geometry.ENGINE_DIMENSIONS:
            counters[name] = max(counters.get(name, 0), totals[name])
        counters["memory"] = max(counters["memory"], totals["memory"])
        for i in range(mig_geometry.memory_slice_count(gpu.mig_profiles)):
            counters[naming.memory_slice_counter(i)] = 1
    return CounterSet(naming.counter_set_name(gpu.minor), counters)


def _largest_mig_engines(gpu: GpuInfo) -> dict[str, Capacity]:
    """With dynamic MIG, NVIDIA's whole GPU carries each MIG capacity at its largest value over the GPU's MIG
    profiles (its `maxCapacities`), so a selector on `copyEngines` and the like matches the whole GPU too.
    These are the engine counts; `memory` and `multiprocessors` stay the device's own (see
    docs/differences-from-nvidia.md)."""
    return {
        capacity: Capacity(max((int(getattr(p, field)) for p in gpu.mig_profiles), default=0))
        for capacity, _counter, field in mig_geometry.ENGINE_DIMENSIONS
        if capacity != "multiprocessors"
    }


def _consume_all(counter_set: CounterSet) -> tuple[CounterConsumption, ...]:
    return (CounterConsumption(counter_set.name, {k: v for k, v in counter_set.counters.items() if v > 0}),)


def _mig_device(
    gpu: GpuInfo,
    discovery: DiscoveryResult,
    profile: MigProfileInfo,
    start: int,
    counter_set: CounterSet | None,
    instance: MigInstance | None,
) -> Device:
    attrs: dict[str, Attribute] = {"type": Attribute("string", "mig")}
    if instance is not None:
        attrs["uuid"] = Attribute("string", instance.uuid)
    attrs["parentUUID"] = Attribute("string", gpu.uuid)
    attrs["profile"] = Attribute("string", profile.name)
    attrs.update(_common_attributes(gpu, discovery))
    attrs["placementStart"] = Attribute("int", start)
    attrs["memorySlices"] = Attribute("int", profile.memory_slices)
    attrs["computeSlices"] = Attribute("int", profile.compute_slices)
    capacity = {"memory": Capacity(profile.memory_mib * mig_geometry.MIB, binary_si=True)}
    for cap_name, _counter, field in mig_geometry.ENGINE_DIMENSIONS:
        capacity[cap_name] = Capacity(int(getattr(profile, field)))
    consumes: tuple[CounterConsumption, ...] = ()
    if counter_set is not None:
        placement = mig_geometry.Placement(profile, start)
        amounts = {name: placement.amount(name) for name in counter_set.counters}
        consumes = (CounterConsumption(counter_set.name, {k: v for k, v in amounts.items() if v > 0}),)
    return Device(
        name=naming.mig_device_name(gpu.minor, profile.name, profile.gi_profile_id, start),
        kind=DeviceKind.MIG_STATIC if instance is not None else DeviceKind.MIG_DYNAMIC,
        parent_uuid=gpu.uuid,
        parent_minor=gpu.minor,
        attributes=attrs,
        capacity=capacity,
        consumes_counters=consumes,
        mig=MigSpec(
            profile=profile.name,
            gi_profile_id=profile.gi_profile_id,
            placement_start=start,
            placement_size=profile.memory_slices,
            uuid=instance.uuid if instance else None,
            gi_id=instance.gi_id if instance else None,
            ci_id=instance.ci_id if instance else None,
        ),
    )


def _overlaps(a: MigPlacement, b: MigPlacement) -> bool:
    return a.start < b.start + b.size and b.start < a.start + a.size


def _foreign_instances(gpu: GpuInfo, owned_mig: OwnedMig) -> list[MigInstance]:
    """The MIG instances on `gpu` that no claim of ours owns (made out of band)."""
    return [i for i in gpu.mig_instances if (gpu.uuid, i.gi_id) not in owned_mig]


def _foreign_empty_gpu_instances(gpu: GpuInfo, owned_mig: OwnedMig) -> list[MigGpuInstance]:
    """GPU instances without a compute instance that no claim of ours owns: nothing to publish, but their
    memory slices are taken (ours pass through this state while being created)."""
    return [g for g in gpu.mig_empty_gpu_instances if (gpu.uuid, g.gi_id) not in owned_mig]


def _publishable_instances(
    gpu: GpuInfo, instances: Collection[MigInstance], warnings: list[str]
) -> list[tuple[MigProfileInfo, MigInstance]]:
    """The instances that can be published as devices, with their profile, ordered by GPU instance.

    A device name says profile and placement, i.e. one GPU instance: a GPU instance split into several compute
    instances is published once (its first compute instance), the others are named in a warning. An instance
    of a profile that discovery did not list is not published (its capacities are unknown).
    """
    by_id = {p.gi_profile_id: p for p in gpu.mig_profiles}
    chosen: dict[int, tuple[MigProfileInfo, MigInstance]] = {}
    for instance in sorted(instances, key=lambda m: (m.gi_id, m.ci_id)):
        known = by_id.get(instance.gi_profile_id)
        if known is None:
            warnings.append(
                f"GPU {gpu.minor}: MIG device {instance.uuid} has unknown profile id "
                f"{instance.gi_profile_id}; not published"
            )
        elif instance.gi_id in chosen:
            first = chosen[instance.gi_id][1]
            warnings.append(
                f"GPU {gpu.minor}: MIG device {instance.uuid} is compute instance {instance.ci_id} of GPU "
                f"instance {instance.gi_id}, already published as {first.uuid}; not published separately"
            )
        else:
            chosen[instance.gi_id] = (known, instance)
    return list(chosen.values())


def _dynamic_mig_devices(
    gpu: GpuInfo,
    discovery: DiscoveryResult,
    counter_set: CounterSet | None,
    foreign: Collection[MigInstance],
    taken: Collection[MigPlacement],
    warnings: list[str],
) -> list[Device]:
    """Every (profile, placement) that is free, in publishing order; an out-of-band instance takes the place
    of the placement it occupies (same name, now with its uuid); nothing overlapping `taken` is offered."""
    static_at = {
        (profile.gi_profile_id, instance.placement.start): (profile, instance)
        for profile, instance in _publishable_instances(gpu, foreign, warnings)
    }
    devices: list[Device] = []
    for profile in gpu.mig_profiles:
        for placement in sorted(profile.placements, key=lambda p: -p.start):
            found = static_at.pop((profile.gi_profile_id, placement.start), None)
            if found is not None:
                devices.append(_mig_device(gpu, discovery, profile, placement.start, counter_set, found[1]))
            elif not any(_overlaps(placement, t) for t in taken):
                devices.append(_mig_device(gpu, discovery, profile, placement.start, counter_set, None))
    for profile, instance in static_at.values():  # at a placement discovery did not list: still real
        devices.append(_mig_device(gpu, discovery, profile, instance.placement.start, counter_set, instance))
    return devices


def _gpu_devices(
    gpu: GpuInfo, discovery: DiscoveryResult, options: ModelOptions, owned_mig: OwnedMig
) -> tuple[list[Device], CounterSet | None, list[str]]:
    warnings: list[str] = []
    dynamic = options.dynamic_mig and _dynamic_mig_possible(gpu)
    foreign = _foreign_instances(gpu, owned_mig) if dynamic else []
    foreign_empty = _foreign_empty_gpu_instances(gpu, owned_mig) if dynamic else []
    taken = [i.placement for i in foreign] + [g.placement for g in foreign_empty]
    whole = _publishes_whole_gpu(gpu, options, owned_mig) and not taken
    share = whole and options.fractional and _supports_shares(gpu)
    if foreign:
        warnings.append(
            f"GPU {gpu.minor} ({gpu.uuid}) has MIG device(s) made outside this driver "
            f"({', '.join(sorted(i.uuid for i in foreign))}): published as they are; the placements they "
            "overlap (and the whole GPU and its share device) are withheld until they are destroyed"
        )
    if foreign_empty:
        at = ", ".join(f"gi {g.gi_id} at {g.placement.start}:{g.placement.size}" for g in foreign_empty)
        warnings.append(
            f"GPU {gpu.minor} ({gpu.uuid}) has GPU instance(s) without a compute instance made outside "
            f"this driver ({at}): nothing usable to publish; the placements they overlap (and the whole GPU "
            "and its share device) are withheld until they are destroyed"
        )
    if whole and options.fractional and not share:
        major, minor = gpu.cuda_compute_capability
        warnings.append(
            f"GPU {gpu.minor} ({gpu.uuid}, {gpu.product_name}) has compute capability {major}.{minor}: "
            f"fractional share device {naming.share_device_name(gpu.minor)} not published (MPS memory and "
            "compute limits need Volta, 7.0, or newer); the whole GPU is published"
        )
    counter_set = _counter_set(gpu, with_mig=dynamic) if (dynamic or share) else None
    common = _common_attributes(gpu, discovery)
    devices: list[Device] = []
    if whole:
        attrs = {"type": Attribute("string", "gpu"), "uuid": Attribute("string", gpu.uuid), **common}
        devices.append(
            Device(
                name=naming.gpu_device_name(gpu.minor),
                kind=DeviceKind.GPU,
                parent_uuid=gpu.uuid,
                parent_minor=gpu.minor,
                attributes=attrs,
                capacity={
                    "memory": Capacity(gpu.memory_bytes, binary_si=True),
                    "multiprocessors": Capacity(gpu.multiprocessors),
                    **(_largest_mig_engines(gpu) if dynamic else {}),
                },
                consumes_counters=_consume_all(counter_set) if counter_set else (),
            )
        )
    if dynamic:
        devices.extend(_dynamic_mig_devices(gpu, discovery, counter_set, foreign, taken, warnings))
    elif gpu.mig_enabled:
        if not gpu.mig_instances:
            warnings.append(
                f"GPU {gpu.minor} ({gpu.uuid}) has MIG enabled but no MIG devices: nothing to publish"
            )
        for profile, instance in _publishable_instances(gpu, gpu.mig_instances, warnings):
            devices.append(_mig_device(gpu, discovery, profile, instance.placement.start, None, instance))
    if share:
        memory_min = min(options.share_memory_step, gpu.memory_bytes)
        attrs = {"type": Attribute("string", "gpu-share"), "uuid": Attribute("string", gpu.uuid), **common}
        devices.append(
            Device(
                name=naming.share_device_name(gpu.minor),
                kind=DeviceKind.GPU_SHARE,
                parent_uuid=gpu.uuid,
                parent_minor=gpu.minor,
                attributes=attrs,
                capacity={
                    "memory": Capacity(
                        gpu.memory_bytes,
                        binary_si=True,
                        request_policy=RequestPolicy(
                            default=memory_min, valid_range_min=memory_min, valid_range_step=memory_min
                        ),
                    ),
                    "compute": Capacity(
                        SHARE_COMPUTE_PERCENT,
                        request_policy=RequestPolicy(
                            default=options.share_compute_default,
                            valid_range_min=options.share_compute_min,
                            valid_range_step=options.share_compute_min,
                        ),
                    ),
                },
                consumes_counters=_consume_all(counter_set) if counter_set else (),
                allow_multiple_allocations=True,
            )
        )
    return devices, counter_set, warnings


def build_device_model(
    discovery: DiscoveryResult, options: ModelOptions | None = None, owned_mig: OwnedMig = frozenset()
) -> DeviceModel:
    """The node's device model. `owned_mig`: (parent GPU UUID, GPU-instance id) of every MIG instance the
    plugin created for a checkpointed claim (dynamic MIG only; see the module docstring)."""
    options = options or ModelOptions()
    devices: list[Device] = []
    counter_sets: list[CounterSet] = []
    warnings: list[str] = [e.message for e in discovery.errors]  # messages already name the GPU
    for gpu in sorted(discovery.gpus, key=lambda g: g.minor):
        gpu_devices, counter_set, gpu_warnings = _gpu_devices(gpu, discovery, options, owned_mig)
        devices.extend(apply_consumable_shares(d, options.consumable_shares) for d in gpu_devices)
        warnings.extend(gpu_warnings)
        if counter_set is not None:
            counter_sets.append(counter_set)
    return DeviceModel(devices=tuple(devices), counter_sets=tuple(counter_sets), warnings=tuple(warnings))
