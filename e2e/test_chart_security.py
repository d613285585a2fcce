"""What one node's kubelet plugin may do in the API server (with a real token); MPS daemon pods' lifetime.

Runs with the chart tests (`DRA_GPU_E2E_CHART=1`, or on kind) against a release of its own, installed as
e2e/test_chart_install.py installs it (its `release` fixture, module-scoped: this module installs and
uninstalls again).

- The plugin's service account may create and delete pods in the driver's namespace, for its MPS daemon pods.
  With a token of that account bound to the plugin's pod (`kubectl create token --bound-object-kind Pod`, so
  it carries the node's name, as the plugin's own projected token does), the API server admits the daemon pod
  the plugin makes and refuses a pod for another node, with another image, with host `/` mounted, and deletes
  of another node's daemon pod and of the webhook's pod (templates/mps-daemon-pod-policy.yaml).
- A daemon pod serving a prepared claim is gone after `helm uninstall` (its owner is the plugin's DaemonSet);
  installed again, the plugin serves the claim and unprepares it.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest

from e2e.image.build_local_image import DEFAULT_REFERENCE
from e2e.lib.chart import CHART_DIR
from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import E2ESettings
from e2e.lib.waiting import wait_until
from e2e.test_chart_install import (  # noqa: F401  (release, shared_host_paths: fixtures)
    HARDWARE,
    MPS_DAEMON_SELECTOR,
    NAMESPACE,
    ON_KIND,
    PLUGIN_SELECTOR,
    RELEASE,
    WEBHOOK_SELECTOR,
    Release,
    _explain,
    _helm,
    _mps_manifest,
    _pods,
    _ready,
    _running,
    _uninstall,
    release,
    shared_host_paths,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.environ.get("DRA_GPU_E2E_CHART") != "1" and not ON_KIND,
        reason="chart tests are opt-in on the local cluster: set DRA_GPU_E2E_CHART=1 (no host driver); "
        "on kind (make e2e-kind) they always run",
    ),
]


def _plugin_pod(rel: Release) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        pods = [p for p in _pods(rel.kubectl, PLUGIN_SELECTOR) if p["spec"].get("nodeName") == rel.node]
        return pods[0] if len(pods) == 1 and _ready(pods[0]) else None

    found: dict[str, Any] = wait_until(
        ready, timeout_s=180, what="the plugin pod Ready", explain=_explain(rel.kubectl, PLUGIN_SELECTOR)
    )
    return found


def _plugin_api(kubectl: Kubectl, settings: E2ESettings, plugin_pod: dict[str, Any]) -> Any:
    """A CoreV1Api that authenticates with nothing but a real token of the plugin's service account, bound to
    its pod (and so carrying its node's name): no client certificate of the kubeconfig goes with it."""
    from kubernetes import client, config

    token = kubectl.run(
        "create", "token", plugin_pod["spec"]["serviceAccountName"], "-n", NAMESPACE,
        "--bound-object-kind", "Pod", "--bound-object-name", plugin_pod["metadata"]["name"],
        "--bound-object-uid", plugin_pod["metadata"]["uid"], "--duration", "10m",
    ).stdout.strip()  # fmt: skip
    admin = client.Configuration()
    load: Any = config.load_kube_config  # untyped in the client library
    load(config_file=str(settings.kubeconfig), client_configuration=admin)
    plugin = client.Configuration()
    plugin.host = admin.host
    plugin.ssl_ca_cert = admin.ssl_ca_cert
    plugin.verify_ssl = admin.verify_ssl
    plugin.api_key = {"authorization": f"Bearer {token}"}
    return client.CoreV1Api(client.ApiClient(plugin))


def _plugin_args(env: dict[str, str]) -> argparse.Namespace:
    """The plugin's flags as `dra-gpu kubelet-plugin` reads them from its container's environment."""
    from dra_gpu.cli import kubelet_plugin

    with mock.patch.dict(os.environ, env, clear=True):
        parser = argparse.ArgumentParser()
        kubelet_plugin.register(parser.add_subparsers())
        return parser.parse_args(["kubelet-plugin"])


def _refused(call: Callable[[], Any], message: str) -> str:
    from kubernetes.client.exceptions import ApiException

    try:
        call()
    except ApiException as exc:
        assert exc.status == 403, exc.body
        assert message in str(exc.body), exc.body
        return str(json.loads(str(exc.body))["message"])
    raise AssertionError(f"the plugin's token was allowed what it must not do (expected: {message})")


def test_a_plugin_token_can_create_and_delete_only_its_nodes_mps_daemon_pods(
    release: Release,  # noqa: F811
    settings: E2ESettings,
) -> None:
    """The plugin's real token: the daemon pod the plugin makes on its node is admitted; a pod for another
    node, another image, host / mounted, and deletes of another node's daemon pod and of the webhook's pod are
    refused by the API server, with the policy's reason."""
    kubectl = release.kubectl
    plugin_pod = _plugin_pod(release)
    api = _plugin_api(kubectl, settings, plugin_pod)
    # The daemon pod exactly as the plugin makes it, from the settings the chart gives the running plugin.
    from dra_gpu.cli.kubelet_plugin import daemon_pod_settings
    from dra_gpu.sharing.mps_pods import PodLauncher

    env = {e["name"]: e["value"] for e in plugin_pod["spec"]["containers"][0]["env"] if "value" in e}
    args = _plugin_args(env)
    launcher = PodLauncher(
        api.api_client,
        namespace=NAMESPACE,
        node_name=release.node,
        settings=daemon_pod_settings(args),
        host_driver_root=args.nvidia_driver_root,
        container_driver_root=args.container_driver_root or args.nvidia_driver_root,
        plugin_pod=plugin_pod["metadata"]["name"],
    )
    launcher.owner_reference()  # read with the plugin's token, as the plugin does
    base = f"{args.kubelet_plugins_directory_path}/gpu.nvidia.com/mps/e2e-security-00001"
    record = {"id": "e2e-security-00001", "stageDir": f"{base}/stage", "logDir": f"{base}/log",
              "shmDir": f"{base}/shm"}  # fmt: skip
    pod = launcher.manifest(record, {})
    # Nothing on the host backs these directories (hostPath type Directory): the pod is admitted and never
    # starts; the plugin's reconcile loop deletes it as a daemon pod of no prepared claim.
    name = pod["metadata"]["name"]
    refusals: dict[str, str] = {}

    def variant(change: Callable[[dict[str, Any]], Any], suffix: str) -> dict[str, Any]:
        bad = copy.deepcopy(pod)
        change(bad)
        bad["metadata"]["name"] = f"{name}-{suffix}"
        return bad

    other_node = variant(lambda p: p["spec"].update(nodeName="some-other-node"), "n")
    refusals["other node"] = _refused(
        lambda: api.create_namespaced_pod(NAMESPACE, other_node),
        "may only create or delete pods bound to its own node",
    )
    other_image = variant(lambda p: p["spec"]["containers"][0].update(image="registry.local/busybox:1"), "i")
    refusals["other image"] = _refused(
        lambda: api.create_namespaced_pod(NAMESPACE, other_image), "one container"
    )

    def host_root(p: dict[str, Any]) -> None:
        p["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
        p["spec"]["containers"][0]["volumeMounts"].append({"name": "host", "mountPath": "/host"})

    refusals["host /"] = _refused(
        lambda: api.create_namespaced_pod(NAMESPACE, variant(host_root, "h")), "mounts only host paths"
    )
    as_plugin = variant(
        lambda p: p["spec"].update(serviceAccountName=plugin_pod["spec"]["serviceAccountName"]), "a"
    )
    refusals["plugin's account"] = _refused(
        lambda: api.create_namespaced_pod(NAMESPACE, as_plugin), "service account"
    )

    # The real shape: admitted (and owned by the plugin's DaemonSet, read with this token).
    created = api.create_namespaced_pod(NAMESPACE, pod)
    owners = [(o.kind, o.name, o.controller) for o in created.metadata.owner_references or []]
    assert owners == [("DaemonSet", plugin_pod["metadata"]["ownerReferences"][0]["name"], None)], owners

    # Deletes: another node's daemon pod (made here by the admin) and the webhook's pod are refused.
    theirs = copy.deepcopy(pod)
    theirs["metadata"].update(name=f"{name}-b", ownerReferences=[])
    theirs["metadata"]["labels"]["gpu.nvidia.com/node"] = "some-other-node"
    theirs["spec"]["nodeName"] = "some-other-node"
    kubectl.apply(json.dumps(theirs), namespace=NAMESPACE)
    try:
        refusals["delete other node's daemon"] = _refused(
            lambda: api.delete_namespaced_pod(f"{name}-b", NAMESPACE), "not pods of node some-other-node"
        )
        webhooks = _pods(kubectl, WEBHOOK_SELECTOR)
        if webhooks:
            webhook = webhooks[0]["metadata"]["name"]
            # (on its node: not a daemon pod; on another node: not its node)
            refusals["delete webhook pod"] = _refused(
                lambda: api.delete_namespaced_pod(webhook, NAMESPACE), "the kubelet plugin"
            )
        refusals["delete plugin pod"] = _refused(
            lambda: api.delete_namespaced_pod(plugin_pod["metadata"]["name"], NAMESPACE),
            "may only create or delete MPS daemon pods",
        )
    finally:
        kubectl.run("delete", "pod", f"{name}-b", "-n", NAMESPACE, "--grace-period=0", "--force", check=False)
    # Its own daemon pod it may delete (if its reconcile loop has not already).
    from kubernetes.client.exceptions import ApiException

    try:
        api.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
    except ApiException as exc:
        assert exc.status == 404, exc.body
    print(f"\n[security] refused: {json.dumps(refusals, indent=1)}")


def _webhook_serving(kubectl: Kubectl) -> None:
    """Wait until the webhook's Service has a ready endpoint: `helm install --wait` returns once the pods are
    Ready, a moment before their EndpointSlice says so, and in between the API server refuses every claim
    with a gpu.nvidia.com config ("no endpoints available for service", failurePolicy Fail)."""

    def ready_endpoint() -> bool:
        # (an EndpointSlice carries its Service's labels)
        slices = kubectl.items("endpointslices.discovery.k8s.io", NAMESPACE, WEBHOOK_SELECTOR)
        endpoints = [e for s in slices for e in s.get("endpoints") or ()]
        return any((e.get("conditions") or {}).get("ready") for e in endpoints)

    wait_until(ready_endpoint, timeout_s=120, what="a ready endpoint of the webhook Service")


def _install_again(rel: Release, settings: E2ESettings) -> None:
    """The release as the `release` fixture installed it (run.sh's values on kind)."""
    if ON_KIND:
        assert settings.chart_values is not None
        values = ["-f", str(settings.chart_values)]
    else:
        repository, tag = DEFAULT_REFERENCE.rsplit(":", 1)
        values = [
            "--set", f"hardware={HARDWARE}", "--set", f"image.repository={repository}",
            "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never", "--set", "webhook.tls.mode=helm",
        ]  # fmt: skip
    _helm(
        rel.helm, settings.kubeconfig, "install", RELEASE, str(CHART_DIR), "-n", NAMESPACE, *values,
        "--wait", "--timeout=5m", timeout=360,
    )  # fmt: skip
    rel.uninstalled = False
    _webhook_serving(rel.kubectl)


def test_helm_uninstall_takes_the_mps_daemon_pods_with_it(
    release: Release,  # noqa: F811
    settings: E2ESettings,
    namespace: str,
) -> None:
    """An MPS claim's daemon pod, owned by the plugin's DaemonSet, is deleted by the garbage collector once
    `helm uninstall` deletes the DaemonSet (a rolling update, which replaces only pods, leaves it: see
    test_chart_install.py). Installed again, the plugin takes the claim back and unprepares it cleanly."""
    kubectl = release.kubectl
    _webhook_serving(kubectl)  # an earlier test may have just installed the release again
    manifest = _mps_manifest("whole", namespace, "gpu.nvidia.com", "GpuConfig")
    kubectl.apply("\n---\n".join(json.dumps(d) for d in manifest), namespace=namespace)
    _running(release, namespace, "whole")

    def daemons_ready() -> list[dict[str, Any]] | None:
        found = _pods(kubectl, MPS_DAEMON_SELECTOR)
        return found if found and all(_ready(p) for p in found) else None

    daemons = wait_until(daemons_ready, timeout_s=120, what="the MPS daemon pod Ready")
    (daemonset,) = kubectl.items("daemonsets", NAMESPACE, PLUGIN_SELECTOR)
    for pod in daemons:
        owners = pod["metadata"].get("ownerReferences") or []
        assert [(o["kind"], o["uid"]) for o in owners] == [("DaemonSet", daemonset["metadata"]["uid"])], (
            owners
        )
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert pod["spec"]["priorityClassName"] == "system-node-critical"
        assert pod["status"]["qosClass"] == "Burstable"
    started = time.monotonic()
    _uninstall(release, settings)
    wait_until(
        lambda: not _pods(kubectl, MPS_DAEMON_SELECTOR),
        timeout_s=120,
        what="the MPS daemon pods gone after uninstall",
    )
    release.timings["mps_daemons_gone_after_uninstall_s"] = time.monotonic() - started
    _install_again(release, settings)
    _plugin_pod(release)
    # The plugin serves the claim again (its reconcile loop restarts the daemon), and unprepares it.
    kubectl.run("delete", "pod", "whole", "-n", namespace, "--wait=true", "--timeout=120s")
    wait_until(
        lambda: not _pods(kubectl, MPS_DAEMON_SELECTOR), timeout_s=120, what="the MPS daemon pod deleted"
    )
