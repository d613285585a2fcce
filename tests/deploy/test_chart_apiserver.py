"""The rendered chart against a real kube-apiserver (RBAC on):

- every object the chart renders is accepted by the API server (server-side dry run: schema, CEL of the
  DeviceClasses and of the admission policy are compiled by the server itself);
- the plugin's RBAC and the ValidatingAdmissionPolicy work together as designed: the plugin's service account,
  bound to a node, may write its own node's ResourceSlices and nothing else.

The release name is unique per run, so the cluster-scoped objects created for real do not collide with other
tests sharing the session API server; objects with fixed names (DeviceClasses, the webhook configuration) are
only dry-run.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .test_chart import _helm, _rendered_docs, _set_args

pytestmark = pytest.mark.apiserver

CERT_MANAGER_KINDS = {"Certificate", "Issuer"}  # no cert-manager CRDs on the test API server


def _render(release: str, namespace: str, *sets: str) -> list[dict[str, Any]]:
    helm = _helm()
    if helm is None:
        pytest.skip("no helm binary: e2e/cluster/build.sh helm could not build one")
    return _rendered_docs(helm, *_set_args(sets), namespace=namespace, release=release)


@pytest.fixture
def namespace(kube_apiserver: Any) -> Iterator[str]:
    from kubernetes import client

    name = f"dra-gpu-chart-{uuid.uuid4().hex[:8]}"
    core: Any = client.CoreV1Api(kube_apiserver.api_client())
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def _create(api_client: Any, doc: dict[str, Any], namespace: str, dry_run: bool) -> None:
    from kubernetes import utils

    kwargs = {"dry_run": "All"} if dry_run else {}
    create: Any = utils.create_from_dict  # untyped in the client library
    create(api_client, doc, namespace=namespace, **kwargs)


NVIDIA_KEYS = (  # NVIDIA's chart keys that reach the plugin DaemonSet (tests/deploy/test_nvidia_values.py)
    "featureGates.MPSSupport=false",
    "logVerbosity=6",
    "kubeletPlugin.updateStrategy.type=OnDelete",
    "kubeletPlugin.networkPolicy.enabled=true",
    "kubeletPlugin.metrics.gpuHttpEndpoint=:9400",
    "kubeletPlugin.containers.gpus.healthcheckPort=-1",
    "kubeletPlugin.podSecurityContext.fsGroup=0",
    "kubeletPlugin.kubeletPluginsDirectoryPath=/var/lib/k0s/kubelet/plugins",
)

NVIDIA_CHART_KEYS = (  # NVIDIA's top-level and webhook keys (tests/deploy/test_nvidia_chart_keys.py)
    "selectorLabelsOverride.app=gpu-driver",
    "serviceAccount.name=gpu",
    "serviceAccount.annotations.example\\.com/role=gpu",
    "webhook.serviceAccount.annotations.example\\.com/role=webhook",
    "webhook.servicePort=9443",
    "webhook.containerPort=443",  # below 1024: the pod gets the ip_unprivileged_port_start sysctl
    "webhook.priorityClassName=system-cluster-critical",
    "webhook.strategy.type=Recreate",
    "webhook.podSecurityContext.fsGroup=2000",
    "webhook.containers.webhook.securityContext.privileged=false",
    "webhook.containers.webhook.resources.limits.memory=300Mi",
    "webhook.networkPolicy.enabled=true",
    "featureGates.MPSSupport=false",
)


@pytest.mark.parametrize(
    "sets",
    [(), ("hardware=dgx-h100", "webhook.tls.mode=helm"), NVIDIA_KEYS, NVIDIA_CHART_KEYS],
    ids=["default", "simulated", "nvidia-keys", "nvidia-chart-keys"],
)
def test_api_server_accepts_every_rendered_object(
    kube_apiserver: Any, namespace: str, sets: tuple[str, ...]
) -> None:
    from kubernetes.client.exceptions import ApiException

    api_client = kube_apiserver.api_client()
    docs = _render(f"r{uuid.uuid4().hex[:6]}", namespace, *sets)
    checked = 0
    for doc in docs:
        if doc["kind"] in CERT_MANAGER_KINDS:
            continue
        try:
            _create(api_client, doc, namespace, dry_run=True)
        except ApiException as exc:
            pytest.fail(f"the API server rejects {doc['kind']} {doc['metadata']['name']}: {exc.body}")
        checked += 1
    assert checked >= 12


def _as_plugin(kube_apiserver: Any, user: str, node: str | None) -> Any:
    """An API client that impersonates the plugin's service account, as a pod on `node` would present it."""
    api_client = kube_apiserver.api_client()
    api_client.set_default_header("Impersonate-User", user)
    api_client.set_default_header("Impersonate-Group", "system:serviceaccounts")
    if node is not None:
        api_client.set_default_header("Impersonate-Extra-authentication.kubernetes.io%2fnode-name", node)
    return api_client


def _slice(name: str, node: str, driver: str = "gpu.nvidia.com", pool: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool or node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


def _eventually(check: Callable[[], str | None], timeout: float = 20.0) -> None:
    """The policy and RBAC caches of the API server take a moment to see new objects."""
    deadline = time.monotonic() + timeout
    last = "never checked"
    while time.monotonic() < deadline:
        result = check()
        if result is None:
            return
        last = result
        time.sleep(0.3)
    pytest.fail(last)


def test_plugin_may_write_only_its_own_nodes_slices(kube_apiserver: Any, namespace: str) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    release = f"p{uuid.uuid4().hex[:6]}"
    docs = _render(release, namespace, "webhook.enabled=false")
    admin = kube_apiserver.api_client()
    created: list[dict[str, Any]] = []
    for doc in docs:
        if doc["kind"] in (
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ):
            _create(admin, doc, namespace, dry_run=False)
            created.append(doc)
    sa = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"]
    user = f"system:serviceaccount:{namespace}:{sa}"
    on_a: Any = client.ResourceV1Api(_as_plugin(kube_apiserver, user, "node-a"))
    admin_resource: Any = client.ResourceV1Api(admin)
    suffix = uuid.uuid4().hex[:6]
    try:

        def own_slice_allowed() -> str | None:
            try:
                on_a.create_resource_slice(_slice(f"a-{suffix}", "node-a"))
            except ApiException as exc:
                return f"creating its own node's slice failed: {exc.status} {exc.body}"
            return None

        _eventually(own_slice_allowed)

        def other_node_denied() -> str | None:
            try:
                on_a.create_resource_slice(_slice(f"b-{suffix}", "node-b"))
            except ApiException as exc:
                if exc.status == 403 and "may only write ResourceSlices of its own node" in str(exc.body):
                    return None
                return f"unexpected error: {exc.status} {exc.body}"
            admin_resource.delete_resource_slice(f"b-{suffix}")
            return "a slice of node-b was created by node-a's plugin"

        _eventually(other_node_denied)

        with pytest.raises(ApiException) as foreign_driver:
            on_a.create_resource_slice(_slice(f"c-{suffix}", "node-a", driver="other.example.com"))
        assert foreign_driver.value.status == 403
        assert "may only write ResourceSlices of driver gpu.nvidia.com" in str(foreign_driver.value.body)

        # A pool named after another node, on its own node: denied.
        with pytest.raises(ApiException) as foreign_pool:
            on_a.create_resource_slice(_slice(f"f-{suffix}", "node-a", pool="node-b"))
        assert foreign_pool.value.status == 403
        assert "may only publish the pool named after its node, not node-b" in str(foreign_pool.value.body)

        # Deleting: its own slice yes, another node's (made by the admin) no.
        admin_resource.create_resource_slice(_slice(f"d-{suffix}", "node-b"))
        with pytest.raises(ApiException) as delete_other:
            on_a.delete_resource_slice(f"d-{suffix}")
        assert delete_other.value.status == 403

        # Changing another node's slice: denied. Moving it to node-a is no way around that: nodeName and the
        # pool name are immutable (the API server refuses before admission).
        theirs = admin_resource.read_resource_slice(f"d-{suffix}")
        theirs.spec.pool.generation = 2
        with pytest.raises(ApiException) as update_other:
            on_a.replace_resource_slice(f"d-{suffix}", theirs)
        assert update_other.value.status == 403, update_other.value.body
        assert "not those of node node-b" in str(update_other.value.body), update_other.value.body
        taken = _slice(f"d-{suffix}", "node-a")
        taken["metadata"]["resourceVersion"] = theirs.metadata.resource_version
        with pytest.raises(ApiException) as move_other:
            on_a.replace_resource_slice(f"d-{suffix}", taken)
        assert move_other.value.status in (403, 422) and "immutable" in str(move_other.value.body)
        # Its own slice it may update.
        own = on_a.read_resource_slice(f"a-{suffix}")
        own.spec.pool.generation = 2
        on_a.replace_resource_slice(f"a-{suffix}", own)
        admin_resource.delete_resource_slice(f"d-{suffix}")
        on_a.delete_resource_slice(f"a-{suffix}")

        # Without a node in its token the plugin can write nothing.
        nodeless: Any = client.ResourceV1Api(_as_plugin(kube_apiserver, user, None))
        with pytest.raises(ApiException) as no_node:
            nodeless.create_resource_slice(_slice(f"e-{suffix}", "node-a"))
        assert "names no node" in str(no_node.value.body)

        # RBAC: claims may be read, not listed; pods and secrets not at all.
        with pytest.raises(ApiException) as list_claims:
            on_a.list_namespaced_resource_claim(namespace)
        assert list_claims.value.status == 403
        core: Any = client.CoreV1Api(_as_plugin(kube_apiserver, user, "node-a"))
        with pytest.raises(ApiException) as secrets:
            core.list_namespaced_secret(namespace)
        assert secrets.value.status == 403
    finally:
        for name in (f"{x}-{suffix}" for x in "abcdef"):
            with contextlib.suppress(ApiException):
                admin_resource.delete_resource_slice(name)
        _delete_cluster_objects(admin, created)


def _delete_cluster_objects(admin: Any, docs: list[dict[str, Any]]) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    rbac: Any = client.RbacAuthorizationV1Api(admin)
    admission: Any = client.AdmissionregistrationV1Api(admin)
    deleters = {
        "ClusterRole": rbac.delete_cluster_role,
        "ClusterRoleBinding": rbac.delete_cluster_role_binding,
        "ValidatingAdmissionPolicy": admission.delete_validating_admission_policy,
        "ValidatingAdmissionPolicyBinding": admission.delete_validating_admission_policy_binding,
    }
    for doc in docs:
        delete = deleters.get(doc["kind"])
        if delete is not None:
            with contextlib.suppress(ApiException):
                delete(doc["metadata"]["name"])
