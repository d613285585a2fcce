"""What the soak's kubelet knows about each claim: its allocation (as the scheduler wrote it), what the plugin
answered, and whether a call on it was cut short. The invariants compare the hardware and the filesystem
with this, never with the plugin's own records."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.plugin.kubelet_client import ClaimId

MPS_KINDS = frozenset({"mps", "mig-mps", "fraction", "consumable-mps", "consumable-memory"})
# kinds that may run an MPS server (consumable shares without a config join their GPU's one server too)
MAY_RUN_MPS = MPS_KINDS | {"consumable"}
_MIG_NAME = re.compile(r"^gpu-\d+-mig-[0-9a-z+.-]+-(\d+)-(\d+)$")


class Phase(enum.Enum):
    IDLE = "idle"  # allocated; not prepared (never, or cleanly unprepared)
    PREPARED = "prepared"  # the plugin answered the prepare without error
    REFUSED = "refused"  # the plugin answered the prepare with an error: it must have left nothing
    IN_DOUBT = "in-doubt"  # a call on it was cut short (plugin killed) or failed: the kubelet retries it


@dataclass(frozen=True)
class DeviceFacts:
    """One published device, from the node's ResourceSlices."""

    name: str
    type: str  # gpu | mig | gpu-share
    gpu_uuid: str  # the whole GPU's UUID (a MIG device's parent)
    mig_placement: tuple[int, int] | None  # (GPU-instance profile id, start) of a MIG device


def device_facts(slices: Iterable[Mapping[str, Any]]) -> dict[str, DeviceFacts]:
    facts = {}
    for s in slices:
        for d in s["spec"].get("devices") or ():
            attrs = d["attributes"]
            kind = attrs["type"]["string"]
            placement = None
            if kind == "mig":
                match = _MIG_NAME.match(d["name"])
                assert match, d["name"]
                placement = (int(match.group(1)), int(match.group(2)))
                gpu_uuid = attrs["parentUUID"]["string"]
            else:
                gpu_uuid = attrs["uuid"]["string"]
            facts[d["name"]] = DeviceFacts(d["name"], kind, gpu_uuid, placement)
    return facts


@dataclass
class SoakClaim:
    index: int
    kind: str
    name: str
    namespace: str
    uid: str
    results: Sequence[Mapping[str, Any]]  # status.allocation.devices.results
    configs: Sequence[Mapping[str, Any]]
    pods: int = 0  # pods of the node that use it now
    phase: Phase = Phase.IDLE
    retry: str | None = None  # IN_DOUBT: the call the kubelet repeats ("prepare" or "unprepare")
    answer: tuple[Any, ...] | None = None  # the devices of the first successful prepare
    hardware_lost: bool = False  # its GPU fell off the bus and came back: MIG instances on it are gone
    history: list[str] = field(default_factory=list)

    @property
    def ref(self) -> ClaimId:
        return ClaimId(self.namespace, self.uid, self.name)

    @property
    def explained(self) -> bool:
        """Whether something on the node may belong to it."""
        return self.phase in (Phase.PREPARED, Phase.IN_DOUBT)

    def devices(self, facts: Mapping[str, DeviceFacts]) -> list[DeviceFacts]:
        return [facts[r["device"]] for r in self.results]

    def gpu_uuids(self, facts: Mapping[str, DeviceFacts]) -> set[str]:
        return {d.gpu_uuid for d in self.devices(facts)}

    def sharing(self) -> dict[str, Any]:
        """The sharing section of its (one) opaque config, if any."""
        for entry in self.configs:
            params = (entry.get("opaque") or {}).get("parameters") or {}
            if params.get("sharing"):
                return dict(params["sharing"])
        return {}
