"""The Helm chart, rendered by a real helm binary: lint, objects, RBAC, DeviceClasses, admission policy,
webhook TLS modes, schema errors, the rendered plain manifests, and the docs that describe its values."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu.cel.environment import compile_expression, compile_selector
from dra_gpu.cel.values import DeviceValue

from .manifest_walk import REPO, load_docs

CHART = REPO / "manifests" / "helm" / "dra-gpu"
RENDERED = REPO / "manifests" / "rendered"
NAMESPACE = "dra-gpu"


def _versions() -> dict[str, str]:
    pairs = (
        line.split("=", 1)
        for line in (REPO / "e2e/cluster/versions.env").read_text().splitlines()
        if line and not line.startswith("#") and "=" in line
    )
    return {k: v for k, v in pairs}


KUBE_VERSION = _versions()["KUBERNETES_VERSION"]


@cache
def _helm() -> str | None:
    """The helm binary: $HELM, the one e2e/cluster/build.sh builds (building it if needed), or PATH."""
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    cache_dir = Path(os.environ.get("DRA_GPU_CACHE", Path.home() / ".cache" / "dra-gpu"))
    built = cache_dir / "k8s" / KUBE_VERSION / "bin" / "helm"
    if not built.exists() and shutil.which("go"):
        subprocess.run(
            [str(REPO / "e2e/cluster/build.sh"), "helm"], check=False, capture_output=True, timeout=1800
        )
    if built.exists():
        return str(built)
    return shutil.which("helm")


@pytest.fixture(scope="module")
def helm() -> str:
    binary = _helm()
    if binary is None:
        pytest.skip(
            "no helm binary: e2e/cluster/build.sh helm could not build one (needs go and the module proxy)"
        )
    return binary


def _run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False)


def _render_chart(
    helm: str, *args: str, namespace: str = NAMESPACE, release: str = "dra-gpu"
) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart as `release` in `namespace`, with extra helm arguments."""
    return _run_helm(
        helm,
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--kube-version",
        KUBE_VERSION,
        *args,
    )


def _rendered_docs(
    helm: str, *args: str, namespace: str = NAMESPACE, release: str = "dra-gpu"
) -> list[dict[str, Any]]:
    """The documents `_render_chart` renders (it must succeed)."""
    out = _render_chart(helm, *args, namespace=namespace, release=release)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _set_args(sets: Iterable[str]) -> list[str]:
    """`--set` before each of `sets`."""
    return [arg for s in sets for arg in ("--set", s)]


def _template(helm: str, *sets: str) -> list[dict[str, Any]]:
    return _rendered_docs(helm, *_set_args(sets))


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    hits = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(hits) == 1, f"{kind} {name}: found {len(hits)}"
    return hits[0]


def _kinds(docs: list[dict[str, Any]]) -> set[str]:
    return {d["kind"] for d in docs}


def test_helm_lint_strict(helm: str) -> None:
    out = _run_helm(helm, "lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION)
    assert out.returncode == 0, out.stdout + out.stderr
    for values in (
        ["--set", "hardware=dgx-h100", "--set", "nvidiaDriverRoot=/var/lib/dra-gpu/sim-root"],
        ["--set", "webhook.tls.mode=cert-manager"],
    ):
        out = _run_helm(helm, "lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, *values)
        assert out.returncode == 0, out.stdout + out.stderr


def test_default_render_has_every_part(helm: str) -> None:
    docs = _template(helm)
    assert _kinds(docs) == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",  # the plugin's MPS daemon pods, in the release namespace only
        "RoleBinding",
        "PodDisruptionBudget",  # the webhook's: a drain never takes its last replica
        "DaemonSet",
        "Deployment",
        "Service",
        "ValidatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "DeviceClass",
        "Secret",  # the webhook's CA and serving certificate, made by Helm (the default; no cert-manager)
    }
    for doc in docs:
        if doc["kind"] not in (
            "ClusterRole",
            "ClusterRoleBinding",
            "DeviceClass",
            "ValidatingWebhookConfiguration",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ):
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]


# ------------------------------------------------------------------------------------------------ RBAC
PLUGIN_RULES = {
    ("resource.k8s.io", "resourceslices"): {"get", "list", "watch", "create", "update", "delete"},
    ("resource.k8s.io", "resourceclaims"): {"get"},
    ("", "nodes"): {"get"},
}


def _rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        assert "resourceNames" not in rule or rule["resourceNames"], rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def _check_least_privilege(docs: list[dict[str, Any]]) -> None:
    roles = [d for d in docs if d["kind"] == "ClusterRole"]
    assert len(roles) == 1, "only the kubelet plugin has a role; the webhook has none"
    assert _rules(roles[0]) == PLUGIN_RULES
    daemonset = _one(docs, "DaemonSet")
    plugin_sa = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    # MPS daemons run as pods: the plugin may manage pods in its own namespace, nothing more
    mps_role = _one(docs, "Role")
    assert mps_role["metadata"]["namespace"] == NAMESPACE
    assert mps_role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "create", "delete"]}
    ]
    mps_binding = _one(docs, "RoleBinding")
    assert mps_binding["metadata"]["namespace"] == NAMESPACE
    assert mps_binding["roleRef"]["name"] == mps_role["metadata"]["name"]
    assert mps_binding["subjects"] == [{"kind": "ServiceAccount", "name": plugin_sa, "namespace": NAMESPACE}]
    binding = _one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": roles[0]["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": plugin_sa, "namespace": NAMESPACE}]
    bound = {
        s["name"] for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding") for s in d["subjects"]
    }
    # the MPS daemon pods' own account: bound to nothing, no token (the plugin's policy pins it on its pods)
    for account in (
        d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"].endswith("-mps-daemon")
    ):
        assert account["metadata"]["name"] not in bound and account["automountServiceAccountToken"] is False
    webhook = [d for d in docs if d["kind"] == "Deployment"]
    for deployment in webhook:
        pod = deployment["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] not in bound, "the webhook must have no RBAC"
        assert pod["automountServiceAccountToken"] is False


def test_rbac_is_least_privilege(helm: str) -> None:
    _check_least_privilege(_template(helm))


def test_rendered_manifests_are_least_privilege() -> None:
    for path in sorted(RENDERED.glob("*.yaml")):
        docs = [d.body for d in load_docs(path)]
        _check_least_privilege(docs)


# ------------------------------------------------------------------------------------------ DeviceClasses
def _device(dev_type: str, driver: str = "gpu.nvidia.com") -> DeviceValue:
    from dra_gpu.cel.device import device_value

    return device_value(driver, {"name": "d", "attributes": {"type": {"string": dev_type}}, "capacity": {}})


def test_device_classes_select_their_type(helm: str) -> None:
    docs = _template(helm)
    classes = {d["metadata"]["name"]: d for d in docs if d["kind"] == "DeviceClass"}
    assert set(classes) == {"gpu.nvidia.com", "mig.nvidia.com", "gpu-share.nvidia.com"}
    wanted = {"gpu.nvidia.com": "gpu", "mig.nvidia.com": "mig", "gpu-share.nvidia.com": "gpu-share"}
    for name, cls in classes.items():
        assert cls["apiVersion"] == "resource.k8s.io/v1"
        (selector,) = cls["spec"]["selectors"]
        compiled = compile_selector(selector["cel"]["expression"])
        for dev_type in ("gpu", "mig", "gpu-share", "vfio"):
            assert compiled.matches(_device(dev_type)) == (dev_type == wanted[name]), (name, dev_type)
        assert not compiled.matches(_device(wanted[name], driver="other.example.com"))
    assert classes["gpu.nvidia.com"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in classes["mig.nvidia.com"]["spec"]


def test_device_class_toggles(helm: str) -> None:
    docs = _template(helm, "deviceClasses.gpu.extendedResourceName=", "deviceClasses.gpuShare.enabled=false")
    classes = {d["metadata"]["name"]: d for d in docs if d["kind"] == "DeviceClass"}
    assert set(classes) == {"gpu.nvidia.com", "mig.nvidia.com"}
    assert "extendedResourceName" not in classes["gpu.nvidia.com"]["spec"]


# ------------------------------------------------------------------------------------------- DaemonSet
def _plugin(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = _one(docs, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_kubelet_plugin_daemonset(helm: str) -> None:
    pod, ctr = _plugin(_template(helm))
    assert ctr["securityContext"]["privileged"] is True
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]
    assert term["matchExpressions"] == [
        {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
    ]
    mounts = {m["name"]: m for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert volumes == {
        "plugins-registry": "/var/lib/kubelet/plugins_registry",
        "plugins": "/var/lib/kubelet/plugins",
        "cdi": "/var/run/cdi",
        "driver-root": "/",
    }
    assert mounts["plugins"]["mountPropagation"] == "Bidirectional"
    assert mounts["plugins"]["mountPath"] == "/var/lib/kubelet/plugins"
    assert mounts["driver-root"]["mountPath"] == "/driver-root" and mounts["driver-root"]["readOnly"] is True
    env = _env(ctr)
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["HARDWARE"] == "real" and env["NVIDIA_DRIVER_ROOT"] == "/"
    assert env["CONTAINER_DRIVER_ROOT"] == "/driver-root"
    assert env["HTTP_ENDPOINT"] == ":8080" and env["CDI_ROOT"] == "/var/run/cdi"
    assert env["KUBELET_PLUGINS_DIRECTORY_PATH"] == "/var/lib/kubelet/plugins"
    # gRPC health probes on their own port, each with a timeout (they never queue behind prepare work)
    assert env["HEALTHCHECK_PORT"] == "51515" and env["DEVICE_HEALTH_TAINT_EFFECT"] == "NoSchedule"
    assert ctr["startupProbe"]["grpc"] == {"port": 51515, "service": "liveness"}
    assert ctr["livenessProbe"]["grpc"] == {"port": 51515, "service": "liveness"}
    assert ctr["readinessProbe"]["grpc"] == {"port": 51515, "service": "readiness"}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert ctr[probe]["timeoutSeconds"] == 5
    assert {p["name"]: p["containerPort"] for p in ctr["ports"]} == {"http": 8080, "health": 51515}
    assert ctr["resources"]["requests"] == {"cpu": "50m", "memory": "128Mi"}
    assert ctr["command"] == ["dra-gpu", "kubelet-plugin"]
    # MPS daemons in pods of their own, started from the driver's image, outlive the plugin container
    assert env["MPS_DAEMON_MODE"] == "pod" and env["MPS_DAEMON_IMAGE"] == ctr["image"]
    assert env["MPS_RECONCILE_SECONDS"] == "5"


def test_mps_daemons_as_plugin_children_when_asked(helm: str) -> None:
    _pod, ctr = _plugin(_template(helm, "kubeletPlugin.mps.daemonMode=process"))
    env = _env(ctr)
    assert env["MPS_DAEMON_MODE"] == "process" and "MPS_DAEMON_IMAGE" not in env


def test_simulated_hardware_gets_its_own_driver_root_by_default(helm: str) -> None:
    _pod, ctr = _plugin(_template(helm, "hardware=dgx-h100"))
    env = _env(ctr)
    assert env["NVIDIA_DRIVER_ROOT"] == env["CONTAINER_DRIVER_ROOT"] == "/var/lib/dra-gpu/sim-root"


def test_simulated_hardware_values(helm: str) -> None:
    _pod, ctr = _plugin(
        _template(
            helm,
            "hardware=dgx-h100",
            "nvidiaDriverRoot=/var/lib/dra-gpu/sim-root",
            "kubeletDir=/var/lib/k3s/kubelet",
            "kubeletPlugin.rollingUpdateSockets=false",
        )
    )
    env = _env(ctr)
    assert env["HARDWARE"] == "dgx-h100"
    assert env["NVIDIA_DRIVER_ROOT"] == env["CONTAINER_DRIVER_ROOT"] == "/var/lib/dra-gpu/sim-root"
    assert "POD_UID" not in env
    mounts = {m["name"]: m for m in ctr["volumeMounts"]}
    assert mounts["driver-root"]["mountPath"] == "/var/lib/dra-gpu/sim-root"
    assert "readOnly" not in mounts["driver-root"], "the simulator writes its state under the driver root"
    assert mounts["plugins"]["mountPath"] == "/var/lib/k3s/kubelet/plugins"


# ------------------------------------------------------------------------------------ admission policy
def _policy_verdicts(policy: dict[str, Any], request: dict[str, Any]) -> list[bool] | None:
    """Evaluate the policy like the API server: match conditions, then variables, then validations.
    None when the policy does not apply to the request."""
    spec = policy["spec"]
    context: dict[str, Any] = {
        "request": request,
        "object": request.get("object"),
        "oldObject": request.get("oldObject"),
    }
    for condition in spec["matchConditions"]:
        if (
            compile_expression(condition["expression"], {k: "dyn" for k in context}).evaluate(context)
            is not True
        ):
            return None
    variables: dict[str, Any] = {}
    for var in spec["variables"]:
        names = {**{k: "dyn" for k in context}, "variables": "dyn"}
        variables[var["name"]] = compile_expression(var["expression"], names).evaluate(
            {**context, "variables": variables}
        )
    names = {**{k: "dyn" for k in context}, "variables": "dyn"}
    return [
        compile_expression(v["expression"], names).evaluate({**context, "variables": variables}) is True
        for v in spec["validations"]
    ]


def _slice_request(
    user: str,
    writer_node: str | None,
    slice_node: str | None,
    operation: str = "CREATE",
    driver: str = "gpu.nvidia.com",
    pool: str | None = None,
) -> dict[str, Any]:
    # The API server leaves `extra` out entirely when the user has none.
    user_info: dict[str, Any] = {"username": user}
    if writer_node:
        user_info["extra"] = {"authentication.kubernetes.io/node-name": [writer_node]}
    where = {"nodeName": slice_node} if slice_node else {"allNodes": True}
    obj = {"spec": {"driver": driver, **where, "pool": {"name": pool or slice_node or "cluster"}}}
    request = {"operation": operation, "userInfo": user_info}
    if operation == "DELETE":
        return {**request, "object": None, "oldObject": obj}
    return {**request, "object": obj, "oldObject": None}


def test_resource_slice_policy_keeps_plugins_to_their_node(helm: str) -> None:
    docs = _template(helm)
    policy = _one(docs, "ValidatingAdmissionPolicy", "dra-gpu-kubelet-plugin-own-node-slices")
    binding = _one(docs, "ValidatingAdmissionPolicyBinding", policy["metadata"]["name"])
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["resourceslices"]
    sa = _plugin(docs)[0]["serviceAccountName"]
    plugin = f"system:serviceaccount:{NAMESPACE}:{sa}"
    assert _policy_verdicts(policy, _slice_request(plugin, "node-a", "node-a")) == [True, True, True, True]
    assert _policy_verdicts(policy, _slice_request(plugin, "node-a", "node-a", "DELETE")) == [True] * 4
    # Its own node, but a pool named after another node: only the pool rule says no.
    assert _policy_verdicts(policy, _slice_request(plugin, "node-a", "node-a", pool="node-b")) == [
        True, True, True, False,
    ]  # fmt: skip
    assert not all(_policy_verdicts(policy, _slice_request(plugin, "node-a", "node-b")) or [True])
    assert not all(_policy_verdicts(policy, _slice_request(plugin, "node-a", "node-b", "DELETE")) or [True])
    assert not all(_policy_verdicts(policy, _slice_request(plugin, "node-a", None)) or [True])
    assert not all(_policy_verdicts(policy, _slice_request(plugin, None, "node-a")) or [True])
    assert not all(
        _policy_verdicts(policy, _slice_request(plugin, "node-a", "node-a", driver="x.example.com")) or [True]
    )
    # Other writers (the garbage collector, other drivers) are not this policy's business.
    other = "system:serviceaccount:kube-system:generic-garbage-collector"
    assert _policy_verdicts(policy, _slice_request(other, None, "node-b", "DELETE")) is None


# webhook: tests/deploy/test_chart_webhook.py


# ------------------------------------------------------------------------------------ invalid values
BAD_VALUES = [
    (["webhook.tls.mode=acme"], "/webhook/tls/mode"),
    (["hardware=DGX H100"], "/hardware"),
    (["kubeletPlugin.httpPort=0"], "/kubeletPlugin/httpPort"),
    (["kubeletPlugin.httpPort=abc"], "/kubeletPlugin/httpPort"),
    (["kubeletPlugin.gpuNodeLable=x"], "gpuNodeLable"),
    (["nvidiaDriverRoot=run/nvidia/driver"], "/nvidiaDriverRoot"),
    (["image.pullPolicy=Sometimes"], "/image/pullPolicy"),
    (["kubeletPlugin.mps.daemonMode=host"], "/kubeletPlugin/mps/daemonMode"),
    (["kubeletPlugin.mps.reconcileSeconds=30"], "/kubeletPlugin/mps/reconcileSeconds"),
    (["webhook.failurePolicy=Retry"], "/webhook/failurePolicy"),
    (["deviceClasses.gpu.extendedResourceName=not a name"], "/deviceClasses/gpu/extendedResourceName"),
    (["webhook.tls.mode=secret"], "webhook.tls.mode=secret needs webhook.tls.secretName"),
    (
        ["webhook.tls.mode=secret", "webhook.tls.secretName=s"],
        "webhook.tls.mode=secret needs webhook.tls.caBundle",
    ),
    (["hardware=dgx-h100", "nvidiaDriverRoot=/"], "nvidiaDriverRoot to a dedicated directory"),
]


@pytest.mark.parametrize(("sets", "message"), BAD_VALUES, ids=[b[0][0] for b in BAD_VALUES])
def test_invalid_values_are_rejected_readably(helm: str, sets: list[str], message: str) -> None:
    args = ["template", "dra-gpu", str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    out = _run_helm(helm, *args)
    assert out.returncode != 0, f"{sets} was accepted"
    assert message in out.stderr, out.stderr


# ----------------------------------------------------------------------------- rendered plain manifests
def test_rendered_manifests_are_current(helm: str) -> None:
    out = subprocess.run(
        [str(REPO / "manifests/render.sh"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "HELM": helm},
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_rendered_manifests_start_with_a_privileged_namespace() -> None:
    files = sorted(RENDERED.glob("*.yaml"))
    assert [f.name for f in files] == ["dra-gpu-simulated-dgx-h100.yaml", "dra-gpu.yaml"]
    for path in files:
        docs = load_docs(path)
        assert (docs[0].kind, docs[0].name) == ("Namespace", NAMESPACE)
        assert docs[0].body["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
        for doc in docs:
            if doc.kind == "DeviceClass":
                assert doc.body["apiVersion"] == "resource.k8s.io/v1"


# ----------------------------------------------------------------------------------------------- docs
def _leaf_values(schema: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        if "properties" in sub and key != "resources":  # requests/limits are documented as one value
            yield from _leaf_values(sub, path + ".")
        else:
            yield path


def test_install_doc_describes_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    rows = [line for line in (REPO / "docs/install.md").read_text().splitlines() if line.startswith("| `")]
    for path in _leaf_values(schema):
        parent, _, leaf = path.rpartition(".")
        assert any(
            f"`{path}`" in row or (parent and f"`{parent}." in row and f"`.{leaf}`" in row) for row in rows
        ), f"docs/install.md has no row for the value {path}"


def test_values_file_fits_its_schema_keys() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], sub: dict[str, Any], where: str) -> None:
        for key, value in node.items():
            assert key in sub.get("properties", {}), f"values.yaml {where}{key} is not in values.schema.json"
            if isinstance(value, dict) and "properties" in sub["properties"][key]:
                walk(value, sub["properties"][key], f"{where}{key}.")

    walk(values, schema, "")


# ------------------------------------------------------------------------- chart <-> program contract
def _help_env_vars(*command: str) -> set[str]:
    """Environment variables a dra-gpu sub-command documents in its --help as `[NAME]` or `[A / B]`."""
    out = subprocess.run(
        [sys.executable, "-m", "dra_gpu.cli.main", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=REPO,
    )
    names: set[str] = set()
    for group in re.findall(r"\[([A-Z0-9_ /]+)\]", out.stdout):
        names.update(n.strip() for n in group.split("/") if n.strip())
    return names


def test_every_env_var_the_chart_sets_is_read_by_the_plugin(helm: str) -> None:
    _pod, ctr = _plugin(_template(helm, "kubeletPlugin.rollingUpdateSockets=true"))
    read = _help_env_vars("kubelet-plugin")
    unread = {e["name"] for e in ctr["env"]} - read
    assert unread == set(), (
        f"the chart sets {sorted(unread)} on the kubelet plugin, but `dra-gpu kubelet-plugin --help` "
        f"documents reading only {sorted(read)}"
    )
    # The host's driver root is mounted at /driver-root: the plugin must look there, and name host paths.
    assert {"CONTAINER_DRIVER_ROOT", "NVIDIA_DRIVER_ROOT"} <= read


def test_webhook_args_are_flags_of_the_program(helm: str) -> None:
    (ctr,) = _one(_template(helm), "Deployment")["spec"]["template"]["spec"]["containers"]
    out = subprocess.run(
        [sys.executable, "-m", "dra_gpu.cli.main", "webhook", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=REPO,
    )
    for arg in ctr["args"]:
        assert arg.split("=", 1)[0] in out.stdout, f"dra-gpu webhook has no flag {arg}"
