"""Thin helpers over the official `kubernetes` client: build an ApiClient, read small facts from the
server."""

from __future__ import annotations

import json
import os
import re
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException


def load_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """An ApiClient from `kubeconfig` (a path), else $KUBECONFIG, else the in-cluster service account."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    configuration = client.Configuration()
    if path:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, client_configuration=configuration
        )
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.ApiClient(configuration)


def server_version(api_client: client.ApiClient) -> tuple[int, int]:
    """(major, minor) of the apiserver, e.g. (1, 36); "36+"-style minors (managed clusters) are accepted."""
    info = client.VersionApi(api_client).get_code()
    major = int(re.sub(r"\D", "", str(info.major)) or 0)
    minor = int(re.sub(r"\D", "", str(info.minor)) or 0)
    if not major:  # some distributions leave major/minor empty: fall back to gitVersion "v1.36.3"
        match = re.match(r"v?(\d+)\.(\d+)", str(info.git_version))
        if match:
            return int(match[1]), int(match[2])
    return major, minor


def node_uid(api_client: client.ApiClient, node_name: str) -> str | None:
    """The Node's UID (for ownerReferences), or None when the Node does not exist (yet)."""
    try:
        response: Any = client.CoreV1Api(api_client).read_node(node_name, _preload_content=False)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    uid = json.loads(response.data)["metadata"]["uid"]
    return str(uid)


def response_json(response: Any) -> Any:
    """The JSON body of a `_preload_content=False` response."""
    return json.loads(response.data)
