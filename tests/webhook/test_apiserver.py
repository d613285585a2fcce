"""The webhook behind a real kube-apiserver: a ValidatingWebhookConfiguration pointing at our HTTPS server.

The configuration is scoped with a namespace selector and an object selector unique to this test, so the
session's other tests (which share the apiserver) never go through it.
"""

from __future__ import annotations

import base64
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from webhook_helpers import make_cert

from dra_gpu.webhook.server import VALIDATE_PATH, TlsFiles, WebhookServer

pytestmark = pytest.mark.apiserver


def _opaque(interval: str) -> list[dict[str, Any]]:
    return [
        {
            "opaque": {
                "driver": "gpu.nvidia.com",
                "parameters": {
                    "apiVersion": "resource.nvidia.com/v1beta1",
                    "kind": "GpuConfig",
                    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
                },
            }
        }
    ]


def _devices(interval: str) -> dict[str, Any]:
    return {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
        "config": _opaque(interval),
    }


@pytest.fixture(scope="module")
def wired(kube_apiserver: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from kubernetes import client

    cert = make_cert(tmp_path_factory.mktemp("apiserver-tls"))
    server = WebhookServer("127.0.0.1", 0, TlsFiles(str(cert.cert_file), str(cert.key_file)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    api = kube_apiserver.api_client()
    label = f"webhook-test-{uuid.uuid4().hex[:8]}"
    namespace = label
    core: Any = client.CoreV1Api(api)
    admission: Any = client.AdmissionregistrationV1Api(api)
    core.create_namespace({"metadata": {"name": namespace, "labels": {"dra-gpu-webhook-test": label}}})
    ca = base64.b64encode(Path(cert.cert_file).read_bytes()).decode()
    hook_rules = [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["resourceclaims", "resourceclaimtemplates", "deviceclasses"],
            "scope": "*",
        },
    ]
    config_name = f"dra-gpu-{label}"
    admission.create_validating_webhook_configuration(
        {
            "metadata": {"name": config_name},
            "webhooks": [
                {
                    "name": f"ns.{label}.gpu.nvidia.com",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 10,
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{server.port}{VALIDATE_PATH}",
                        "caBundle": ca,
                    },
                    "rules": hook_rules,
                    "namespaceSelector": {"matchLabels": {"dra-gpu-webhook-test": label}},
                },
                {
                    "name": f"obj.{label}.gpu.nvidia.com",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 10,
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{server.port}{VALIDATE_PATH}",
                        "caBundle": ca,
                    },
                    "rules": [{**hook_rules[0], "resources": ["deviceclasses"], "scope": "Cluster"}],
                    "objectSelector": {"matchLabels": {"dra-gpu-webhook-test": label}},
                },
            ],
        }
    )
    try:
        yield {"api": api, "namespace": namespace, "label": label, "server": server}
    finally:
        admission.delete_validating_webhook_configuration(config_name)
        core.delete_namespace(namespace)
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _create_until_denied(create: Any, delete: Any, timeout_s: float = 30.0) -> str:
    """The apiserver picks the webhook configuration up asynchronously: retry until our answer is in force."""
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            create()
        except ApiException as err:
            return str(err.body)
        delete()
        if time.monotonic() > deadline:
            raise AssertionError("the apiserver never called the webhook")
        time.sleep(0.3)


def test_bad_claim_is_refused_by_the_apiserver(wired: dict[str, Any]) -> None:
    from kubernetes import client

    resource: Any = client.ResourceV1Api(wired["api"])
    ns = wired["namespace"]
    bad = {"metadata": {"name": "bad"}, "spec": {"devices": _devices("Forever")}}
    body = _create_until_denied(
        lambda: resource.create_namespaced_resource_claim(ns, bad),
        lambda: resource.delete_namespaced_resource_claim("bad", ns),
    )
    assert "denied the request" in body
    assert f"ResourceClaim {ns}/bad" in body
    assert "spec.devices.config[0].opaque.parameters.sharing.timeSlicingConfig.interval" in body
    assert "Medium" in body
    good = {"metadata": {"name": "good"}, "spec": {"devices": _devices("Long")}}
    resource.create_namespaced_resource_claim(ns, good)
    template = {"metadata": {"name": "tmpl"}, "spec": {"spec": {"devices": _devices("Sometimes")}}}
    body = _create_until_denied(
        lambda: resource.create_namespaced_resource_claim_template(ns, template),
        lambda: resource.delete_namespaced_resource_claim_template("tmpl", ns),
    )
    assert f"ResourceClaimTemplate {ns}/tmpl" in body and "spec.spec.devices.config[0]" in body


def test_bad_device_class_is_refused_by_the_apiserver(wired: dict[str, Any]) -> None:
    from kubernetes import client

    resource: Any = client.ResourceV1Api(wired["api"])
    name = f"{wired['label']}.example.com"
    bad = {
        "metadata": {"name": name, "labels": {"dra-gpu-webhook-test": wired["label"]}},
        "spec": {"config": _opaque("Eventually")},
    }
    body = _create_until_denied(
        lambda: resource.create_device_class(bad),
        lambda: resource.delete_device_class(name),
    )
    assert f"DeviceClass {name}" in body and "spec.config[0].opaque.parameters.sharing" in body
    good = {**bad, "spec": {"config": _opaque("Short")}}
    resource.create_device_class(good)
    resource.delete_device_class(name)


def test_a_strategy_whose_gate_is_off_is_refused_by_the_apiserver(wired: dict[str, Any]) -> None:
    """The webhook as `--feature-gates MPSSupport=false` makes it (the chart passes the plugin's gates): an
    MPS config is refused at `kubectl apply` with the plugin's message, a TimeSlicing one still passes."""
    from kubernetes import client

    from dra_gpu.cli.feature_gates import parse_feature_gates, refused_sharing_strategies

    server: WebhookServer = wired["server"]
    resource: Any = client.ResourceV1Api(wired["api"])
    ns = wired["namespace"]
    mps = _devices("Long")
    mps["config"][0]["opaque"]["parameters"]["sharing"] = {"strategy": "MPS"}
    claim = {"metadata": {"name": "mps"}, "spec": {"devices": mps}}
    server.refused_strategies = refused_sharing_strategies(parse_feature_gates("MPSSupport=false"))
    try:
        body = _create_until_denied(
            lambda: resource.create_namespaced_resource_claim(ns, claim),
            lambda: resource.delete_namespaced_resource_claim("mps", ns),
        )
        assert (
            f"ResourceClaim {ns}/mps" in body
            and "spec.devices.config[0].opaque.parameters.sharing.strategy" in body
        )
        assert (
            "'MPS' is selected as the GPU sharing strategy, but the 'MPSSupport' feature gate is not enabled"
            in body
        )
        time_sliced = {"metadata": {"name": "ts"}, "spec": {"devices": _devices("Long")}}
        resource.create_namespaced_resource_claim(ns, time_sliced)
        resource.delete_namespaced_resource_claim("ts", ns)
    finally:
        server.refused_strategies = {}
