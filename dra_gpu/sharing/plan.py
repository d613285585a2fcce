"""What a group's config asks of its devices, checked before anything is touched (pure, no I/O).

`build_plan(config, devices, gpus)` turns a decoded `GpuConfig` / `MigDeviceConfig` (or None) and the group's
allocated devices into a `SharingPlan`: MIG devices to create, GPUs to time-slice, the MPS daemon of the group
and the fractional shares to enforce. Every combination that cannot work is refused here with a message that
names the device and the fix, so the manager only has to execute.

Semantics of the combinations:
- TimeSlicing in a `GpuConfig` sets the GPU-global time-slice interval of the group's full GPUs.
- TimeSlicing in a `MigDeviceConfig` is accepted and changes nothing: processes that share a MIG device are
  time-sliced by the GPU's scheduler by default, and the interval is a whole-GPU setting that other MIG
  devices on the same GPU would feel. It is recorded in the group state so that `dra-gpu` can show what was
  asked.
- MPS starts one control daemon for the group, over its full GPUs and/or MIG devices (MPS runs per MIG device
  on a MIG-enabled GPU). Pre-Volta GPUs (compute capability < 7.0) cannot run it.
- A whole GPU shared by `--consumable-shares` (allowMultipleAllocations, the result has a shareID) whose claim
  consumed part of its memory, or whose config asks for MPS, is a share of the GPU's shares server like a
  GPU_SHARE device (pinned memory = the consumed memory, else the MPS config's limit, else the whole GPU;
  compute = the MPS config's percentage, else every SM) when the group holds nothing else; otherwise it is
  given as NVIDIA's driver gives it, without limits. MPS on a shared MIG device is refused (one claim's daemon
  would take it from the others).
- A fractional share (GPU_SHARE device) is always enforced with MPS limits taken from its consumed capacity:
  the claim is a client of its GPU's one shares server (manager.py says why one), with its share as client
  limits. A group with shares may hold only shares of one GPU: a container connects to exactly one MPS daemon
  (`CUDA_MPS_PIPE_DIRECTORY`), and a full GPU next to it would be hidden behind that daemon.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from dra_gpu.config.names import TIME_SLICE_VALUES, ConfigError, is_gpu_config, is_mig_device_config
from dra_gpu.config.quantity import MIB, QuantityError, parse_quantity
from dra_gpu.hardware.types import GpuInfo
from dra_gpu.inventory.model import Device, DeviceKind
from dra_gpu.sharing.interface import AllocatedDevice, SharingError

if TYPE_CHECKING:  # the models load with the first claim that has a config (dra_gpu.config.names)
    from dra_gpu.config.api import GpuConfig, MigDeviceConfig, MpsConfig

MPS_MIN_COMPUTE_CAPABILITY = (7, 0)  # Volta: MPS with per-client limits
SHARE_CAPACITY_COMPUTE = "compute"  # percent of the GPU's SMs
SHARE_CAPACITY_MEMORY = "memory"  # bytes


@dataclass(frozen=True)
class SharePlan:
    """The fractional shares of one physical GPU in this group, summed (one process gets all of them)."""

    gpu_uuid: str
    gpu_minor: int
    device_names: tuple[str, ...]
    client_keys: tuple[str, ...]  # "<device>/<shareID>": one per allocation result
    compute_percent: int
    memory_bytes: int  # rounded down to whole MiB
    mps_config: MpsConfig | None = None  # an explicit MPS config (its limits are already folded in above)


@dataclass(frozen=True)
class MpsPlan:
    """One MPS control daemon for the group's full GPUs and MIG devices."""

    full_gpu_uuids: tuple[str, ...]  # compute mode EXCLUSIVE_PROCESS is set on these
    static_uuids: tuple[str, ...]  # device UUIDs known before prepare (full GPUs, static MIG)
    dynamic_mig_devices: tuple[str, ...]  # device names whose UUID exists only after creation
    config: MpsConfig
    memory_bytes: Mapping[str, int]  # device name -> memory, to clamp a limit larger than the device


@dataclass(frozen=True)
class SharingPlan:
    strategy: str | None  # "TimeSlicing", "MPS" or None
    create_mig: tuple[AllocatedDevice, ...] = ()
    time_slice_interval: int | None = None
    time_slice_gpus: tuple[str, ...] = ()
    mig_time_slicing: tuple[str, ...] = ()  # MIG device names shared by time-slicing (recorded only)
    mps: MpsPlan | None = None
    shares: SharePlan | None = None
    skipped_admin: tuple[str, ...] = field(default=())  # admin-access devices: observed, never reconfigured


def takes_devices_as_they_are(config: object | None, devices: Sequence[AllocatedDevice]) -> bool:
    """True when `build_plan` for this group is certain to plan nothing that changes the hardware (no MIG
    instance, time slice, MPS daemon or share): no config, and only whole GPUs and existing MIG devices, none
    of them a share. What prepare_group does for such a group leaves nothing to undo."""
    as_is = (DeviceKind.GPU, DeviceKind.MIG_STATIC)
    return config is None and all(
        d.device.kind in as_is and d.share_id is None and not d.consumed_capacity for d in devices
    )


def build_plan(
    config: object | None, devices: Sequence[AllocatedDevice], gpus: Mapping[str, GpuInfo]
) -> SharingPlan:
    """Check `config` against `devices` and their physical GPUs (`gpus`); SharingError if it cannot apply."""
    if config is not None and not (is_gpu_config(config) or is_mig_device_config(config)):
        raise SharingError(
            f"unsupported config object {type(config).__name__}: expected GpuConfig or MigDeviceConfig"
        )
    active = [d for d in devices if not d.admin_access]
    admin = tuple(d.device.name for d in devices if d.admin_access)
    _check_kinds(config, active)
    strategy = config.strategy if config is not None else None
    create_mig = tuple(d for d in active if d.device.kind is DeviceKind.MIG_DYNAMIC)
    plan = SharingPlan(strategy=strategy, create_mig=create_mig, skipped_admin=admin)

    shares = [d for d in active if d.device.kind is DeviceKind.GPU_SHARE]
    if shares:
        share_plan = _share_plan(shares, active, config, gpus)
        return _replace(plan, shares=share_plan)
    gpu_shares = consumable_shares_served_by_mps(config, active, lambda uuid: _mps_capable(gpus.get(uuid)))
    if gpu_shares:
        return _replace(plan, shares=_share_plan(gpu_shares, active, config, gpus))

    full = [d for d in active if d.device.kind is DeviceKind.GPU]
    migs = [d for d in active if d.device.kind in (DeviceKind.MIG_STATIC, DeviceKind.MIG_DYNAMIC)]
    if is_gpu_config(config) and config.time_slice_interval is not None:
        uuids = tuple(sorted({d.device.parent_uuid for d in full}))
        return _replace(
            plan, time_slice_interval=TIME_SLICE_VALUES[config.time_slice_interval], time_slice_gpus=uuids
        )
    if is_mig_device_config(config) and config.strategy == "TimeSlicing":
        return _replace(plan, mig_time_slicing=tuple(d.device.name for d in migs))
    mps_config = config.mps_config if config is not None else None
    if mps_config is not None:
        _refuse_mps_on_shared(full + migs)
    if mps_config is not None and (full or migs):
        for d in full + migs:
            _require_mps_capable(d, gpus)
        static = []
        dynamic = []
        for d in full + migs:
            if d.device.kind is DeviceKind.GPU:
                static.append(d.device.parent_uuid)
            elif d.device.kind is DeviceKind.MIG_STATIC and d.device.mig is not None and d.device.mig.uuid:
                static.append(d.device.mig.uuid)
            elif d.device.kind is DeviceKind.MIG_DYNAMIC:
                dynamic.append(d.device.name)
            else:
                raise SharingError(f"MIG device {d.device.name} has no UUID: it does not exist on the GPU")
        memory = {d.device.name: _device_memory(d, gpus) for d in full + migs}
        mps = MpsPlan(
            full_gpu_uuids=tuple(sorted({d.device.parent_uuid for d in full})),
            static_uuids=tuple(static),
            dynamic_mig_devices=tuple(dynamic),
            config=mps_config,
            memory_bytes=memory,
        )
        return _replace(plan, mps=mps)
    return plan


def _replace(plan: SharingPlan, **changes: object) -> SharingPlan:
    return replace(plan, **changes)  # type: ignore[arg-type]


def _kind_words(kind: DeviceKind) -> str:
    return {
        DeviceKind.GPU: "a full GPU",
        DeviceKind.MIG_STATIC: "a MIG device",
        DeviceKind.MIG_DYNAMIC: "a MIG device",
        DeviceKind.GPU_SHARE: "a fractional GPU share",
    }[kind]


def _check_kinds(config: GpuConfig | MigDeviceConfig | None, devices: Sequence[AllocatedDevice]) -> None:
    for d in devices:
        kind = d.device.kind
        is_mig = kind in (DeviceKind.MIG_STATIC, DeviceKind.MIG_DYNAMIC)
        if is_mig_device_config(config) and not is_mig:
            raise SharingError(
                f"cannot apply MigDeviceConfig to device {d.device.name} ({_kind_words(kind)}): "
                "use a GpuConfig for full GPUs and GPU shares"
            )
        if is_gpu_config(config) and is_mig and config.sharing is not None:
            what = (
                "the time-slice interval is a whole-GPU setting"
                if config.strategy == "TimeSlicing"
                else "MPS on MIG devices is configured per MIG device"
            )
            raise SharingError(
                f"cannot apply GpuConfig sharing strategy {config.strategy} to device {d.device.name} "
                f"({_kind_words(kind)}): {what}; use a MigDeviceConfig for MIG devices"
            )
        if kind is DeviceKind.GPU_SHARE and config is not None and config.strategy == "TimeSlicing":
            raise SharingError(
                f"cannot apply strategy TimeSlicing to device {d.device.name} (a fractional GPU share): "
                "shares are enforced with MPS limits from their consumed capacity; drop the sharing setting "
                "or use MPS"
            )


def _gpu(d: AllocatedDevice, gpus: Mapping[str, GpuInfo]) -> GpuInfo:
    info = gpus.get(d.device.parent_uuid)
    if info is None:
        raise SharingError(f"device {d.device.name}: GPU {d.device.parent_uuid} is not present on this node")
    return info


def _require_mps_capable(d: AllocatedDevice, gpus: Mapping[str, GpuInfo]) -> GpuInfo:
    info = _gpu(d, gpus)
    if info.cuda_compute_capability < MPS_MIN_COMPUTE_CAPABILITY:
        major, minor = info.cuda_compute_capability
        raise SharingError(
            f"cannot use MPS on device {d.device.name}: GPU {info.uuid} ({info.product_name}) has compute "
            f"capability {major}.{minor}, MPS with client limits needs 7.0 (Volta) or newer; "
            "use TimeSlicing or a whole GPU"
        )
    return info


def _device_memory(d: AllocatedDevice, gpus: Mapping[str, GpuInfo]) -> int:
    capacity = d.device.capacity.get("memory")
    if capacity is not None and d.device.kind is not DeviceKind.GPU_SHARE:
        return capacity.value
    return _gpu(d, gpus).memory_bytes


def _is_shared(d: AllocatedDevice) -> bool:
    """A whole GPU or MIG device that other claims may hold too (`--consumable-shares`): it has a shareID."""
    return d.device.allow_multiple_allocations and d.share_id is not None


def _memory_fraction(d: AllocatedDevice) -> bool:
    """A consumable share of a whole GPU that took part of its memory: enforceable like a GPU_SHARE device."""
    if d.device.kind is not DeviceKind.GPU or not _is_shared(d):
        return False
    text = d.consumed_capacity.get(SHARE_CAPACITY_MEMORY)
    capacity = d.device.capacity.get(SHARE_CAPACITY_MEMORY)
    if text is None or capacity is None:
        return False
    try:
        value = parse_quantity(str(text))
    except QuantityError:
        return False
    return 0 < value < capacity.value


def _mps_capable(info: GpuInfo | None) -> bool:
    return info is not None and info.cuda_compute_capability >= MPS_MIN_COMPUTE_CAPABILITY


def consumable_shares_served_by_mps(
    config: GpuConfig | MigDeviceConfig | None,
    active: Sequence[AllocatedDevice],
    mps_capable: Callable[[str], bool],
) -> list[AllocatedDevice]:
    """The group's consumable shares to serve from the GPU's shares server, or [] to give the GPU as NVIDIA's
    driver does (plain access, no limit). `active`: the group's devices without admin access; `mps_capable`:
    whether the GPU of that UUID runs MPS with client limits (Volta or newer).

    Served so when the group is nothing but consumable shares of one Volta+ GPU and either consumed part of
    its memory (a real limit, as for `gpu-<minor>-shared`) or asks for MPS (NVIDIA's MPS sharing on a
    consumable share: here the clients of one server run at the same time, each held to its config). Shares
    without MPS that consumed no memory (modes `unlimited` and N) or all of it have nothing to enforce.
    The prepare service asks this too, before anything is touched, to keep the two kinds apart on one GPU
    (dra_gpu/plugin/share_modes.py)."""
    wants_mps = config is not None and config.mps_config is not None
    shares = [
        d
        for d in active
        if _memory_fraction(d) or (wants_mps and d.device.kind is DeviceKind.GPU and _is_shared(d))
    ]
    if not shares or len(shares) != len(active) or len({d.device.parent_uuid for d in shares}) != 1:
        return []
    if config is not None and config.strategy == "TimeSlicing":
        return []
    if not mps_capable(shares[0].device.parent_uuid):
        return []
    return shares


def _refuse_mps_on_shared(devices: Sequence[AllocatedDevice]) -> None:
    shared = sorted({d.device.name for d in devices if _is_shared(d)})
    if shared:
        raise SharingError(
            f"cannot apply strategy MPS to {', '.join(shared)}: the device is shared with other claims "
            "(--consumable-shares), and an MPS daemon of one claim would take the device from the others; "
            "request part of its memory (capacity.requests.memory) with the device alone in the claim, "
            "which is enforced with MPS limits, or drop the MPS setting"
        )


def _share_plan(
    shares: Sequence[AllocatedDevice],
    active: Sequence[AllocatedDevice],
    config: GpuConfig | MigDeviceConfig | None,
    gpus: Mapping[str, GpuInfo],
) -> SharePlan:
    others = [d.device.name for d in active if d not in shares]
    parents = sorted({d.device.parent_uuid for d in shares})
    if others or len(parents) > 1:
        raise SharingError(
            "a config group with fractional GPU shares may hold shares of one GPU only (found "
            f"{', '.join(sorted({d.device.name for d in active}))}): a container connects to exactly one MPS "
            "daemon; put the other devices in a separate claim or give them their own config entry"
        )
    info = _require_mps_capable(shares[0], gpus)
    compute = 0
    memory = 0
    for d in shares:
        # a whole GPU shared by --consumable-shares has no compute capacity: it may use every SM
        has_compute = d.device.kind is DeviceKind.GPU_SHARE
        compute += _share_amount(d, SHARE_CAPACITY_COMPUTE) if has_compute else 100
        # a consumable share that took no memory (or all of it) may use the whole GPU's
        memory += (
            _share_amount(d, SHARE_CAPACITY_MEMORY)
            if has_compute or _memory_fraction(d)
            else info.memory_bytes
        )
    compute = min(compute, 100)
    memory = min(memory, info.memory_bytes)
    mps_config = config.mps_config if config is not None else None
    if mps_config is not None:
        # An explicit MPS config can only tighten what the shares were given.
        if mps_config.defaultActiveThreadPercentage is not None:
            compute = min(compute, mps_config.defaultActiveThreadPercentage)
        try:
            limits = mps_config.pinned_memory_limits([info.uuid], {info.uuid: info.memory_bytes})
        except ConfigError as err:
            raise SharingError(f"device {shares[0].device.name}: {err}") from None
        if info.uuid in limits:
            memory = min(memory, limits[info.uuid])
    if memory < MIB:
        raise SharingError(f"device {shares[0].device.name}: share memory {memory} bytes is below 1Mi")
    return SharePlan(
        gpu_uuid=info.uuid,
        gpu_minor=info.minor,
        device_names=tuple(d.device.name for d in shares),
        client_keys=tuple(f"{d.device.name}/{d.share_id or d.request}" for d in shares),
        compute_percent=compute,
        memory_bytes=memory - memory % MIB,
        mps_config=mps_config,
    )


def _share_amount(d: AllocatedDevice, capacity: str) -> int:
    text = d.consumed_capacity.get(capacity)
    if text is None:
        raise SharingError(
            f"device {d.device.name} (share {d.share_id or '?'}): the allocation has no consumedCapacity "
            f"{capacity!r}; fractional shares need the DRAConsumableCapacity feature in the scheduler"
        )
    try:
        value = parse_quantity(str(text))
    except QuantityError as err:
        raise SharingError(f"device {d.device.name}: consumedCapacity {capacity}: {err}") from None
    if value <= 0:
        raise SharingError(f"device {d.device.name}: consumedCapacity {capacity} must be > 0, got {text}")
    return value


def gpu_lock_keys(devices: Iterable[Device]) -> tuple[set[str], set[str]]:
    """The GPUs that work on `devices` locks, (exclusive, shared) as `GpuLocks.gpus` takes them: every device
    holds its GPU alone, a fractional share too (it joins or leaves the GPU's one shares server, whose
    clients and caps one share at a time may change). Shared is kept for the lock's callers' signature."""
    return {device.parent_uuid for device in devices}, set()
