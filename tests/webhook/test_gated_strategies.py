"""The webhook and NVIDIA's feature gates: a config whose sharing strategy has its gate off
(TimeSlicingSettings=false, MPSSupport=false) is refused at admission with the message the kubelet plugin
gives at prepare, instead of being admitted and failing there. The gates come as the plugin takes them
(`--feature-gates`, env FEATURE_GATES; the chart passes its featureGates to both)."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from test_server import BUILDERS, claim, gpu_config, opaque
from webhook_helpers import Cert, RunningWebhook, serving

from dra_gpu.cli.feature_gates import parse_feature_gates, refused_sharing_strategies
from dra_gpu.webhook.review import review
from dra_gpu.webhook.server import TlsFiles, WebhookServer

MPS_REFUSAL = (
    "'MPS' is selected as the GPU sharing strategy, but the 'MPSSupport' feature gate is not enabled"
)
TS_REFUSAL = (
    "'TimeSlicing' is selected as the GPU sharing strategy, but the 'TimeSlicingSettings' feature gate is "
    "not enabled"
)
V1_CONFIG = "resource.nvidia.com/v1beta1"


def _review(obj: dict[str, Any], gates: str, operation: str = "CREATE", old: Any = None) -> dict[str, Any]:
    request: dict[str, Any] = {
        "uid": "u1",
        "operation": operation,
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": obj["kind"]},
        "object": obj,
    }
    if old is not None:
        request["oldObject"] = old
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    response: dict[str, Any] = review(body, refused_sharing_strategies(parse_feature_gates(gates)))[
        "response"
    ]
    return response


def mig_config(**sharing: Any) -> dict[str, Any]:
    return {"apiVersion": V1_CONFIG, "kind": "MigDeviceConfig", "sharing": sharing}


def time_slicing() -> dict[str, Any]:
    return gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Long"})


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_mps_off_refuses_mps_configs_with_the_plugins_message(kind: str) -> None:
    obj = BUILDERS[kind]([opaque(gpu_config(strategy="MPS"))])
    response = _review(obj, "MPSSupport=false")
    assert response["allowed"] is False and response["status"]["code"] == 422
    message = response["status"]["message"]
    assert MPS_REFUSAL in message
    assert "config[0].opaque.parameters.sharing.strategy" in message  # where, as for any other bad field
    # The plugin refuses the same config at prepare with this very text (dra_gpu/cli/feature_gates.py).
    assert refused_sharing_strategies(parse_feature_gates("MPSSupport=false"))["MPS"] in message


def test_the_other_strategy_and_configs_without_sharing_still_pass() -> None:
    for config in (
        time_slicing(),
        gpu_config(strategy="TimeSlicing"),
        {"apiVersion": V1_CONFIG, "kind": "GpuConfig"},
    ):
        assert _review(claim([opaque(config)]), "MPSSupport=false")["allowed"] is True, config


def test_time_slicing_off_refuses_time_slicing_configs_of_gpus_and_mig_devices() -> None:
    response = _review(
        claim(
            [
                opaque(time_slicing()),
                opaque(mig_config(strategy="TimeSlicing")),
                opaque(gpu_config(strategy="MPS")),
            ]
        ),
        "TimeSlicingSettings=false",
    )
    message = response["status"]["message"]
    assert response["allowed"] is False
    assert message.count(TS_REFUSAL) == 2 and MPS_REFUSAL not in message
    assert "config[0].opaque" in message and "config[1].opaque" in message and "config[2]" not in message


def test_mig_device_mps_is_refused_when_mps_is_off() -> None:
    response = _review(claim([opaque(mig_config(strategy="MPS"))]), "MPSSupport=false")
    assert response["allowed"] is False and MPS_REFUSAL in response["status"]["message"]


def test_gates_on_or_absent_admit_both_strategies() -> None:
    both = claim([opaque(time_slicing()), opaque(gpu_config(strategy="MPS"))])
    for gates in ("", "MPSSupport=true,TimeSlicingSettings=true", "DynamicMIG=false"):
        assert _review(both, gates)["allowed"] is True, gates
    # No gates at all (a caller that passes none): nothing is refused for its strategy.
    body = {"kind": "AdmissionReview", "request": {"uid": "u", "operation": "CREATE",
            "kind": {"kind": "ResourceClaim"}, "object": both}}  # fmt: skip
    assert review(body)["response"]["allowed"] is True


def test_other_drivers_configs_are_not_judged_by_our_gates() -> None:
    other = claim([opaque(gpu_config(strategy="MPS"), driver="other.example.com")])
    assert _review(other, "MPSSupport=false")["allowed"] is True


def test_a_claim_admitted_before_the_gate_went_off_can_still_lose_its_finalizer() -> None:
    """Turning MPSSupport off must not leave existing MPS claims undeletable: an UPDATE that keeps the spec
    passes, one that changes it is judged by today's gates."""
    old = claim([opaque(gpu_config(strategy="MPS"))])
    old["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    new = json.loads(json.dumps(old))
    new["metadata"]["finalizers"] = []
    assert _review(new, "MPSSupport=false", "UPDATE", old)["allowed"] is True
    changed = json.loads(json.dumps(old))
    changed["spec"]["devices"]["requests"][0]["name"] = "other"
    assert _review(changed, "MPSSupport=false", "UPDATE", old)["allowed"] is False


# ------------------------------------------------------------------ over HTTPS: the server and the CLI


@pytest.fixture()
def mps_off_webhook(cert: Cert) -> Iterator[RunningWebhook]:
    refused = refused_sharing_strategies(parse_feature_gates("MPSSupport=false"))
    server = WebhookServer(
        "127.0.0.1", 0, TlsFiles(str(cert.cert_file), str(cert.key_file)), refused_strategies=refused
    )
    with serving(server):
        yield RunningWebhook(server, cert)


def test_server_refuses_with_its_gates(mps_off_webhook: RunningWebhook) -> None:
    response = mps_off_webhook.review(claim([opaque(gpu_config(strategy="MPS"))]))
    assert response["allowed"] is False and MPS_REFUSAL in response["status"]["message"]
    assert mps_off_webhook.review(claim([opaque(time_slicing())]))["allowed"] is True


def _cli(cert: Cert, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dra_gpu.cli.main", "webhook", "--tls-cert-file", str(cert.cert_file),
         "--tls-private-key-file", str(cert.key_file), "--port", "0", "--bind-address", "127.0.0.1", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
    )  # fmt: skip


def _cli_allows(cert: Cert, proc: subprocess.Popen[str], config: dict[str, Any]) -> tuple[bool, str]:
    import http.client

    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "serving https://127.0.0.1:" in line, line
    port = int(line.rsplit(":", 1)[1].split("/")[0])
    conn = http.client.HTTPSConnection(
        "127.0.0.1", port, context=ssl.create_default_context(cafile=str(cert.cert_file)), timeout=5
    )
    body = {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",
            "request": {"uid": "u1", "operation": "CREATE", "kind": {"kind": "ResourceClaim"},
                        "object": claim([opaque(config)])}}  # fmt: skip
    conn.request("POST", "/validate-resource-claim-parameters", body=json.dumps(body))
    response = json.loads(conn.getresponse().read())["response"]
    conn.close()
    return bool(response["allowed"]), response.get("status", {}).get("message", "")


@pytest.mark.parametrize("how", ["flag", "env"])
def test_cli_takes_the_gates_as_the_plugin_does(cert: Cert, how: str) -> None:
    gates = "MPSSupport=false,ContextualLogging=true,"  # NVIDIA's chart's rendering, trailing comma
    proc = _cli(cert, "--feature-gates", gates) if how == "flag" else _cli(cert, env={"FEATURE_GATES": gates})
    try:
        allowed, message = _cli_allows(cert, proc, gpu_config(strategy="MPS"))
        assert allowed is False and MPS_REFUSAL in message
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        assert proc.stdout is not None
        out = proc.stdout.read()  # what readline() buffered beyond the first line, then the rest
        assert "refusing configs with sharing strategy MPS" in out
        assert "ContextualLogging=true has no effect" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize(
    ("gates", "message"),
    [
        ("NoSuchGate=true", "'NoSuchGate': unknown gate"),
        ("MPSSupport=maybe", "expected NAME=true or NAME=false"),
        ("PassthroughSupport=true", "PassthroughSupport=true: VFIO passthrough"),
    ],
)
def test_cli_refuses_bad_gates_as_the_plugin_does(cert: Cert, gates: str, message: str) -> None:
    proc = _cli(cert, "--feature-gates", gates)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and message in err, err
