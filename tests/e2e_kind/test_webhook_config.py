from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest

from e2e.lib.tls import make_serving_cert
from e2e.lib.webhook_config import WEBHOOK_PATH, webhook_configuration


def test_configuration_points_at_the_url_and_covers_claims_and_templates() -> None:
    cfg = webhook_configuration(f"https://127.0.0.1:9443{WEBHOOK_PATH}", "Q0E=")
    hook = cfg["webhooks"][0]
    assert hook["clientConfig"] == {
        "url": "https://127.0.0.1:9443/validate-resource-claim-parameters",
        "caBundle": "Q0E=",
    }
    rule = hook["rules"][0]
    assert rule["apiGroups"] == ["resource.k8s.io"] and "v1" in rule["apiVersions"]
    assert set(rule["resources"]) == {"resourceclaims", "resourceclaimtemplates"}
    assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]


def test_plain_http_is_refused() -> None:
    with pytest.raises(ValueError, match="must be https://"):
        webhook_configuration("http://127.0.0.1:1/x", "")


def test_serving_cert_is_signed_by_the_ca_for_the_loopback_ip(tmp_path: Path) -> None:
    cert = make_serving_cert(tmp_path / "tls")
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(cert.ca_cert), str(cert.cert)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert verify.returncode == 0, verify.stderr
    text = subprocess.run(
        ["openssl", "x509", "-in", str(cert.cert), "-noout", "-text"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "IP Address:127.0.0.1" in text
    assert base64.b64decode(cert.ca_bundle_b64()) == cert.ca_cert.read_bytes()
    again = make_serving_cert(tmp_path / "tls")
    assert again.cert.read_bytes() == cert.cert.read_bytes()  # reused, not regenerated
