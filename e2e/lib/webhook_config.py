"""The ValidatingWebhookConfiguration that points the API server at the webhook host process (pure)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from dra_gpu.webhook.match_conditions import MATCH_CONDITIONS

WEBHOOK_CONFIG_NAME = "dra-gpu-e2e-webhook"
WEBHOOK_PATH = "/validate-resource-claim-parameters"


def webhook_configuration(url: str, ca_bundle_b64: str, timeout_s: int = 10) -> dict[str, Any]:
    """Claims and claim templates of every served `resource.k8s.io` version, CREATE and UPDATE.

    `matchPolicy: Equivalent` makes the API server convert v1beta1/v1beta2 requests to what the webhook is
    registered for; `failurePolicy: Fail` so that a webhook that is down shows up instead of passing bad
    configs; the chart's `matchConditions`, so that only what carries a gpu.nvidia.com opaque config (and
    UPDATEs that change the spec) waits for it.
    """
    if not url.startswith("https://"):
        raise ValueError(
            f"webhook url {url!r} must be https:// (the API server only calls webhooks over TLS)"
        )
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIG_NAME, "labels": {"app.kubernetes.io/part-of": "dra-gpu-e2e"}},
        "webhooks": [
            {
                "name": "resource-claim-parameters.gpu.nvidia.com",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "matchPolicy": "Equivalent",
                "timeoutSeconds": timeout_s,
                "clientConfig": {"url": url, "caBundle": ca_bundle_b64},
                "matchConditions": [dict(c) for c in MATCH_CONDITIONS],
                "rules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["v1", "v1beta1", "v1beta2"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["resourceclaims", "resourceclaimtemplates"],
                        "scope": "Namespaced",
                    },
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["v1", "v1beta1", "v1beta2"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["deviceclasses"],
                        "scope": "Cluster",
                    },
                ],
            }
        ],
    }


def host_webhook_configuration(
    chart_config: Mapping[str, Any] | None, url: str, ca_bundle_b64: str
) -> dict[str, Any]:
    """The chart's ValidatingWebhookConfiguration (its rules, policies, timeouts) pointed at a URL.

    The chart reaches the webhook through a Service; a host process has none, so `clientConfig` becomes the
    loopback URL with our CA. Without a chart, `webhook_configuration` gives the same rules.
    """
    if chart_config is None:
        return webhook_configuration(url, ca_bundle_b64)
    if not url.startswith("https://"):
        raise ValueError(
            f"webhook url {url!r} must be https:// (the API server only calls webhooks over TLS)"
        )
    config = copy.deepcopy(dict(chart_config))
    config["metadata"] = {"name": WEBHOOK_CONFIG_NAME, "labels": {"app.kubernetes.io/part-of": "dra-gpu-e2e"}}
    for hook in config.get("webhooks", []):
        hook["clientConfig"] = {"url": url, "caBundle": ca_bundle_b64}
    return config
