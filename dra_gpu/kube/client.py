"""Thin helpers over the official `kubernetes` client: build an ApiClient, read small facts from the
server."""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dra_gpu.kube.rate_limit import TokenBucket

# Kubeconfig entries we read ourselves; any other key (exec plugins, OIDC/cloud auth providers, basic auth,
# token files, proxies) sends the kubeconfig to `kubernetes.config.kube_config`.
_SIMPLE_CLUSTER_KEYS = frozenset(
    {
        "server",
        "certificate-authority",
        "certificate-authority-data",
        "insecure-skip-tls-verify",
        "tls-server-name",
        "extensions",
    }
)
_SIMPLE_USER_KEYS = frozenset(
    {"client-certificate", "client-certificate-data", "client-key", "client-key-data", "token", "extensions"}
)


def _rate_limited(api_client: client.ApiClient, limiter: TokenBucket) -> client.ApiClient:
    """`api_client` with every request (typed calls, `request`, watch starts) taking a token of `limiter`
    first: `call_api` is where the generated client sends each one. Wrapped on the instance, not subclassed,
    so importing this module still loads nothing of the client's request layer."""
    send = api_client.call_api

    def call_api(*args: Any, **kwargs: Any) -> Any:
        limiter.take()
        return send(*args, **kwargs)

    api_client.call_api = call_api  # type: ignore[method-assign]
    return api_client


def load_api_client(kubeconfig: str | None = None, limiter: TokenBucket | None = None) -> client.ApiClient:
    """An ApiClient from `kubeconfig` (a path), else $KUBECONFIG, else the in-cluster service account; with
    `limiter`, one that keeps to its rate (`--kube-api-qps`, `--kube-api-burst`)."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    configuration = client.Configuration()
    if path:
        if not _load_simple_kubeconfig(path, configuration):
            from kubernetes.config.kube_config import load_kube_config

            load_kube_config(config_file=path, client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        # The official loader (token re-read every minute: bound service-account tokens rotate). Imported as a
        # submodule, so the kubeconfig auth providers stay unloaded (dra_gpu.kube.lazy_package).
        from kubernetes.config.incluster_config import load_incluster_config

        load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    if limiter is not None and not limiter.unlimited:
        return _rate_limited(client.ApiClient(configuration), limiter)
    return client.ApiClient(configuration)


class LazyApiClient:
    """An ApiClient that loads on first use: `load_api_client(kubeconfig, limiter)` then, once, under a lock;
    every attribute is the loaded client's, so the typed API classes and `request_json` take it as an
    ApiClient.

    The kubelet plugin makes one so that its registration socket does not wait for the client's imports
    (urllib3, dateutil, the generated configuration: ~0.1-0.2 s); its warm-up thread calls `ensure_loaded`
    right after the sockets serve, and a kubeconfig that cannot be loaded stops the plugin then."""

    def __init__(self, kubeconfig: str | None = None, limiter: TokenBucket | None = None) -> None:
        self._kubeconfig = kubeconfig
        self._limiter = limiter
        self._client: client.ApiClient | None = None
        self._lock = threading.Lock()

    def loaded(self) -> client.ApiClient:
        with self._lock:
            if self._client is None:
                self._client = load_api_client(self._kubeconfig, self._limiter)
            return self._client

    def __getattr__(self, name: str) -> Any:  # only for names this class lacks: the ApiClient's
        return getattr(self.loaded(), name)


def ensure_loaded(api_client: Any) -> None:
    """Load a LazyApiClient now (its errors raised here); any other client is loaded already."""
    if isinstance(api_client, LazyApiClient):
        api_client.loaded()


def _load_simple_kubeconfig(path: str, configuration: client.Configuration) -> bool:
    """Fill `configuration` from a kubeconfig whose current context uses only a server, CA, client
    certificate/key or bearer token (what kubeadm, kind and our test control plane write), without importing
    the official loader and its auth providers (~20 MB, ~0.15 s). False for anything else: the caller then
    uses the official loader, which also reports errors in its own words."""
    if os.pathsep in path:  # several files to merge
        return False
    import yaml

    try:
        document = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return False
    try:
        context = _named(document["contexts"], document["current-context"])["context"]
        cluster = _named(document["clusters"], context["cluster"])["cluster"]
        user = _named(document["users"], context["user"])["user"] or {}
    except (KeyError, TypeError):
        return False
    if not isinstance(cluster, dict) or not isinstance(user, dict):
        return False
    if set(cluster) - _SIMPLE_CLUSTER_KEYS or set(user) - _SIMPLE_USER_KEYS or "server" not in cluster:
        return False
    base = Path(path).resolve().parent
    configuration.host = str(cluster["server"]).rstrip("/")
    if cluster.get("insecure-skip-tls-verify"):
        configuration.verify_ssl = False
    if "tls-server-name" in cluster:
        configuration.tls_server_name = cluster["tls-server-name"]
    configuration.ssl_ca_cert = _file_of(cluster, "certificate-authority", base)
    configuration.cert_file = _file_of(user, "client-certificate", base)
    configuration.key_file = _file_of(user, "client-key", base)
    if user.get("token"):
        configuration.api_key["BearerToken"] = f"Bearer {user['token']}"
    return True


def _named(entries: Any, name: Any) -> Any:
    return next(entry for entry in entries if entry.get("name") == name)


def _file_of(section: dict[str, Any], key: str, base: Path) -> str | None:
    """`key` (a path, relative to the kubeconfig) or `key-data` (base64, written to a private file that is
    removed when the process exits: urllib3 takes paths)."""
    if section.get(f"{key}-data"):
        handle, name = tempfile.mkstemp(prefix="dra-gpu-kubeconfig-")
        with os.fdopen(handle, "wb") as out:
            out.write(base64.standard_b64decode(section[f"{key}-data"]))
        atexit.register(_remove, name)
        return name
    if section.get(key):
        return str(base / os.path.expanduser(str(section[key])))
    return None


def _remove(name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name)


def request(
    api_client: client.ApiClient,
    method: str,
    resource_path: str,
    path_params: dict[str, str] | None = None,
    *,
    query: list[tuple[str, Any]] | None = None,
    body: Any = None,
    timeout_s: float | tuple[float, float] | None = None,
) -> Any:
    """One request through the official client's request layer (its configuration, auth, TLS and connection
    pool, as any typed call); the urllib3 response, its body not read yet (a watch streams it). ApiException
    for a non-2xx answer, as the typed calls raise it with `_preload_content=False`.

    For the few calls the kubelet plugin makes, instead of the typed API classes: importing CoreV1Api alone
    takes ~1 s and 22 MB of VmRSS (one module of every core endpoint), ResourceV1Api 0.2 s and 5 MB, and
    each typed call validates its arguments with pydantic first (bench/bench_side_by_side.py measures the
    plugin)."""
    headers = {"Accept": "application/json", **({"Content-Type": "application/json"} if body else {})}
    serialized = api_client.param_serialize(
        method=method,
        resource_path=resource_path,
        path_params=path_params,
        query_params=query,
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api_client.call_api(*serialized, _request_timeout=timeout_s)
    if not 200 <= response.status <= 299:
        response.read()  # type: ignore[no-untyped-call]
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    return response.response


def request_json(
    api_client: client.ApiClient,
    method: str,
    resource_path: str,
    path_params: dict[str, str] | None = None,
    *,
    query: list[tuple[str, Any]] | None = None,
    body: Any = None,
    timeout_s: float | tuple[float, float] | None = None,
) -> Any:
    """`request`, answered as parsed JSON ({} for an empty body)."""
    response = request(
        api_client, method, resource_path, path_params, query=query, body=body, timeout_s=timeout_s
    )
    data = response.data
    return json.loads(data) if data else {}


def server_version(api_client: client.ApiClient) -> tuple[int, int]:
    """(major, minor) of the apiserver, e.g. (1, 36); "36+"-style minors (managed clusters) are accepted."""
    info = request_json(api_client, "GET", "/version/")
    major = int(re.sub(r"\D", "", str(info.get("major"))) or 0)
    minor = int(re.sub(r"\D", "", str(info.get("minor"))) or 0)
    if not major:  # some distributions leave major/minor empty: fall back to gitVersion "v1.36.3"
        match = re.match(r"v?(\d+)\.(\d+)", str(info.get("gitVersion")))
        if match:
            return int(match[1]), int(match[2])
    return major, minor


def node_uid(api_client: client.ApiClient, node_name: str) -> str | None:
    """The Node's UID (for ownerReferences), or None when the Node does not exist (yet)."""
    try:
        node = request_json(api_client, "GET", "/api/v1/nodes/{name}", {"name": node_name})
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return str(node["metadata"]["uid"])
