"""Two GPU nodes with different hardware (the kind cluster: a DGX H100 and a PCIe server with 4 L40S).

- Claims land on the node whose devices match: an L40S claim on the L40S node, a MIG claim and a 5-GPU claim
  on the DGX, with the allocation's pool naming the node the pod runs on.
- A kubelet plugin holds its own node's credentials only: with the service-account token of the plugin pod on
  one node, creating, changing or deleting the other node's ResourceSlices is denied, and so is publishing a
  pool named after the other node. Every write is a server-side dry run (admission runs, nothing is stored),
  and the same token writing its own node's slice is allowed, so a denial cannot come from RBAC or a broken
  token.

Runs where the suite knows a second GPU node (`DRA_GPU_E2E_SECOND_NODE`, set by e2e/kind/run.sh). The rest of
the suite keeps that node cordoned, since its examples assume the DGX; these tests uncordon it while they run.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.lib.claims import allocated_devices, claims_of_pod
from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import DRIVER_NAME, E2ESettings, load_settings
from e2e.lib.waiting import wait_for_pods

pytestmark = pytest.mark.e2e

SECOND_NODE = load_settings().second_node or ""
PLUGIN_SELECTOR = "app.kubernetes.io/component=kubelet-plugin"
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"

if not SECOND_NODE:
    pytest.skip(
        "needs two GPU nodes (DRA_GPU_E2E_SECOND_NODE; the kind cluster has them)", allow_module_level=True
    )


@pytest.fixture(scope="module")
def nodes(settings: E2ESettings, kubectl: Kubectl) -> Iterator[tuple[str, str]]:
    """(the DGX node, the L40S node), with the L40S node schedulable for the module's duration."""
    first = settings.node_name
    assert first, "DRA_GPU_E2E_NODE names the suite's GPU node"
    kubectl.run("uncordon", SECOND_NODE)
    try:
        yield first, SECOND_NODE
    finally:
        kubectl.run("cordon", SECOND_NODE)


def _claim_template(
    name: str, device_class: str, selector: str | None = None, count: int = 1
) -> dict[str, Any]:
    exactly: dict[str, Any] = {
        "deviceClassName": device_class,
        "allocationMode": "ExactCount",
        "count": count,
    }
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def _pod(name: str, template: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "ctr",
                    "image": image,
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def test_claims_land_on_the_node_whose_devices_match(
    nodes: tuple[str, str], kubectl: Kubectl, settings: E2ESettings, namespace: str
) -> None:
    dgx, l40s = nodes
    wanted = {
        # pod name: (template, node it must run on)
        "l40s": (
            _claim_template(
                "l40s", "gpu.nvidia.com", 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA L40S"'
            ),
            l40s,
        ),
        "mig-1g": (
            _claim_template(
                "mig-1g", "mig.nvidia.com", 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
            ),
            dgx,
        ),
        # More whole GPUs than the L40S node has (4); the MIG claim above holds part of one H100, so not 8.
        "five-gpus": (_claim_template("five-gpus", "gpu.nvidia.com", count=5), dgx),
    }
    docs = [t for t, _ in wanted.values()] + [_pod(n, n, settings.test_image) for n in wanted]
    kubectl.apply(yaml.safe_dump_all(docs), namespace=namespace)
    pods = wait_for_pods(kubectl, namespace, wanted, phases=("Running",), timeout_s=settings.pod_timeout_s)
    claims = kubectl.items("resourceclaims.resource.k8s.io", namespace)
    for name, (_, node) in wanted.items():
        pod = pods[name]
        assert pod["spec"]["nodeName"] == node, f"pod {name} ran on {pod['spec']['nodeName']}, not {node}"
        devices = [d for c in claims_of_pod(pod, claims) for d in allocated_devices(c)]
        assert devices and all(d.driver == DRIVER_NAME and d.pool == node for d in devices), (name, devices)
    assert len([d for c in claims_of_pod(pods["five-gpus"], claims) for d in allocated_devices(c)]) == 5


# ------------------------------------------------------------------------------ another node's ResourceSlices


@pytest.fixture(scope="module")
def second_plugin(nodes: tuple[str, str], kubectl: Kubectl, settings: E2ESettings) -> Iterator[Kubectl]:
    """kubectl acting with the service-account token of the plugin pod on the L40S node (and nothing else)."""
    pods = [
        p
        for p in kubectl.items("pods", settings.chart_namespace, PLUGIN_SELECTOR)
        if p["spec"].get("nodeName") == nodes[1] and p["metadata"].get("deletionTimestamp") is None
    ]
    assert pods, f"no kubelet-plugin pod on {nodes[1]}"
    token = kubectl.exec(settings.chart_namespace, pods[0]["metadata"]["name"], ["cat", TOKEN_PATH]).strip()
    admin = json.loads(kubectl.run("config", "view", "--raw", "--minify", "-o", "json").stdout)
    cluster = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "plugin", "user": {"token": token}}],
        "contexts": [{"name": "plugin", "context": {"cluster": "c", "user": "plugin"}}],
        "current-context": "plugin",
    }
    with tempfile.TemporaryDirectory(prefix="plugin-kubeconfig-") as tmp:
        path = Path(tmp) / "kubeconfig"
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        yield Kubectl(path)


def _slice(name: str, node: str, pool: str) -> str:
    return json.dumps(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": DRIVER_NAME,
                "nodeName": node,
                "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                "devices": [],
            },
        }
    )


def _denied(kubectl: Kubectl, *args: str, stdin: str | None = None) -> str:
    proc = kubectl.run(*args, "--dry-run=server", stdin=stdin, check=False)
    assert proc.returncode != 0, f"`kubectl {' '.join(args)}` was allowed: {proc.stdout}"
    return proc.stderr


def _a_slice_of(kubectl: Kubectl, node: str) -> str:
    slices = [
        s
        for s in kubectl.items("resourceslices.resource.k8s.io")
        if s["spec"].get("nodeName") == node and s["spec"].get("driver") == DRIVER_NAME
    ]
    assert slices, f"node {node} publishes no {DRIVER_NAME} ResourceSlice"
    return str(slices[0]["metadata"]["name"])


def test_a_plugin_writes_only_its_own_nodes_resource_slices(
    nodes: tuple[str, str], kubectl: Kubectl, second_plugin: Kubectl
) -> None:
    dgx, l40s = nodes
    # The control: the same token, its own node and pool, is allowed (RBAC and the token are fine).
    allowed = second_plugin.run(
        "create", "-f", "-", "--dry-run=server", stdin=_slice("own", l40s, l40s), check=False
    )
    assert allowed.returncode == 0, allowed.stderr

    err = _denied(second_plugin, "create", "-f", "-", stdin=_slice("steal", dgx, dgx))
    assert "may only write ResourceSlices of its own node" in err and dgx in err, err
    err = _denied(second_plugin, "create", "-f", "-", stdin=_slice("pose", l40s, dgx))
    assert "may only publish the pool named after its node" in err, err

    theirs = _a_slice_of(kubectl, dgx)
    err = _denied(second_plugin, "delete", "resourceslice", theirs)
    assert "may only write ResourceSlices of its own node" in err, err
    # An UPDATE (the plugin's RBAC allows update, not patch): their slice, relabelled, sent back whole.
    changed = kubectl.get_json("resourceslices.resource.k8s.io", theirs)
    changed["metadata"].setdefault("labels", {})["tampered"] = "true"
    err = _denied(second_plugin, "replace", "-f", "-", stdin=json.dumps(changed))
    assert "may only write ResourceSlices of its own node" in err, err
    # Nothing changed on the DGX node's slice (the dry runs stored nothing, and were denied anyway).
    assert "tampered" not in (
        kubectl.get_json("resourceslices.resource.k8s.io", theirs)["metadata"].get("labels") or {}
    )


def test_plugin_token_is_bound_to_its_node(second_plugin: Kubectl, nodes: tuple[str, str]) -> None:
    """The policy relies on the node name in the token: check the token says the node its pod runs on."""
    review = json.loads(second_plugin.run("auth", "whoami", "-o", "json").stdout)
    extra = review["status"]["userInfo"].get("extra", {})
    assert extra.get("authentication.kubernetes.io/node-name") == [nodes[1]], extra
