"""Reading ResourceClaims and pods: which claims a pod uses and which devices each claim got (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from e2e.lib.settings import DRIVER_NAME


@dataclass(frozen=True, order=True)
class AllocatedDevice:
    request: str  # "gpu" or "gpu/subrequest" for firstAvailable
    driver: str
    pool: str
    device: str
    share_id: str | None = None

    @property
    def is_ours(self) -> bool:
        return self.driver == DRIVER_NAME


def allocated_devices(claim: Mapping[str, Any]) -> list[AllocatedDevice]:
    """The devices in `status.allocation.devices.results`, in order; empty when not allocated."""
    allocation = claim.get("status", {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return [
        AllocatedDevice(
            request=r.get("request", ""),
            driver=r.get("driver", ""),
            pool=r.get("pool", ""),
            device=r.get("device", ""),
            share_id=r.get("shareID"),
        )
        for r in results
    ]


def is_allocated(claim: Mapping[str, Any]) -> bool:
    return bool((claim.get("status") or {}).get("allocation"))


def reserved_for(claim: Mapping[str, Any]) -> list[str]:
    return [r.get("name", "") for r in (claim.get("status") or {}).get("reservedFor") or []]


def pod_claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """Pod-level claim name -> ResourceClaim object name (templates get generated names in the pod status)."""
    names: dict[str, str] = {}
    for ref in pod.get("spec", {}).get("resourceClaims") or []:
        if ref.get("resourceClaimName"):
            names[ref["name"]] = ref["resourceClaimName"]
    for st in pod.get("status", {}).get("resourceClaimStatuses") or []:
        if st.get("resourceClaimName"):
            names[st["name"]] = st["resourceClaimName"]
    return names


def claims_of_pod(pod: Mapping[str, Any], claims: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The ResourceClaim objects (from `claims`) that `pod` references, in the pod's order."""
    by_name = {c["metadata"]["name"]: c for c in claims}
    return [by_name[n] for n in pod_claim_names(pod).values() if n in by_name]


def devices_of_pod(pod: Mapping[str, Any], claims: Iterable[Mapping[str, Any]]) -> list[AllocatedDevice]:
    devices: list[AllocatedDevice] = []
    for claim in claims_of_pod(pod, claims):
        devices.extend(allocated_devices(claim))
    return devices


def claim_config_kinds(claim: Mapping[str, Any]) -> list[str]:
    """Kinds of our opaque configs in the claim's allocation (GpuConfig, MigDeviceConfig, ...)."""
    allocation = claim.get("status", {}).get("allocation") or {}
    kinds: list[str] = []
    for cfg in (allocation.get("devices") or {}).get("config") or []:
        opaque = cfg.get("opaque") or {}
        if opaque.get("driver") == DRIVER_NAME:
            kind = (opaque.get("parameters") or {}).get("kind")
            if kind:
                kinds.append(str(kind))
    return kinds
