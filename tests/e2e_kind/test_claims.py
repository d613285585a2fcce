from __future__ import annotations

from typing import Any

from e2e.lib.claims import (
    AllocatedDevice,
    allocated_devices,
    claim_config_kinds,
    devices_of_pod,
    is_allocated,
    pod_claim_names,
    reserved_for,
)

CLAIM: dict[str, Any] = {
    "metadata": {"name": "pod-gpu-x7k2"},
    "status": {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-3"},
                    {"request": "nic", "driver": "other.example.com", "pool": "p", "device": "d"},
                ],
                "config": [
                    {
                        "source": "FromClaim",
                        "opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "GpuConfig"}},
                    },
                    {
                        "source": "FromClass",
                        "opaque": {"driver": "other.example.com", "parameters": {"kind": "X"}},
                    },
                ],
            }
        },
        "reservedFor": [{"resource": "pods", "name": "pod", "uid": "u"}],
    },
}

POD: dict[str, Any] = {
    "spec": {
        "resourceClaims": [
            {"name": "gpu", "resourceClaimTemplateName": "t"},
            {"name": "shared", "resourceClaimName": "shared-claim"},
        ]
    },
    "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "pod-gpu-x7k2"}]},
}


def test_allocation_results_are_read_in_order() -> None:
    devices = allocated_devices(CLAIM)
    assert devices[0] == AllocatedDevice("gpu", "gpu.nvidia.com", "node-a", "gpu-3")
    assert devices[0].is_ours and not devices[1].is_ours
    assert is_allocated(CLAIM) and reserved_for(CLAIM) == ["pod"]
    assert claim_config_kinds(CLAIM) == ["GpuConfig"]


def test_unallocated_claim_has_no_devices() -> None:
    pending = {"metadata": {"name": "c"}, "spec": {}}
    assert allocated_devices(pending) == [] and not is_allocated(pending) and reserved_for(pending) == []


def test_pod_claims_come_from_spec_and_generated_names_from_status() -> None:
    assert pod_claim_names(POD) == {"gpu": "pod-gpu-x7k2", "shared": "shared-claim"}
    assert [d.device for d in devices_of_pod(POD, [CLAIM])] == ["gpu-3", "d"]
