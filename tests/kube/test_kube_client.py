"""Connecting to the apiserver without loading the kubeconfig auth providers: the lazy `kubernetes` package
and the simple-kubeconfig reader (the plugin's real connection is covered by every tests/plugin test)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from kubernetes import client

from dra_gpu.kube.client import _load_simple_kubeconfig

REPO_ROOT = Path(__file__).resolve().parents[2]

_LAZY = """
import sys
from dra_gpu.kube.lazy_package import lazy_kubernetes
lazy_kubernetes()
from kubernetes import client
from kubernetes.client.exceptions import ApiException
import kubernetes.config.incluster_config
heavy = ("requests_oauthlib", "oauthlib", "kubernetes.dynamic", "kubernetes.config.kube_config")
print([m for m in heavy if m in sys.modules])
import kubernetes
from kubernetes import config
config.load_kube_config  # anything but a submodule runs the real __init__.py: the package still works
print(kubernetes.__version__ != "", [m for m in heavy if m in sys.modules])
"""


def test_lazy_package_skips_the_auth_providers_until_something_else_is_used() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _LAZY], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    before, after = done.stdout.splitlines()
    assert before == "[]"
    assert after.startswith("True [") and "requests_oauthlib" in after and "kube_config" in after


def _kubeconfig(
    tmp_path: Path, user: Mapping[str, object], cluster: Mapping[str, object] | None = None
) -> str:
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "contexts": [
            {"name": "other", "context": {"cluster": "x", "user": "x"}},
            {"name": "c", "context": {"cluster": "k", "user": "u"}},
        ],
        "clusters": [
            {
                "name": "k",
                "cluster": cluster
                or {
                    "server": "https://10.0.0.1:6443/",
                    "certificate-authority-data": base64.b64encode(b"CA PEM").decode(),
                },
            }
        ],
        "users": [{"name": "u", "user": user}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(document))
    return str(path)


def test_simple_kubeconfig_with_embedded_client_certificate(tmp_path: Path) -> None:
    path = _kubeconfig(
        tmp_path,
        {
            "client-certificate-data": base64.b64encode(b"CERT").decode(),
            "client-key-data": base64.b64encode(b"KEY").decode(),
        },
    )
    configuration = client.Configuration()
    assert _load_simple_kubeconfig(path, configuration)
    assert configuration.host == "https://10.0.0.1:6443"
    assert Path(str(configuration.ssl_ca_cert)).read_bytes() == b"CA PEM"
    assert Path(str(configuration.cert_file)).read_bytes() == b"CERT"
    assert Path(str(configuration.key_file)).read_bytes() == b"KEY"


def test_simple_kubeconfig_with_token_and_relative_paths(tmp_path: Path) -> None:
    path = _kubeconfig(
        tmp_path,
        {"token": "abc"},
        {
            "server": "https://api:6443",
            "certificate-authority": "pki/ca.crt",
            "insecure-skip-tls-verify": True,
        },
    )
    configuration = client.Configuration()
    assert _load_simple_kubeconfig(path, configuration)
    assert configuration.ssl_ca_cert == str(tmp_path / "pki" / "ca.crt")
    assert configuration.verify_ssl is False
    assert configuration.auth_settings()["BearerToken"]["value"] == "Bearer abc"


def test_other_kubeconfigs_go_to_the_official_loader(tmp_path: Path) -> None:
    exec_user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "aws"}}
    assert not _load_simple_kubeconfig(_kubeconfig(tmp_path, exec_user), client.Configuration())
    oidc = {"auth-provider": {"name": "oidc"}}
    assert not _load_simple_kubeconfig(_kubeconfig(tmp_path, oidc), client.Configuration())
    proxied = {"server": "https://api:6443", "proxy-url": "http://proxy:3128"}
    assert not _load_simple_kubeconfig(_kubeconfig(tmp_path, {"token": "t"}, proxied), client.Configuration())
    assert not _load_simple_kubeconfig(str(tmp_path / "missing"), client.Configuration())
    assert not _load_simple_kubeconfig(f"{tmp_path}/a:{tmp_path}/b", client.Configuration())
