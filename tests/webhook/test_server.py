"""The webhook over real HTTPS: health, AdmissionReview answers for every object shape, bad requests."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from webhook_helpers import RunningWebhook, make_cert, served_common_name, serving

V1B1_CONFIG = "resource.nvidia.com/v1beta1"


def gpu_config(**sharing: Any) -> dict[str, Any]:
    return {"apiVersion": V1B1_CONFIG, "kind": "GpuConfig", "sharing": sharing}


def opaque(
    parameters: Any, driver: str = "gpu.nvidia.com", requests: list[str] | None = None
) -> dict[str, Any]:
    entry: dict[str, Any] = {"opaque": {"driver": driver, "parameters": parameters}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def claim(configs: list[dict[str, Any]], version: str = "v1") -> dict[str, Any]:
    request: dict[str, Any] = {"name": "gpu"}
    if version == "v1beta1":
        request["deviceClassName"] = "gpu.nvidia.com"
    else:
        request["exactly"] = {"deviceClassName": "gpu.nvidia.com"}
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": {"name": "shared-gpu", "namespace": "team-a"},
        "spec": {"devices": {"requests": [request], "config": configs}},
    }


def template(configs: list[dict[str, Any]], version: str = "v1") -> dict[str, Any]:
    spec = claim(configs, version)["spec"]
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "tmpl", "namespace": "team-b"},
        "spec": {"spec": spec},
    }


def device_class(configs: list[dict[str, Any]], version: str = "v1") -> dict[str, Any]:
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "DeviceClass",
        "metadata": {"name": "mps.example.com"},
        "spec": {
            "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}],
            "config": configs,
        },
    }


BUILDERS = {"ResourceClaim": claim, "ResourceClaimTemplate": template, "DeviceClass": device_class}
VERSIONS = ["v1", "v1beta1", "v1beta2"]


def test_healthz(webhook: RunningWebhook) -> None:
    conn = webhook.connection()
    conn.request("GET", "/healthz")
    response = conn.getresponse()
    assert (response.status, response.read()) == (200, b"ok")
    conn.close()


def test_plain_http_is_refused(webhook: RunningWebhook) -> None:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", webhook.server.port, timeout=5)
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        conn.request("GET", "/healthz")
        conn.getresponse().read()
    conn.close()
    test_healthz(webhook)  # the server survived


@pytest.mark.parametrize("kind", sorted(BUILDERS))
@pytest.mark.parametrize("version", VERSIONS)
def test_valid_configs_are_allowed(webhook: RunningWebhook, kind: str, version: str) -> None:
    configs = [
        opaque(
            gpu_config(
                strategy="MPS",
                mpsConfig={"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"},
            )
        ),
        opaque(
            {"apiVersion": V1B1_CONFIG, "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}},
            requests=["gpu"],
        ),
    ]
    response = webhook.review(BUILDERS[kind](configs, version))
    assert response["allowed"] is True, response


@pytest.mark.parametrize("kind", sorted(BUILDERS))
@pytest.mark.parametrize("version", VERSIONS)
def test_bad_config_is_denied_naming_object_index_field_and_allowed_values(
    webhook: RunningWebhook, kind: str, version: str
) -> None:
    configs = [
        opaque(gpu_config(strategy="TimeSlicing")),
        opaque(gpu_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Forever"})),
    ]
    obj = BUILDERS[kind](configs, version)
    response = webhook.review(obj)
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert response["status"]["code"] == 422
    name = obj["metadata"]["name"]
    namespace = obj["metadata"].get("namespace")
    assert message.startswith(f"{kind} {namespace}/{name}:" if namespace else f"{kind} {name}:"), message
    assert "config[1].opaque.parameters.sharing.timeSlicingConfig.interval" in message
    assert "config[0]" not in message
    for allowed in ("Default", "Short", "Medium", "Long"):
        assert allowed in message


def test_configs_for_other_drivers_are_skipped(webhook: RunningWebhook) -> None:
    configs = [opaque({"anything": "goes"}, driver="other.example.com")]
    assert webhook.review(claim(configs))["allowed"] is True


def test_every_bad_config_is_reported(webhook: RunningWebhook) -> None:
    configs = [
        opaque(gpu_config(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": 300})),
        opaque(gpu_config(strategy="Spatial")),
        opaque(None),
    ]
    message = webhook.review(claim(configs))["status"]["message"]
    assert "config[0].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage" in message
    assert "config[1].opaque.parameters.sharing.strategy" in message
    assert "config[2].opaque.parameters: required" in message


def test_delete_is_always_allowed(webhook: RunningWebhook) -> None:
    obj = claim([opaque(gpu_config(strategy="nope"))])
    assert webhook.review(obj, operation="DELETE")["allowed"] is True


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_update_is_validated_only_when_the_spec_changed(webhook: RunningWebhook, kind: str) -> None:
    """A stored object that today's rules refuse can still lose its finalizer and be relabelled."""
    stored = BUILDERS[kind]([opaque(gpu_config(strategy="nope"))])
    stored["metadata"]["finalizers"] = ["example.com/hold"]
    released = {**stored, "metadata": {**stored["metadata"], "finalizers": [], "labels": {"a": "b"}}}
    assert webhook.review(released, operation="UPDATE", old=stored)["allowed"] is True
    # A changed spec is validated: an UPDATE cannot bring a bad value in, nor keep one while editing.
    good = BUILDERS[kind]([opaque(gpu_config(strategy="TimeSlicing"))])
    edited = BUILDERS[kind]([opaque(gpu_config(strategy="nope")), opaque(gpu_config(strategy="MPS"))])
    response = webhook.review(edited, operation="UPDATE", old=good)
    assert response["allowed"] is False and "strategy" in response["status"]["message"]
    # No old object sent (a misconfigured hook): validated as before, never silently waved through.
    assert webhook.review(edited, operation="UPDATE")["allowed"] is False


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"[]", b'{"kind": "Pod"}', b'{"kind": "AdmissionReview", "request": {}}', b"\xff\xfe"],
)
def test_malformed_request_is_a_400_not_a_crash(webhook: RunningWebhook, body: bytes) -> None:
    status, _ = webhook.post(body)
    assert status == 400
    test_healthz(webhook)


def test_unknown_path_is_404(webhook: RunningWebhook) -> None:
    status, _ = webhook.post(b"{}", path="/mutate")
    assert status == 404


def test_certificate_is_reloaded_when_the_files_change(tmp_path: Path) -> None:
    from dra_gpu.webhook.server import TlsFiles, WebhookServer

    first = make_cert(tmp_path, "first")
    files = TlsFiles(str(first.cert_file), str(first.key_file))
    with serving(WebhookServer("127.0.0.1", 0, files)) as server:
        assert served_common_name(server.port) == "first"
        second_dir = tmp_path / "second"
        second_dir.mkdir()
        second = make_cert(second_dir, "second")
        time.sleep(0.01)
        shutil.copy(second.key_file, first.key_file)
        shutil.copy(second.cert_file, first.cert_file)
        assert served_common_name(server.port) == "second"


def test_cli_serves_and_stops_on_sigterm(cert: Any) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dra_gpu.cli.main",
            "webhook",
            "--tls-cert-file",
            str(cert.cert_file),
            "--tls-private-key-file",
            str(cert.key_file),
            "--port",
            "0",
            "--bind-address",
            "127.0.0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "serving https://127.0.0.1:" in line, line + proc.stderr.read() if proc.stderr else line
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        context = ssl.create_default_context(cafile=str(cert.cert_file))
        import http.client

        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
        conn.request(
            "POST",
            "/validate-resource-claim-parameters",
            body=json.dumps(
                {
                    "kind": "AdmissionReview",
                    "apiVersion": "admission.k8s.io/v1",
                    "request": {
                        "uid": "u1",
                        "operation": "CREATE",
                        "kind": {"kind": "ResourceClaim"},
                        "object": claim([opaque(gpu_config(strategy="MPS"))]),
                    },
                }
            ),
        )
        assert json.loads(conn.getresponse().read())["response"]["allowed"] is True
        conn.close()
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def test_cli_reports_missing_certificate(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dra_gpu.cli.main",
            "webhook",
            "--tls-cert-file",
            str(tmp_path / "none.crt"),
            "--tls-private-key-file",
            str(tmp_path / "none.key"),
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert "none.crt" in result.stderr


def test_legacy_api_version_is_admitted_with_a_warning(webhook: RunningWebhook) -> None:
    legacy = {
        "apiVersion": "gpu.nvidia.com/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"timeSlice": "Long"}},
    }
    response = webhook.review(claim([opaque(gpu_config(strategy="MPS")), opaque(legacy)]))
    assert response["allowed"] is True
    assert len(response["warnings"]) == 1
    assert response["warnings"][0].startswith(
        "spec.devices.config[1].opaque.parameters: apiVersion gpu.nvidia.com"
    )
