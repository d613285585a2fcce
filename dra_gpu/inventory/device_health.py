"""GPU health -> device taints and health status (pure).

What the health monitor learned about each physical GPU (`GpuHealth`: XID events, lost, unmonitored) becomes
KEP-5055 device taints on the devices that GPU backs, following NVIDIA's table (nvidia-conventions §10):

| taint key | value | effect |
|---|---|---|
| `gpu.nvidia.com/xid` | the XID | fatal effect; `None` for ignorable XIDs (13, 31, 43, 45, 68, 109 + extra) |
| `gpu.nvidia.com/gpu-lost` | | fatal effect on every device of the GPU |
| `gpu.nvidia.com/unmonitored` | | `None` on every device of the GPU (event registration failed) |

An XID about the whole GPU (GI = CI = 0xFFFFFFFF) taints every device of the GPU: the full GPU, its MIG
devices (static and dynamic placements) and its share device. An XID inside a MIG instance taints the MIG
devices at that instance's placement (or, when the placement could not be read, the static MIG device with
those GI/CI ids).

The fatal effect is `NoSchedule` (new work stays away) or, with `HealthPolicy.fatal_effect = "NoExecute"`,
`NoExecute` (pods already using the device are evicted too: a GPU that fell off the bus or hit an
uncorrectable ECC error is not something a running job survives). A double-bit ECC event counts as XID 48.

Recovery (unlike NVIDIA's driver, which never removes a taint) needs proof, never the clock alone. A GPU's
XID taints go once the GPU is proven healthy again and no critical XID arrived for `recovery_quiet_s`:
- an NVML probe passes: NVML answers on the GPU and the driver reports recovery action
  (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) NONE: a reset has been done, or none was needed; or
- a reset was seen: the GPU stopped answering after the XID and answers again (it was reset or re-enumerated).
A driver that cannot report the recovery action therefore keeps the taint until the GPU has been reset.
`gpu-lost` goes as soon as NVML answers again. A negative quiet period keeps XID taints forever (NVIDIA's
behaviour).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from dra_gpu.hardware.types import ALL_INSTANCES, GpuProbe, XidEvent
from dra_gpu.inventory.model import Device, DeviceKind, DeviceModel, DeviceTaint, TaintEffect

XID_TAINT_KEY = "gpu.nvidia.com/xid"
GPU_LOST_TAINT_KEY = "gpu.nvidia.com/gpu-lost"
UNMONITORED_TAINT_KEY = "gpu.nvidia.com/unmonitored"
# Application errors and the like: the GPU itself is fine (NVIDIA's list).
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
_EFFECT_ORDER = {"NoExecute": 0, "NoSchedule": 1, "None": 2}


FATAL_EFFECTS: tuple[TaintEffect, ...] = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class HealthPolicy:
    additional_ignored_xids: frozenset[int] = frozenset()
    # after the GPU proved healthy, how long without a new XID before its taints go; < 0: never
    recovery_quiet_s: float = 300.0
    fatal_effect: TaintEffect = "NoSchedule"  # of XID and gpu-lost taints; NoExecute also evicts

    def __post_init__(self) -> None:
        if self.fatal_effect not in FATAL_EFFECTS:
            raise ValueError(
                f"device health taint effect {self.fatal_effect!r}: use one of {', '.join(FATAL_EFFECTS)}"
            )

    @property
    def ignored_xids(self) -> frozenset[int]:
        return DEFAULT_IGNORED_XIDS | self.additional_ignored_xids

    def xid_effect(self, xid: int) -> TaintEffect:
        return "None" if xid in self.ignored_xids else self.fatal_effect


@dataclass(frozen=True)
class GpuHealth:
    """What is wrong with one physical GPU. No problems at all: the monitor drops the entry."""

    uuid: str
    # one event per distinct (xid, GI, CI, placement), the first one seen (its time is the taint's timeAdded)
    xids: tuple[XidEvent, ...] = ()
    last_xid_time: float = 0.0
    lost_since: float | None = None
    unmonitored: str | None = None  # why no events could be registered
    reset_seen: bool = False  # the GPU stopped answering after its last XID (reset/re-enumerated since)

    @property
    def clean(self) -> bool:
        return not self.xids and self.lost_since is None and self.unmonitored is None


def parse_xid_list(text: str) -> frozenset[int]:
    """`--additional-xids-to-ignore` ("" or "48,74"): comma-separated positive integers."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) <= 0:
            raise ValueError(
                f"--additional-xids-to-ignore: {part!r} is not an XID number; give comma-separated "
                "positive integers such as '48,74'"
            )
        out.add(int(part))
    return frozenset(out)


def record_xid(health: GpuHealth | None, event: XidEvent) -> GpuHealth:
    current = health or GpuHealth(event.gpu_uuid)

    def same(e: XidEvent) -> bool:
        return (e.xid, e.gi_id, e.ci_id, e.gi_placement) == (
            event.xid,
            event.gi_id,
            event.ci_id,
            event.gi_placement,
        )

    xids = current.xids if any(same(e) for e in current.xids) else (*current.xids, event)
    # a new XID needs its own proof of recovery: a reset seen before it proves nothing about it
    return replace(current, xids=xids, last_xid_time=max(current.last_xid_time, event.time), reset_seen=False)


def after_probe(health: GpuHealth, probe: GpuProbe, now: float, policy: HealthPolicy) -> GpuHealth:
    """The GPU's health once `probe` is known: lost while NVML fails, XIDs cleared once recovered."""
    if not probe.answering:
        if health.lost_since is None:
            health = replace(health, lost_since=now)
        return replace(health, reset_seen=True) if health.xids else health
    health = replace(health, lost_since=None)
    proven = not probe.reset_required and (probe.recovery_known or health.reset_seen)
    if (
        health.xids
        and policy.recovery_quiet_s >= 0
        and proven
        and now - health.last_xid_time >= policy.recovery_quiet_s
    ):
        health = replace(health, xids=(), last_xid_time=0.0, reset_seen=False)
    return health


def format_time(unix_s: float) -> str:
    """RFC 3339 at second precision, the form the apiserver stores (so it keeps ours unchanged)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_s))


def _event_devices(event: XidEvent, devices: Iterable[Device]) -> list[Device]:
    on_gpu = [d for d in devices if d.parent_uuid == event.gpu_uuid]
    if event.whole_gpu:
        return on_gpu
    migs = [
        d for d in on_gpu if d.mig is not None and d.kind in (DeviceKind.MIG_STATIC, DeviceKind.MIG_DYNAMIC)
    ]
    if event.gi_placement is not None:
        start, size = event.gi_placement
        return [
            d
            for d in migs
            if d.mig is not None and (d.mig.placement_start, d.mig.placement_size) == (start, size)
        ]
    return [
        d
        for d in migs
        if d.mig is not None
        and d.mig.gi_id == event.gi_id
        and (event.ci_id == ALL_INSTANCES or d.mig.ci_id in (None, event.ci_id))
    ]


def device_taints(
    model: DeviceModel, health: Mapping[str, GpuHealth], policy: HealthPolicy
) -> dict[str, tuple[DeviceTaint, ...]]:
    """Device name -> its health taints (most severe first, then oldest); devices without taints are left
    out."""
    found: dict[
        str, dict[tuple[str, str, TaintEffect], str]
    ] = {}  # name -> (key, value, effect) -> timeAdded

    def add(device: Device, key: str, value: str, effect: TaintEffect, when: float) -> None:
        stamp = format_time(when)
        taints = found.setdefault(device.name, {})
        previous = taints.get((key, value, effect))
        taints[(key, value, effect)] = stamp if previous is None else min(previous, stamp)

    for gpu in health.values():
        on_gpu = [d for d in model.devices if d.parent_uuid == gpu.uuid]
        if gpu.lost_since is not None:
            for device in on_gpu:
                add(device, GPU_LOST_TAINT_KEY, "", policy.fatal_effect, gpu.lost_since)
        for event in gpu.xids:
            for device in _event_devices(event, model.devices):
                add(device, XID_TAINT_KEY, str(event.xid), policy.xid_effect(event.xid), event.time)
        if gpu.unmonitored is not None:
            for device in on_gpu:
                add(device, UNMONITORED_TAINT_KEY, "", "None", 0.0)
    out: dict[str, tuple[DeviceTaint, ...]] = {}
    for name, taints in found.items():
        ordered = sorted(taints.items(), key=lambda kv: (_EFFECT_ORDER[kv[0][2]], kv[1], kv[0][0], kv[0][1]))
        out[name] = tuple(
            DeviceTaint(key=key, value=value, effect=effect, time_added=stamp)
            for (key, value, effect), stamp in ordered
        )
    return out


def apply_health(model: DeviceModel, health: Mapping[str, GpuHealth], policy: HealthPolicy) -> DeviceModel:
    """`model` with each device's health taints set (the same object when no device has any)."""
    taints = device_taints(model, health, policy)
    if not taints and not any(d.taints for d in model.devices):
        return model
    devices = tuple(replace(d, taints=taints.get(d.name, ())) for d in model.devices)
    return replace(model, devices=devices)


@dataclass(frozen=True)
class DeviceHealthStatus:
    healthy: bool
    message: str = ""  # why (the taints), empty when there is nothing to say
    taints: tuple[DeviceTaint, ...] = field(default=())


def health_status(device: Device) -> DeviceHealthStatus:
    """UNHEALTHY while a taint keeps new work away (NoSchedule/NoExecute); `None`-effect taints are only
    mentioned."""
    if not device.taints:
        return DeviceHealthStatus(True)
    unhealthy = any(t.effect != "None" for t in device.taints)
    parts = []
    for taint in device.taints:
        what = f"{taint.key}={taint.value}" if taint.value else taint.key
        parts.append(f"{what} ({taint.effect}, since {taint.time_added})")
    return DeviceHealthStatus(not unhealthy, "; ".join(parts), device.taints)


HEALTH_FORMAT = 1


def health_to_json(health: Mapping[str, GpuHealth]) -> dict[str, object]:
    """What survives a plugin restart: XIDs and lost GPUs (registration is tried again at start anyway)."""
    gpus: dict[str, object] = {}
    for uuid, gpu in sorted(health.items()):
        if not gpu.xids and gpu.lost_since is None:
            continue
        gpus[uuid] = {
            "xids": [
                {
                    "xid": e.xid,
                    "gi_id": e.gi_id,
                    "ci_id": e.ci_id,
                    "gi_placement": list(e.gi_placement) if e.gi_placement else None,
                    "time": e.time,
                }
                for e in gpu.xids
            ],
            "last_xid_time": gpu.last_xid_time,
            "lost_since": gpu.lost_since,
            "reset_seen": gpu.reset_seen,
        }
    return {"format": HEALTH_FORMAT, "gpus": gpus}


def health_from_json(data: Mapping[str, object]) -> dict[str, GpuHealth]:
    """The inverse of `health_to_json`; raises ValueError naming what is wrong."""
    if data.get("format") != HEALTH_FORMAT:
        raise ValueError(f"health state format {data.get('format')!r}, expected {HEALTH_FORMAT}")
    gpus = data.get("gpus")
    if not isinstance(gpus, Mapping):
        raise ValueError("health state: 'gpus' must be an object")
    out: dict[str, GpuHealth] = {}
    try:
        for uuid, entry in gpus.items():
            xids = tuple(
                XidEvent(
                    gpu_uuid=str(uuid),
                    xid=int(x["xid"]),
                    gi_id=int(x["gi_id"]),
                    ci_id=int(x["ci_id"]),
                    gi_placement=(int(x["gi_placement"][0]), int(x["gi_placement"][1]))
                    if x.get("gi_placement")
                    else None,
                    time=float(x["time"]),
                )
                for x in entry["xids"]
            )
            lost = entry.get("lost_since")
            out[str(uuid)] = GpuHealth(
                str(uuid),
                xids=xids,
                last_xid_time=float(entry.get("last_xid_time", 0.0)),
                lost_since=None if lost is None else float(lost),
                reset_seen=bool(entry.get("reset_seen", False)),
            )
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
        raise ValueError(f"health state: malformed GPU entry ({type(err).__name__}: {err})") from err
    return out
