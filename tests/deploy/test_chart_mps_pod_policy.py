"""The MPS daemon pod policy against a real kube-apiserver (RBAC and admission on).

The plugin's service account may create and delete pods in the driver's namespace (for its MPS daemons);
templates/mps-daemon-pod-policy.yaml keeps a plugin to the daemon pods of its own node, of the one shape
`PodLauncher.manifest` makes from the settings the chart passes it. Here the plugin is impersonated with the
node name its token would carry (the e2e test e2e/test_chart_security.py does the same with a real token), and
the daemon pod is the one the plugin makes, from the chart's rendered environment.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dra_gpu.sharing.mps_pods import PodLauncher

from .mps_daemon_env import settings_from_env
from .test_chart_apiserver import _as_plugin, _create, _eventually, _render

pytestmark = pytest.mark.apiserver

CHART_KINDS = (
    "ServiceAccount", "Role", "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
)  # fmt: skip


@pytest.fixture
def namespace(kube_apiserver: Any) -> Iterator[str]:
    name = f"dra-gpu-mpspol-{uuid.uuid4().hex[:8]}"
    core: Any = client.CoreV1Api(kube_apiserver.api_client())
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def _settings_from(daemonset: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    """The plugin's DaemonPodSettings, parsed from the rendered DaemonSet's environment as the plugin does."""
    env = {e["name"]: e.get("value") for e in daemonset["spec"]["template"]["spec"]["containers"][0]["env"]}
    return settings_from_env(env), env


def _record(daemon_id: str, kubelet_dir: str = "/var/lib/kubelet") -> dict[str, Any]:
    base = f"{kubelet_dir}/plugins/gpu.nvidia.com/mps/{daemon_id}"
    return {
        "id": daemon_id, "stageDir": f"{base}/stage", "logDir": f"{base}/log", "shmDir": f"{base}/shm",
        "pipeDir": f"{base}/clients/pipe", "multiUser": True,
    }  # fmt: skip


class Setup:
    def __init__(self, kube_apiserver: Any, namespace: str, hardware: str) -> None:
        release = f"m{uuid.uuid4().hex[:6]}"
        sets = ["webhook.enabled=false", f"hardware={hardware}"]
        docs = _render(release, namespace, *sets)
        self.admin = kube_apiserver.api_client()
        for doc in docs:
            if doc["kind"] in CHART_KINDS:
                _create(self.admin, doc, namespace, dry_run=False)
        self.policies = [d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
        daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
        self.settings, env = _settings_from(daemonset)
        sa = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
        user = f"system:serviceaccount:{namespace}:{sa}"
        self.plugin_sa = sa
        self.namespace = namespace
        self.core: Any = client.CoreV1Api(self.admin)
        self.on_a: Any = client.CoreV1Api(_as_plugin(kube_apiserver, user, "node-a"))
        self.nowhere: Any = client.CoreV1Api(_as_plugin(kube_apiserver, user, None))
        # The plugin's DaemonSet and its pod on node-a (made by the admin, as the DaemonSet controller would):
        # the daemon pods' owner is read from there.
        apps: Any = client.AppsV1Api(self.admin)
        created = apps.create_namespaced_daemon_set(namespace, daemonset)
        owner = {
            "apiVersion": "apps/v1", "kind": "DaemonSet", "name": daemonset["metadata"]["name"],
            "uid": created.metadata.uid, "controller": True, "blockOwnerDeletion": True,
        }  # fmt: skip
        template = daemonset["spec"]["template"]
        plugin_pod: dict[str, Any] = {
            "metadata": {
                "name": "plugin-a",
                "labels": template["metadata"]["labels"],
                "ownerReferences": [owner],
            },
            "spec": {**template["spec"], "nodeName": "node-a"},
        }
        self.core.create_namespaced_pod(namespace, plugin_pod)
        self.launcher = PodLauncher(
            _as_plugin(kube_apiserver, user, "node-a"),
            namespace=namespace,
            node_name="node-a",
            settings=self.settings,
            host_driver_root=env["NVIDIA_DRIVER_ROOT"],
            container_driver_root=env["CONTAINER_DRIVER_ROOT"],
            plugin_pod="plugin-a",
        )
        self.owner_uid = created.metadata.uid

    def daemon_pod(self, daemon_id: str) -> dict[str, Any]:
        self.launcher.owner_reference()
        return self.launcher.manifest(_record(daemon_id), {"CUDA_VISIBLE_DEVICES": "GPU-1"})

    def refused(self, call: Callable[[], Any], message: str) -> None:
        with pytest.raises(ApiException) as err:
            call()
        assert err.value.status == 403, err.value.body
        assert message in str(err.value.body), err.value.body

    def cleanup(self) -> None:
        admission: Any = client.AdmissionregistrationV1Api(self.admin)
        for name in self.policies:
            admission.delete_validating_admission_policy_binding(name)
            admission.delete_validating_admission_policy(name)


@pytest.fixture(params=["real", "dgx-h100"])
def setup(request: pytest.FixtureRequest, kube_apiserver: Any, namespace: str) -> Iterator[Setup]:
    made = Setup(kube_apiserver, namespace, request.param)
    yield made
    made.cleanup()


def _mutated(pod: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    changed = copy.deepcopy(pod)
    change(changed)
    return changed


def test_a_plugin_creates_and_deletes_only_its_own_nodes_daemon_pods(setup: Setup) -> None:
    ns = setup.namespace
    pod = setup.daemon_pod("claim-a-00001")

    # The real daemon pod (the plugin's launch path: owner read from its own pod, then created): accepted.
    # Policies and RBAC take a moment to reach the API server's caches.
    def own_pod_accepted() -> str | None:
        try:
            setup.on_a.create_namespaced_pod(ns, pod)
        except ApiException as exc:
            return f"the plugin's own daemon pod was refused: {exc.status} {exc.body}"
        return None

    _eventually(own_pod_accepted)

    def node_b_refused() -> str | None:
        other = _mutated(pod, lambda p: p["spec"].update(nodeName="node-b"))
        other["metadata"]["name"] = "dra-gpu-mps-claim-b-00001"
        try:
            setup.on_a.create_namespaced_pod(ns, other)
        except ApiException as exc:
            if exc.status == 403 and "may only create or delete pods bound to its own node" in str(exc.body):
                return None
            return f"unexpected error: {exc.status} {exc.body}"
        setup.core.delete_namespaced_pod(other["metadata"]["name"], ns, grace_period_seconds=0)
        return "node-a's plugin created a pod on node-b"

    _eventually(node_b_refused)
    made = setup.core.read_namespaced_pod(pod["metadata"]["name"], ns)
    assert [(o.kind, o.uid, o.controller) for o in made.metadata.owner_references] == [
        ("DaemonSet", setup.owner_uid, None)
    ]
    assert made.spec.automount_service_account_token is False and made.status.qos_class == "Burstable"

    def renamed(p: dict[str, Any], n: int) -> dict[str, Any]:
        p["metadata"]["name"] = f"dra-gpu-mps-claim-x-{n:05d}"
        return p

    shapes: list[tuple[str, Callable[[dict[str, Any]], Any], str]] = [
        (
            "another image",
            lambda p: p["spec"]["containers"][0].update(image="attacker/tool:1"),
            "one container",
        ),
        (
            "host / mounted",
            lambda p: (
                p["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
                or p["spec"]["containers"][0]["volumeMounts"].append({"name": "host", "mountPath": "/host"})
            ),
            "mounts only host paths",
        ),
        (
            "a Secret volume",
            lambda p: p["spec"]["volumes"].append({"name": "s", "secret": {"secretName": "webhook-tls"}}),
            "mounts only host paths",
        ),
        (
            "the plugin's account",
            lambda p: p["spec"].update(serviceAccountName=setup.plugin_sa),
            "service account",
        ),
        ("a token", lambda p: p["spec"].update(automountServiceAccountToken=True), "service account"),
        (
            "every taint tolerated",
            lambda p: p["spec"]["tolerations"].append({"operator": "Exists"}),
            "tolerates",
        ),
        ("host network", lambda p: p["spec"].update(hostNetwork=True), "host's network"),
        (
            "an env from a Secret",
            lambda p: p["spec"]["containers"][0]["env"].append(
                {"name": "K", "valueFrom": {"secretKeyRef": {"name": "webhook-tls", "key": "tls.key"}}}
            ),
            "no env from Secrets",
        ),
        (
            "not a daemon",
            lambda p: p["metadata"]["labels"].update({"app.kubernetes.io/name": "x"}),
            "MPS daemon pods",
        ),
        ("another owner", lambda p: p["metadata"]["ownerReferences"][0].update(name="other"), "only owner"),
        (
            "a low priority",
            lambda p: p["spec"].update(priorityClassName="system-cluster-critical"),
            "priorityClassName",
        ),
    ]
    if setup.settings.driver_root_read_only:
        shapes.append(
            (
                "the driver root writable",
                lambda p: p["spec"]["containers"][0]["volumeMounts"][0].pop("readOnly"),
                "(read-only)",
            )
        )
    for n, (what, change, message) in enumerate(shapes):
        bad = renamed(_mutated(pod, change), n)
        setup.refused(lambda bad=bad: setup.on_a.create_namespaced_pod(ns, bad), message)  # type: ignore[misc]
        assert what

    # A token without a node name gets nothing.
    setup.refused(
        lambda: setup.nowhere.create_namespaced_pod(ns, renamed(copy.deepcopy(pod), 99)), "names no node"
    )

    # Deletes: node-b's daemon pod and a pod that is not a daemon (the webhook's, say) are refused, its own
    # daemon pod is not.
    theirs = _mutated(pod, lambda p: p["spec"].update(nodeName="node-b"))
    theirs["metadata"]["labels"]["gpu.nvidia.com/node"] = "node-b"
    theirs["metadata"]["name"] = "dra-gpu-mps-claim-b-00002"
    theirs["metadata"].pop("ownerReferences")
    setup.core.create_namespaced_pod(ns, theirs)
    setup.refused(
        lambda: setup.on_a.delete_namespaced_pod("dra-gpu-mps-claim-b-00002", ns),
        "may only create or delete pods bound to its own node, not pods of node node-b",
    )
    webhook = {
        "metadata": {"name": "webhook-abcde", "labels": {"app.kubernetes.io/component": "webhook"}},
        "spec": {"nodeName": "node-a", "containers": [{"name": "webhook", "image": "dra-gpu:0.1.0"}]},
    }
    setup.core.create_namespaced_pod(ns, webhook)
    setup.refused(lambda: setup.on_a.delete_namespaced_pod("webhook-abcde", ns), "not pod webhook-abcde")
    setup.refused(lambda: setup.on_a.delete_namespaced_pod("plugin-a", ns), "not pod plugin-a")
    setup.on_a.delete_namespaced_pod(pod["metadata"]["name"], ns)
