"""How a consumable share of a whole GPU reaches its workload, and the rule that keeps the two ways apart on
one GPU (pure, no I/O).

With `--consumable-shares`, several claims may hold one `gpu-<minor>`. Each share is either a client of the
GPU's MPS shares server (it consumed part of the GPU's memory, or its config asks for MPS: the sharing plan
decides, `consumable_shares_served_by_mps`) or the plain device, as NVIDIA's driver gives every share.
Both cannot work on one GPU: while the server runs, the GPU is in compute mode EXCLUSIVE_PROCESS, where CUDA
refuses a context to any other process ("all CUDA-capable devices are busy or unavailable"), and a plain
process that got the GPU first keeps the server from opening it. So the prepare service refuses a claim whose
share would take a GPU in the other way than the claims already prepared on it, as NVIDIA's driver refuses a
claim whose config differs from theirs; the claim is prepared once they are gone (the kubelet retries).

Serving a plain share from a running server instead (an unlimited client) would keep both working only when
the server came first, would hand a workload MPS (no graphics, no debugger, a shared server) that its claim
did not ask for, depending on which pods came first, and could not help the other order; a refusal is the
same whatever the order.

Claims already prepared are read from what their prepare did (a checkpointed group that joined the shares
server has `sharedMps` in its state), so the rule holds after a plugin restart and for entries of earlier
versions. The claim being prepared is read from the same decision the sharing manager's plan takes, with the
GPU's published compute capability.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dra_gpu.checkpoint.checkpoint_store import ClaimEntry
from dra_gpu.inventory.model import Device, DeviceKind
from dra_gpu.sharing.interface import AllocatedDevice
from dra_gpu.sharing.plan import MPS_MIN_COMPUTE_CAPABILITY, consumable_shares_served_by_mps

if TYPE_CHECKING:
    from dra_gpu.config.api import DeviceConfig

_VERSION = re.compile(r"^(\d+)\.(\d+)")


class ShareMode(enum.Enum):
    MPS_CLIENT = "a client of the GPU's MPS server"
    DEVICE = "the plain device, without MPS"

    @property
    def why(self) -> str:
        if self is ShareMode.MPS_CLIENT:
            return "its share consumed part of the GPU's memory, or its config asks for MPS"
        return "its share has no memory limit to enforce: it consumed none or all of the GPU's memory"


def is_consumable_gpu_share(device: Device, share_id: str | None, admin_access: bool) -> bool:
    """A share of a whole GPU that other claims may hold too (`--consumable-shares`); admin access takes the
    device as it is and is left out, as from every other check of double use."""
    return (
        device.kind is DeviceKind.GPU
        and device.allow_multiple_allocations
        and share_id is not None
        and not admin_access
    )


def _published_mps_capable(device: Device) -> bool:
    """Whether the GPU runs MPS with client limits, from its published `cudaComputeCapability` ("9.0.0")."""
    attribute = device.attributes.get("cudaComputeCapability")
    match = _VERSION.match(str(attribute.value)) if attribute is not None else None
    return match is not None and (int(match[1]), int(match[2])) >= MPS_MIN_COMPUTE_CAPABILITY


def planned_modes(
    devices: Sequence[AllocatedDevice], groups: Sequence[tuple[DeviceConfig | None, Sequence[int]]]
) -> list[ShareMode | None]:
    """Per allocation (`devices`, indexed by `groups`' indices): how its consumable share of a whole GPU will
    be served; None for every other allocation."""
    modes: list[ShareMode | None] = [None] * len(devices)
    capable = {d.device.parent_uuid: _published_mps_capable(d.device) for d in devices}

    def mps_capable(uuid: str) -> bool:
        return capable.get(uuid, False)

    for config, indices in groups:
        active = [devices[i] for i in indices if not devices[i].admin_access]
        served_ids = {id(d) for d in consumable_shares_served_by_mps(config, active, mps_capable)}
        for i in indices:
            d = devices[i]
            if is_consumable_gpu_share(d.device, d.share_id, d.admin_access):
                modes[i] = ShareMode.MPS_CLIENT if id(d) in served_ids else ShareMode.DEVICE
    return modes


def held_modes(entry: ClaimEntry) -> dict[str, ShareMode]:
    """Device name -> how a checkpointed claim holds it, for its shared devices that a recorded group covers
    (a claim still being prepared has no group yet: it has changed nothing on the GPU). Devices that are not
    consumable shares of a whole GPU may be in it too; callers compare names with `planned_modes`' devices."""
    modes: dict[str, ShareMode] = {}
    shared = {d.device for d in entry.devices if d.share_id is not None and not d.admin_access}
    for group in entry.groups:
        mode = ShareMode.MPS_CLIENT if group.state.get("sharedMps") else ShareMode.DEVICE
        for name in group.devices:
            if name in shared and modes.get(name) is not ShareMode.MPS_CLIENT:
                modes[name] = mode
    return modes


def mixed_in_one_claim(devices: Sequence[AllocatedDevice], modes: Sequence[ShareMode | None]) -> str | None:
    """A device that this one claim would take both ways (two requests in config groups of their own): what
    to say, else None."""
    seen: dict[str, tuple[ShareMode, str]] = {}
    for d, mode in zip(devices, modes, strict=True):
        if mode is None:
            continue
        first = seen.setdefault(d.device.name, (mode, d.request))
        if first[0] is not mode:
            return (
                f"requests {first[1]} and {d.request} share device {d.device.name} as {first[0].value} and "
                f"as {mode.value}; one GPU cannot serve both (a running MPS server puts it in compute mode "
                "EXCLUSIVE_PROCESS): request part of its memory (capacity.requests.memory) in both requests, "
                "or in neither, with the same config"
            )
    return None


def conflict_message(device: str, mine: ShareMode, other: str, theirs: ShareMode) -> str:
    """Why a claim is refused a device that claim `other` (its namespace/name (uid)) holds the other way."""
    return (
        f"requested device {device} would be {mine.value} ({mine.why}), but already prepared claim {other} "
        f"has it as {theirs.value} ({theirs.why}); shares of one GPU cannot mix the two: while the GPU's MPS "
        "server runs, the GPU is in compute mode EXCLUSIVE_PROCESS and a process outside MPS gets no CUDA "
        "context, and a process outside MPS that came first keeps the server off the GPU. Request part of "
        f"the GPU's memory (capacity.requests.memory) in every claim that shares {device}, or in none of "
        "them; this claim is prepared once the other claim is unprepared"
    )


def modes_by_name(
    devices: Sequence[AllocatedDevice], modes: Sequence[ShareMode | None]
) -> Mapping[str, ShareMode]:
    """Device name -> the claim's planned mode (after `mixed_in_one_claim` found none mixed)."""
    return {d.device.name: mode for d, mode in zip(devices, modes, strict=True) if mode is not None}
