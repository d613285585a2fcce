"""The chart's MPS daemon pod parts: the settings it passes the plugin, the daemon account, and an admission
policy that agrees with both (the API server's own verdicts are in test_chart_mps_pod_policy.py)."""

from __future__ import annotations

import json
from typing import Any

from dra_gpu.sharing.mps_pods import PodLauncher

from .mps_daemon_env import settings_from_env
from .test_chart import NAMESPACE, _env, _one, _plugin, _policy_verdicts, _template, helm  # noqa: F401  (helm: fixture)

POLICY = "dra-gpu-kubelet-plugin-own-node-mps-pods"
PLUGIN_USER = f"system:serviceaccount:{NAMESPACE}:dra-gpu-kubelet-plugin"


def _launcher(docs: list[dict[str, Any]]) -> PodLauncher:
    """The plugin's launcher, configured from the rendered DaemonSet's environment as the plugin is."""
    env = _env(_plugin(docs)[1])
    return PodLauncher(
        None,
        namespace=NAMESPACE,
        node_name="node-a",
        settings=settings_from_env(env),
        host_driver_root=env["NVIDIA_DRIVER_ROOT"],
        container_driver_root=env["CONTAINER_DRIVER_ROOT"],
    )


def _daemon_pod(launcher: PodLauncher, plugins_dir: str = "/var/lib/kubelet/plugins") -> dict[str, Any]:
    base = f"{plugins_dir}/gpu.nvidia.com/mps/claim-a-00001"
    record = {
        "id": "claim-a-00001", "stageDir": f"{base}/stage", "logDir": f"{base}/log", "shmDir": f"{base}/shm",
    }  # fmt: skip
    return launcher.manifest(record, {"CUDA_VISIBLE_DEVICES": "GPU-1"})


def _create(pod: dict[str, Any], node: str = "node-a") -> dict[str, Any]:
    return {
        "operation": "CREATE",
        "userInfo": {"username": PLUGIN_USER, "extra": {"authentication.kubernetes.io/node-name": [node]}},
        "object": pod,
        "oldObject": None,
    }


def test_process_mode_renders_no_pod_rights(helm: str) -> None:  # noqa: F811
    docs = _template(helm, "kubeletPlugin.mps.daemonMode=process")
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding")]
    assert not [d for d in docs if d["metadata"]["name"] in (POLICY, "dra-gpu-mps-daemon")]
    assert "POD_NAME" not in _env(_plugin(docs)[1])


def test_the_daemon_account_has_no_token_and_no_rights(helm: str) -> None:  # noqa: F811
    docs = _template(helm)
    account = _one(docs, "ServiceAccount", "dra-gpu-mps-daemon")
    assert account["automountServiceAccountToken"] is False
    bound = {s["name"] for d in docs if d["kind"].endswith("Binding") for s in d.get("subjects", [])}
    assert "dra-gpu-mps-daemon" not in bound
    env = _env(_plugin(docs)[1])
    assert env["MPS_DAEMON_SERVICE_ACCOUNT"] == "dra-gpu-mps-daemon"
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # to find its DaemonSet


def test_the_daemon_pod_settings_follow_the_values(helm: str) -> None:  # noqa: F811
    docs = _template(
        helm,
        "imagePullSecrets[0].name=regcred",
        "imagePullSecrets[1].name=mirror",
        "kubeletPlugin.mps.daemonPod.image.repository=registry.example.com/mps",
        "kubeletPlugin.mps.daemonPod.image.pullPolicy=Always",
        "kubeletPlugin.tolerations[0].key=gpu-only",
        "kubeletPlugin.tolerations[0].operator=Exists",
        "kubeletPlugin.tolerations[0].effect=NoExecute",
    )
    pod = _daemon_pod(_launcher(docs))
    spec, (container,) = pod["spec"], pod["spec"]["containers"]
    assert container["image"] == "registry.example.com/mps:0.1.0" and container["imagePullPolicy"] == "Always"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    assert [t["key"] for t in spec["tolerations"]] == [
        "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable", "gpu-only",
    ]  # fmt: skip
    assert spec["priorityClassName"] == "system-node-critical"
    assert container["resources"] == {"requests": {"cpu": "10m", "memory": "64Mi"}}
    # The driver root "/" (real GPUs) is the one host path outside the plugin's directory: read-only.
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["driver-root"]["readOnly"] is True
    assert {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}["driver-root"] == "/"
    # ...and the policy admits exactly that pod.
    policy = _one(docs, "ValidatingAdmissionPolicy", POLICY)
    assert _policy_verdicts(policy, _create(pod)) == [True] * len(policy["spec"]["validations"])
    default_image = json.loads(json.dumps(pod))
    default_image["spec"]["containers"][0]["image"] = "dra-gpu:0.1.0"
    assert not all(_policy_verdicts(policy, _create(default_image)) or [True])


def test_the_policy_refuses_what_the_plugin_never_makes(helm: str) -> None:  # noqa: F811
    docs = _template(helm)
    policy = _one(docs, "ValidatingAdmissionPolicy", POLICY)
    binding = _one(docs, "ValidatingAdmissionPolicyBinding", POLICY)
    assert binding["spec"] == {"policyName": POLICY, "validationActions": ["Deny"]}
    pod = _daemon_pod(_launcher(docs))
    assert all(_policy_verdicts(policy, _create(pod)) or [False])

    def verdict(change: Any, node: str = "node-a") -> bool:
        bad = json.loads(json.dumps(pod))
        change(bad)
        return all(_policy_verdicts(policy, _create(bad, node)) or [True])

    assert not verdict(lambda p: None, node="node-b")  # a pod for node-a from node-b's plugin
    assert not verdict(lambda p: p["spec"]["containers"][0]["volumeMounts"][0].pop("readOnly"))  # writable /
    assert not verdict(lambda p: p["spec"]["tolerations"].append({"operator": "Exists"}))
    assert not verdict(lambda p: p["spec"].update(automountServiceAccountToken=True))
    assert not verdict(lambda p: p["spec"]["volumes"].append({"name": "x", "hostPath": {"path": "/etc"}}))
    # Deletes see the pod as it is: another node's daemon pod, or one that is no daemon, are refused.
    theirs = json.loads(json.dumps(pod))
    theirs["spec"]["nodeName"] = "node-b"
    delete = {**_create(pod), "operation": "DELETE", "object": None}
    assert all(_policy_verdicts(policy, {**delete, "oldObject": pod}) or [False])
    assert not all(_policy_verdicts(policy, {**delete, "oldObject": theirs}) or [True])
    # Other users (the kubelet, the garbage collector, an admin) are not this policy's business.
    other = {**_create(theirs), "userInfo": {"username": "system:serviceaccount:kube-system:generic-gc"}}
    assert _policy_verdicts(policy, other) is None


def test_the_policy_follows_a_moved_plugins_directory(helm: str) -> None:  # noqa: F811
    """k0s, k3s and NVIDIA's `kubeletPluginsDirectoryPath`: the daemons' directories are where the plugin
    keeps them, and the policy admits them there and nowhere else."""
    for sets in (
        ("kubeletDir=/var/lib/k0s/kubelet",),
        ("kubeletPlugin.kubeletPluginsDirectoryPath=/srv/kubelet/plugins",),
    ):
        docs = _template(helm, *sets)
        plugins_dir = _env(_plugin(docs)[1])["KUBELET_PLUGINS_DIRECTORY_PATH"]
        policy = _one(docs, "ValidatingAdmissionPolicy", POLICY)
        launcher = _launcher(docs)
        assert all(_policy_verdicts(policy, _create(_daemon_pod(launcher, plugins_dir))) or [False]), sets
        assert not all(_policy_verdicts(policy, _create(_daemon_pod(launcher))) or [True]), sets
