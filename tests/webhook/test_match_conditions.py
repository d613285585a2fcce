"""The chart's matchConditions on a real kube-apiserver, with the webhook endpoint down (failurePolicy Fail).

Nothing listens at the configured URL, so every request the configuration lets through to the webhook is
refused ("connection refused"). What must still go through is exactly what the matchConditions keep away from
it: objects without an opaque config for gpu.nvidia.com, and UPDATEs that leave the spec alone (finalizer
removal of a claim stored before the rules tightened). The configuration is scoped by an object selector
unique to this module, so the session's other tests never meet the dead webhook.
"""

from __future__ import annotations

import base64
import contextlib
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from webhook_helpers import make_cert

from dra_gpu.webhook.match_conditions import MATCH_CONDITIONS
from dra_gpu.webhook.server import VALIDATE_PATH

pytestmark = pytest.mark.apiserver

OURS = "gpu.nvidia.com"


def _config(driver: str, interval: str = "Long") -> list[dict[str, Any]]:
    parameters = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
    }
    return [{"opaque": {"driver": driver, "parameters": parameters}}]


def _claim(name: str, label: str, config: list[dict[str, Any]] | None) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
    devices: dict[str, Any] = {"requests": [request]}
    if config is not None:
        devices["config"] = config
    metadata = {"name": name, "labels": {"dra-gpu-webhook-down": label}}
    return {"metadata": metadata, "spec": {"devices": devices}}


MERGE = "application/merge-patch+json"  # the client would otherwise pick JSON patch for a dict body


def _update_claim_metadata(resource: Any, ns: str, name: str, **changes: Any) -> None:
    """Read-modify-write, as controllers remove finalizers. (A merge PATCH of a claim whose opaque parameters
    were sent as non-compact JSON, as this Python client sends them, is refused by the apiserver itself with
    "spec: field is immutable", webhook or not: the re-encoded RawExtension differs byte for byte.)"""
    claim = resource.read_namespaced_resource_claim(name, ns)
    for key, value in changes.items():
        setattr(claim.metadata, key, value)
    resource.replace_namespaced_resource_claim(name, ns, claim)


def _dead_port() -> int:
    with socket.socket() as sock:  # bound then closed: nothing listens there afterwards
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def dead_webhook(kube_apiserver: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from kubernetes import client

    api = kube_apiserver.api_client()
    label = f"down-{uuid.uuid4().hex[:8]}"
    core: Any = client.CoreV1Api(api)
    admission: Any = client.AdmissionregistrationV1Api(api)
    resource: Any = client.ResourceV1Api(api)
    core.create_namespace({"metadata": {"name": label}})
    # Stored before the webhook existed: invalid by its rules, and held by a finalizer.
    stored = _claim("stored-invalid", label, _config(OURS, "Forever"))
    stored["metadata"]["finalizers"] = ["example.com/hold"]
    resource.create_namespaced_resource_claim(label, stored)
    stored_class = {
        "metadata": {"name": f"{label}.example.com", "labels": {"dra-gpu-webhook-down": label}},
        "spec": {"config": _config(OURS, "Forever")},
    }
    resource.create_device_class(stored_class)
    cert = make_cert(tmp_path_factory.mktemp("dead-webhook-tls"))
    config_name = f"dra-gpu-{label}"
    admission.create_validating_webhook_configuration(
        {
            "metadata": {"name": config_name},
            "webhooks": [
                {
                    "name": f"{label}.gpu.nvidia.com",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 5,
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{_dead_port()}{VALIDATE_PATH}",
                        "caBundle": base64.b64encode(Path(cert.cert_file).read_bytes()).decode(),
                    },
                    "rules": [
                        {
                            "apiGroups": ["resource.k8s.io"],
                            "apiVersions": ["*"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["resourceclaims", "resourceclaimtemplates", "deviceclasses"],
                            "scope": "*",
                        }
                    ],
                    "objectSelector": {"matchLabels": {"dra-gpu-webhook-down": label}},
                    "matchConditions": list(MATCH_CONDITIONS),
                }
            ],
        }
    )
    try:
        yield {"resource": resource, "namespace": label, "label": label, "class": stored_class}
    finally:
        admission.delete_validating_webhook_configuration(config_name)
        from kubernetes.client.exceptions import ApiException

        for cleanup in (
            lambda: _update_claim_metadata(resource, label, "stored-invalid", finalizers=None),
            lambda: resource.delete_device_class(stored_class["metadata"]["name"]),
        ):
            with contextlib.suppress(ApiException):
                cleanup()
        core.delete_namespace(label)


def _refused(create: Callable[[], Any], delete: Callable[[], Any], timeout_s: float = 30.0) -> str:
    """The apiserver loads webhook configurations asynchronously: retry until the dead webhook is in force."""
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            create()
        except ApiException as err:
            return str(err.body)
        delete()
        if time.monotonic() > deadline:
            raise AssertionError("the apiserver never called the (dead) webhook")
        time.sleep(0.3)


def test_only_our_configs_wait_for_a_dead_webhook(dead_webhook: dict[str, Any]) -> None:
    resource, ns, label = dead_webhook["resource"], dead_webhook["namespace"], dead_webhook["label"]
    # A valid config for our driver is refused while the webhook is down: failurePolicy Fail still holds
    # (and this is how we know the configuration is in force before checking what passes).
    body = _refused(
        lambda: resource.create_namespaced_resource_claim(ns, _claim("ours", label, _config(OURS))),
        lambda: resource.delete_namespaced_resource_claim("ours", ns),
    )
    assert "failed calling webhook" in body
    # Everything else goes through.
    resource.create_namespaced_resource_claim(ns, _claim("other-driver", label, _config("other.example.com")))
    resource.create_namespaced_resource_claim(ns, _claim("no-config", label, None))
    template = {
        "metadata": {"name": "tmpl", "labels": {"dra-gpu-webhook-down": label}},
        "spec": {"spec": _claim("x", label, _config("other.example.com"))["spec"]},
    }
    resource.create_namespaced_resource_claim_template(ns, template)
    other_class = {
        "metadata": {"name": f"other.{label}.example.com", "labels": {"dra-gpu-webhook-down": label}},
        "spec": {"config": _config("other.example.com")},
    }
    resource.create_device_class(other_class)
    resource.delete_device_class(other_class["metadata"]["name"])


def test_stored_invalid_objects_can_be_released_and_deleted(dead_webhook: dict[str, Any]) -> None:
    from kubernetes.client.exceptions import ApiException

    resource, ns = dead_webhook["resource"], dead_webhook["namespace"]
    stored_class = dead_webhook["class"]
    name = stored_class["metadata"]["name"]
    intervals = iter(["Short", "Medium"] * 100)  # every try a real spec change, even after an early success
    _refused(  # the configuration is in force: a spec change to the stored class reaches the dead webhook
        lambda: resource.patch_device_class(
            name, {"spec": {"config": _config(OURS, next(intervals))}}, _content_type=MERGE
        ),
        lambda: None,
    )
    # Metadata-only UPDATEs never reach it: relabel, then remove the finalizer, then delete.
    _update_claim_metadata(resource, ns, "stored-invalid", annotations={"reviewed": "yes"})
    device_class = resource.read_device_class(name)
    device_class.metadata.annotations = {"reviewed": "yes"}
    resource.replace_device_class(name, device_class)
    resource.delete_namespaced_resource_claim("stored-invalid", ns)  # parks it behind the finalizer
    claim = resource.read_namespaced_resource_claim("stored-invalid", ns)
    assert claim.metadata.deletion_timestamp is not None
    _update_claim_metadata(resource, ns, "stored-invalid", finalizers=None)
    with pytest.raises(ApiException) as gone:
        resource.read_namespaced_resource_claim("stored-invalid", ns)
    assert gone.value.status == 404
    resource.delete_device_class(name)
