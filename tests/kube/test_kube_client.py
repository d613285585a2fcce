"""Connecting to the apiserver without loading the kubeconfig auth providers: the lazy `kubernetes` package
and the simple-kubeconfig reader (the plugin's real connection is covered by every tests/plugin test)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dra_gpu.kube.client import (
    LazyApiClient,
    _load_simple_kubeconfig,
    node_uid,
    request_json,
    server_version,
)

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


_LAZY_CLIENT = """
import sys
from dra_gpu.kube.lazy_package import lazy_kubernetes
lazy_kubernetes()
from dra_gpu.kube.client import LazyApiClient, ensure_loaded
lazy = LazyApiClient(sys.argv[1])
print("kubernetes.client.api_client" in sys.modules)
ensure_loaded(lazy)
print("kubernetes.client.api_client" in sys.modules, lazy.configuration.host)
try:
    ensure_loaded(LazyApiClient(sys.argv[1] + ".missing"))
except Exception as err:
    print("error", type(err).__name__)
"""


def test_a_lazy_api_client_loads_on_first_use_and_raises_there(tmp_path: Path) -> None:
    kubeconfig = _kubeconfig(tmp_path, {"token": "abc"})
    done = subprocess.run(
        [sys.executable, "-c", _LAZY_CLIENT, kubeconfig],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    before, after, missing = done.stdout.splitlines()
    assert before == "False"  # made, but nothing of the client's request layer imported yet
    assert after == "True https://10.0.0.1:6443"
    assert missing.startswith("error ")


@pytest.mark.apiserver
def test_request_json_speaks_to_the_apiserver_as_the_typed_calls_do(kube_apiserver: Any) -> None:
    api_client = LazyApiClient(str(kube_apiserver.kubeconfig))
    assert server_version(api_client) >= (1, 34)
    assert node_uid(api_client, "no-such-node") is None
    name = f"rq-{uuid.uuid4().hex[:8]}"
    body = {"metadata": {"name": name, "labels": {"made-by": "request-json"}}}
    created = request_json(api_client, "POST", "/api/v1/namespaces", body=body)
    read = request_json(api_client, "GET", "/api/v1/namespaces/{name}", {"name": name})
    assert read["metadata"]["uid"] == created["metadata"]["uid"]
    listed = request_json(
        api_client, "GET", "/api/v1/namespaces", query=[("labelSelector", "made-by=request-json")]
    )
    assert [item["metadata"]["name"] for item in listed["items"]] == [name]
    with pytest.raises(ApiException) as refused:  # a failed precondition: 409, as the typed call raises it
        request_json(
            api_client,
            "DELETE",
            "/api/v1/namespaces/{name}",
            {"name": name},
            body={"preconditions": {"uid": "not-its-uid"}},
        )
    assert refused.value.status == 409
    request_json(api_client, "DELETE", "/api/v1/namespaces/{name}", {"name": name})
    with pytest.raises(ApiException) as missing:
        request_json(api_client, "GET", "/api/v1/namespaces/{name}/pods/{pod}", {"name": name, "pod": "x"})
    assert missing.value.status == 404
