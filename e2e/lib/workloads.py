"""Small workloads for the resilience and timing tests (pure builders of manifest dicts)."""

from __future__ import annotations

from typing import Any

from e2e.lib.container_report import REPORT_COMMAND

REPORT_AND_WAIT = REPORT_COMMAND + "; trap 'exit 0' TERM; sleep 86400 & wait"


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def claim_template(
    ns: str,
    name: str,
    device_class: str = "gpu.nvidia.com",
    selector: str | None = None,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    request: dict[str, Any] = {"name": "gpu", "exactly": {"deviceClassName": device_class}}
    if selector:
        request["exactly"]["selectors"] = [{"cel": {"expression": selector}}]
    devices: dict[str, Any] = {"requests": [request]}
    if config is not None:
        devices["config"] = [
            {"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": config}}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"namespace": ns, "name": name},
        "spec": {"spec": {"devices": devices}},
    }


def claim(ns: str, name: str, config: dict[str, Any]) -> dict[str, Any]:
    """A claim for one gpu.nvidia.com device with our opaque `config`."""
    return claim_with_opaque(ns, name, {"driver": "gpu.nvidia.com", "parameters": config})


def claim_with_opaque(ns: str, name: str, opaque: dict[str, Any] | None = None) -> dict[str, Any]:
    """A claim for one gpu.nvidia.com device; `opaque`, when given, is its whole opaque config (any
    driver's)."""
    devices: dict[str, Any] = {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
    }
    if opaque is not None:
        devices["config"] = [{"requests": ["gpu"], "opaque": opaque}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": ns, "name": name},
        "spec": {"devices": devices},
    }


def pod_with_template(ns: str, name: str, template: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": ns, "name": name, "labels": {"app.kubernetes.io/part-of": "dra-gpu-e2e"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "ctr",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", REPORT_AND_WAIT],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def gpu_config_time_slicing(interval: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
    }
