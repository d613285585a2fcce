"""A throw-away CA and a serving certificate for the webhook on 127.0.0.1, made with the openssl CLI."""

from __future__ import annotations

import base64
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServingCert:
    ca_cert: Path
    cert: Path
    key: Path

    def ca_bundle_b64(self) -> str:
        """The CA in the form `clientConfig.caBundle` wants (base64 of the PEM)."""
        return base64.b64encode(self.ca_cert.read_bytes()).decode()


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def make_serving_cert(directory: Path, hosts: tuple[str, ...] = ("127.0.0.1",), days: int = 2) -> ServingCert:
    """CA + leaf for `hosts` (IPs become IP SANs, names DNS SANs); reused when already present."""
    directory.mkdir(parents=True, exist_ok=True)
    out = ServingCert(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    if out.ca_cert.exists() and out.cert.exists() and out.key.exists():
        return out
    sans = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() else f"DNS:{h}" for h in hosts)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        str(days),
        "-subj",
        "/CN=dra-gpu-e2e-ca",
        cwd=directory,
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "tls.key",
        "-out",
        "tls.csr",
        "-subj",
        f"/CN={hosts[0]}",
        cwd=directory,
    )
    (directory / "san.ext").write_text(
        f"subjectAltName={sans}\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "tls.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "tls.crt",
        "-days",
        str(days),
        "-extfile",
        "san.ext",
        cwd=directory,
    )
    return out
