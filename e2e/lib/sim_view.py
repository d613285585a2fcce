"""Readable facts from the simulated hardware state (`dra-gpu hardware state -o json`), pure.

The tests compare these with what an example promises: a GPU's time-slice, its compute mode (MPS sets
EXCLUSIVE_PROCESS), the MPS daemons and their limits, and the MIG instances alive on each GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

COMPUTE_MODES = {0: "Default", 1: "ExclusiveThread", 2: "Prohibited", 3: "ExclusiveProcess"}
TIMESLICES = {0: "Default", 1: "Short", 2: "Medium", 3: "Long"}


@dataclass(frozen=True)
class GpuView:
    index: int
    uuid: str
    minor: int | None
    compute_mode: str
    timeslice: str
    mig_enabled: bool
    mig_instances: tuple[str, ...]  # "profileId@start" or a profile name when the state gives it


def _gpu_list(state: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    gpus = state.get("gpus")
    if not isinstance(gpus, list):
        raise ValueError(f"simulator state has no 'gpus' list (keys: {sorted(state)})")
    return gpus


def _mig_name(gi: Mapping[str, Any]) -> str:
    if gi.get("profile"):
        return str(gi["profile"])
    if gi.get("profile_name"):
        return str(gi["profile_name"])
    return f"gi-profile-{gi.get('profile_id')}@{gi.get('start')}"


def gpu_views(state: Mapping[str, Any]) -> list[GpuView]:
    views: list[GpuView] = []
    for i, g in enumerate(_gpu_list(state)):
        mode = g.get("compute_mode", 0)
        ts = g.get("timeslice", 0)
        views.append(
            GpuView(
                index=int(g.get("index", i)),
                uuid=str(g.get("uuid", "")),
                minor=g.get("minor"),
                compute_mode=COMPUTE_MODES.get(mode, str(mode)) if isinstance(mode, int) else str(mode),
                timeslice=TIMESLICES.get(ts, str(ts)) if isinstance(ts, int) else str(ts),
                mig_enabled=bool(g.get("mig_current", g.get("mig_enabled", False))),
                mig_instances=tuple(_mig_name(gi) for gi in g.get("gpu_instances", [])),
            )
        )
    return views


def gpu_by_uuid(state: Mapping[str, Any], uuid: str) -> GpuView:
    for view in gpu_views(state):
        if view.uuid == uuid:
            return view
    raise KeyError(f"no GPU {uuid} in the simulator state")


def mig_instance_count(state: Mapping[str, Any]) -> int:
    return sum(len(v.mig_instances) for v in gpu_views(state))


def mps_daemons(state: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """MPS control daemons recorded by the fake `nvidia-cuda-mps-control` (list or mapping by id)."""
    mps = state.get("mps") or {}
    if isinstance(mps, list):
        return mps
    daemons = mps.get("daemons", mps)
    if isinstance(daemons, Mapping):
        return [
            {"id": k, **v} if isinstance(v, Mapping) else {"id": k, "value": v} for k, v in daemons.items()
        ]
    if isinstance(daemons, list):
        return daemons
    return []


def describe_gpu(view: GpuView) -> str:
    """A short phrase for the demo table: 'time-slice Long', 'MPS (ExclusiveProcess)', 'MIG: 1g.10gb, ...'."""
    parts: list[str] = []
    if view.timeslice != "Default":
        parts.append(f"time-slice {view.timeslice}")
    if view.compute_mode != "Default":
        parts.append(f"compute mode {view.compute_mode}")
    if view.mig_instances:
        parts.append("MIG " + ", ".join(view.mig_instances))
    return "; ".join(parts) or "exclusive, default settings"


def _profile_names(state: Mapping[str, Any], gpu_position: int) -> dict[int, str]:
    """giProfileId -> profile name for the GPU at `gpu_position`, from the built-in hardware tables."""
    from dra_gpu.hardware import profiles  # the simulator's own tables: the names NVML would report

    try:
        layout = profiles.resolve_layout(str(state.get("hardware", "")))
        slot = layout.slots[gpu_position]
    except (ValueError, IndexError, KeyError):
        return {}
    return {p.gi_profile_id: p.name for p in slot.profile.mig_profiles}


def mig_instances_by_gpu(state: Mapping[str, Any]) -> dict[str, dict[tuple[int, int], str]]:
    """GPU uuid -> {(giProfileId, start): profile name} of the GPU instances alive in `state`."""
    out: dict[str, dict[tuple[int, int], str]] = {}
    for i, g in enumerate(state.get("gpus") or []):
        names = _profile_names(state, i)
        instances: dict[tuple[int, int], str] = {}
        for gi in g.get("gpu_instances", []):
            pid = int(gi.get("profile_id", -1))
            instances[(pid, int(gi.get("start", -1)))] = str(gi.get("profile") or names.get(pid, f"id{pid}"))
        out[str(g.get("uuid"))] = instances
    return out


def _mentions(value: Any, needle: str) -> bool:
    if isinstance(value, str):
        return needle in value
    if isinstance(value, Mapping):
        return any(_mentions(v, needle) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_mentions(v, needle) for v in value)
    return False


def running_mps_daemons(state: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        d
        for d in mps_daemons(state)
        if d.get("running") is not False and d.get("state") not in ("stopped", "exited")
    ]


def mps_daemon_serving(state: Mapping[str, Any], needles: Iterable[str]) -> Mapping[str, Any] | None:
    """The running MPS daemon whose record names one of `needles` (GPU/MIG UUIDs, device names), if any."""
    wanted = [n for n in needles if n]
    for daemon in running_mps_daemons(state):
        if any(_mentions(daemon, n) for n in wanted):
            return daemon
    return None


def compute_instance_uuids(state: Mapping[str, Any], gpu_uuid: str, placement: tuple[int, int]) -> list[str]:
    """MIG device UUIDs of the GPU instance at (giProfileId, start) on GPU `gpu_uuid`."""
    for g in state.get("gpus") or []:
        if g.get("uuid") != gpu_uuid:
            continue
        for gi in g.get("gpu_instances", []):
            if (int(gi.get("profile_id", -1)), int(gi.get("start", -1))) == placement:
                return [str(ci.get("uuid")) for ci in gi.get("compute_instances", [])]
    return []


def sharing_effect(before: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> str:
    """What the example changed on the hardware, in a few words: for the summary table."""
    if now is None:
        return "-"
    old = {v.uuid: v for v in gpu_views(before)} if before else {}
    parts: list[str] = []
    for view in gpu_views(now):
        prev = old.get(view.uuid)
        changed = prev is None or (prev.timeslice, prev.compute_mode, prev.mig_instances) != (
            view.timeslice,
            view.compute_mode,
            view.mig_instances,
        )
        if changed and describe_gpu(view) != "exclusive, default settings":
            parts.append(f"gpu{view.index}: {describe_gpu(view)}")
    daemons = running_mps_daemons(now)
    if daemons:
        parts.append(f"{len(daemons)} MPS daemon(s)")
    return "; ".join(parts) or "none (exclusive)"
