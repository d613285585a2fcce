"""NVIDIA's top-level and webhook chart keys (kubernetes-sigs/dra-driver-nvidia-gpu deployments/helm): each
one changes the render as it does in NVIDIA's chart, mapped onto dra-gpu's objects, or is refused at install
with a message that names the key and the fix. The DaemonSet's keys are in test_nvidia_values.py."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from dra_gpu.cli.feature_gates import parse_feature_gates, refused_sharing_strategies

from .test_chart import NAMESPACE, _render_chart, _rendered_docs, _template, helm  # noqa: F401  (helm: fixture)
from .test_nvidia_values import NVIDIA_VALUES, WITHOUT_COMPUTE_DOMAINS

CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nstand-in\n-----END CERTIFICATE-----\n").decode()


def _one(docs: list[dict[str, Any]], kind: str, component: str | None = None) -> dict[str, Any]:
    found = [
        d
        for d in docs
        if d["kind"] == kind
        and (
            component is None
            or d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
        )
    ]
    assert len(found) == 1, [d["metadata"]["name"] for d in found]
    return found[0]


def _refused(helm: str, message: str, *args: str, namespace: str = NAMESPACE) -> None:  # noqa: F811
    out = _render_chart(helm, *args, namespace=namespace)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def _webhook_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = _one(docs, "Deployment")["spec"]["template"]["spec"]
    return pod


# ------------------------------------------------------------------------------------------- namespaces


def test_namespace_override_moves_every_namespaced_object(helm: str) -> None:  # noqa: F811
    docs = _template(helm, "namespaceOverride=gpu-system")
    namespaced = [d for d in docs if "namespace" in d["metadata"]]
    assert namespaced and {d["metadata"]["namespace"] for d in namespaced} == {"gpu-system"}
    webhook = _one(docs, "ValidatingWebhookConfiguration")["webhooks"][0]
    assert webhook["clientConfig"]["service"]["namespace"] == "gpu-system"
    binding = _one(docs, "ClusterRoleBinding")
    assert binding["subjects"][0]["namespace"] == "gpu-system"
    _refused(
        helm, "namespaceOverride", "--set", "namespaceOverride=Not_A_Namespace"
    )  # the schema: a DNS label
    # The same setting as `namespace`: both may be given only when they agree.
    assert _template(helm, "namespaceOverride=gpu-system", "namespace=gpu-system")
    _refused(
        helm,
        "namespace=a and NVIDIA's namespaceOverride=b differ",
        "--set",
        "namespace=a",
        "--set",
        "namespaceOverride=b",
    )


def test_default_namespace_is_refused_unless_allowed(helm: str) -> None:  # noqa: F811
    _refused(helm, "the release namespace is 'default'", namespace="default")
    _refused(helm, "set allowDefaultNamespace=true", namespace="default")
    for allowed in ("allowDefaultNamespace=true", "namespaceOverride=default", "namespace=default"):
        docs = _rendered_docs(helm, "--set", allowed, namespace="default")
        assert _one(docs, "DaemonSet")["metadata"]["namespace"] == "default", allowed
    # Another release namespace needs nothing, and a named namespace other than 'default' is not refused.
    assert _rendered_docs(helm, "--set", "namespaceOverride=gpu-system", namespace="default")


# ------------------------------------------------------------------------------------- selector labels


def test_selector_labels_override_replaces_name_and_instance(helm: str) -> None:  # noqa: F811
    docs = _rendered_docs(helm, "--set-json", 'selectorLabelsOverride={"app":"gpu-driver","tier":"infra"}')
    override = {"app": "gpu-driver", "tier": "infra"}
    for kind, component in (("DaemonSet", "kubelet-plugin"), ("Deployment", "webhook")):
        workload = _one(docs, kind)
        selector = workload["spec"]["selector"]["matchLabels"]
        assert selector == {**override, "app.kubernetes.io/component": component}, kind
        assert selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()
    webhook_selector = {**override, "app.kubernetes.io/component": "webhook"}
    assert _one(docs, "Service")["spec"]["selector"] == webhook_selector
    assert _one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == webhook_selector
    anti = _webhook_pod(docs)["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"] == webhook_selector
    # Without it: our own selector labels (the default render is unchanged).
    default = _one(_rendered_docs(helm), "DaemonSet")["spec"]["selector"]["matchLabels"]
    assert default == {
        "app.kubernetes.io/name": "dra-gpu",
        "app.kubernetes.io/instance": "dra-gpu",
        "app.kubernetes.io/component": "kubelet-plugin",
    }


def test_selector_labels_override_reaches_the_network_policies(helm: str) -> None:  # noqa: F811
    docs = _template(
        helm,
        "selectorLabelsOverride.app=gpu-driver",
        "webhook.networkPolicy.enabled=true",
        "kubeletPlugin.networkPolicy.enabled=true",
    )
    selectors = [d["spec"]["podSelector"]["matchLabels"] for d in docs if d["kind"] == "NetworkPolicy"]
    assert sorted(s["app.kubernetes.io/component"] for s in selectors) == ["kubelet-plugin", "webhook"]
    assert all(s["app"] == "gpu-driver" and "app.kubernetes.io/instance" not in s for s in selectors)


def test_selector_labels_override_cannot_take_the_component_label(helm: str) -> None:  # noqa: F811
    _refused(
        helm,
        "selectorLabelsOverride.app.kubernetes.io/component: dra-gpu adds this label itself",
        "--set-json",
        'selectorLabelsOverride={"app.kubernetes.io/component":"x"}',
    )


# ------------------------------------------------------------------------------------ DeviceClass API


def test_resource_api_version_sets_the_device_classes_version(helm: str) -> None:  # noqa: F811
    default = {d["apiVersion"] for d in _rendered_docs(helm) if d["kind"] == "DeviceClass"}
    assert default == {"resource.k8s.io/v1"}
    docs = _template(helm, "resourceApiVersion=resource.k8s.io/v1beta1")
    classes = [d for d in docs if d["kind"] == "DeviceClass"]
    assert len(classes) == 3 and {d["apiVersion"] for d in classes} == {"resource.k8s.io/v1beta1"}
    _refused(helm, "resourceApiVersion", "--set", "resourceApiVersion=resource.k8s.io/v2")


# ------------------------------------------------------------------------------------ service accounts


def _plugin_account(docs: list[dict[str, Any]]) -> str:
    name: str = _one(docs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"]
    binding = _one(docs, "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == name  # the chart's RBAC always binds the account the pods use
    return name


def _plugin_accounts_created(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d
        for d in docs
        if d["kind"] == "ServiceAccount"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "kubelet-plugin"
    ]


def test_nvidia_service_account_create_false_creates_none(helm: str) -> None:  # noqa: F811
    docs = _template(helm, "serviceAccount.create=false")
    assert _plugin_accounts_created(docs) == []
    assert _plugin_account(docs) == "default-kubeletplugin"  # NVIDIA's name without a name given
    docs = _template(helm, "serviceAccount.create=false", "serviceAccount.name=gpu")
    assert _plugin_accounts_created(docs) == [] and _plugin_account(docs) == "gpu-kubeletplugin"
    # The admission policies name the account the pods use.
    policy = next(
        d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and "gpu-kubeletplugin" in str(d)
    )
    assert "system:serviceaccount:dra-gpu:gpu-kubeletplugin" in str(policy)


def test_nvidia_service_account_name_and_annotations(helm: str) -> None:  # noqa: F811
    docs = _template(
        helm, "serviceAccount.name=gpu", "serviceAccount.annotations.iam\\.example\\.com/role=gpu-driver"
    )
    (account,) = _plugin_accounts_created(docs)
    assert account["metadata"]["name"] == "gpu-kubeletplugin" == _plugin_account(docs)
    assert account["metadata"]["annotations"] == {"iam.example.com/role": "gpu-driver"}
    # dra-gpu's own key wins over NVIDIA's name.
    docs = _template(helm, "serviceAccount.name=gpu", "kubeletPlugin.serviceAccount.name=mine")
    assert _plugin_account(docs) == "mine"
    # Defaults: our account, no annotations.
    (account,) = _plugin_accounts_created(_rendered_docs(helm))
    assert (
        account["metadata"]["name"] == "dra-gpu-kubelet-plugin" and "annotations" not in account["metadata"]
    )


def test_webhook_service_account_annotations_and_no_account(helm: str) -> None:  # noqa: F811
    docs = _template(helm, "webhook.serviceAccount.annotations.a=b")
    account = _one(docs, "ServiceAccount", "webhook")
    assert account["metadata"]["annotations"] == {"a": "b"}
    # create false without a name: the namespace's default account, as NVIDIA's chart.
    docs = _template(helm, "webhook.serviceAccount.create=false")
    assert not [d for d in docs if d["kind"] == "ServiceAccount" and "webhook" in d["metadata"]["name"]]
    assert _webhook_pod(docs)["serviceAccountName"] == "default"
    docs = _template(helm, "webhook.serviceAccount.create=false", "webhook.serviceAccount.name=mine")
    assert _webhook_pod(docs)["serviceAccountName"] == "mine"


# --------------------------------------------------------------------------------------- the webhook


def test_webhook_ports(helm: str) -> None:  # noqa: F811
    docs = _template(
        helm, "webhook.servicePort=9443", "webhook.containerPort=10250", "webhook.networkPolicy.enabled=true"
    )
    assert _one(docs, "Service")["spec"]["ports"] == [
        {"name": "https", "port": 9443, "targetPort": "https", "protocol": "TCP"}
    ]
    assert (
        _one(docs, "ValidatingWebhookConfiguration")["webhooks"][0]["clientConfig"]["service"]["port"] == 9443
    )
    pod = _webhook_pod(docs)
    container = pod["containers"][0]
    assert "--port=10250" in container["args"] and container["ports"][0]["containerPort"] == 10250
    assert "sysctls" not in pod["securityContext"]
    policy = _one(docs, "NetworkPolicy", "webhook")
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": 10250, "protocol": "TCP"}]
    # Defaults: Service 443, container webhook.port.
    docs = _rendered_docs(helm)
    assert _one(docs, "Service")["spec"]["ports"][0]["port"] == 443
    assert "--port=8443" in _webhook_pod(docs)["containers"][0]["args"]


def test_a_privileged_container_port_is_made_bindable_for_the_non_root_webhook(helm: str) -> None:  # noqa: F811
    pod = _webhook_pod(_template(helm, "webhook.containerPort=443"))
    assert pod["securityContext"]["sysctls"] == [
        {"name": "net.ipv4.ip_unprivileged_port_start", "value": "443"}
    ]
    assert pod["securityContext"]["runAsNonRoot"] is True
    # A user's own value for that sysctl is kept as given.
    pod = _webhook_pod(
        _rendered_docs(
            helm,
            "--set",
            "webhook.containerPort=443",
            "--set-json",
            'webhook.podSecurityContext={"sysctls":[{"name":"net.ipv4.ip_unprivileged_port_start","value":"0"}]}',
        )
    )
    assert pod["securityContext"]["sysctls"] == [
        {"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}
    ]


def test_webhook_priority_strategy_and_pod_security_context(helm: str) -> None:  # noqa: F811
    docs = _rendered_docs(
        helm,
        "--set",
        "webhook.priorityClassName=system-cluster-critical",
        "--set-json",
        'webhook.strategy={"type":"RollingUpdate","rollingUpdate":{"maxUnavailable":"100%"}}',
        "--set-json",
        'webhook.podSecurityContext={"fsGroup":2000,"runAsUser":1001}',
    )
    deployment = _one(docs, "Deployment")
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "100%"},
    }
    pod = deployment["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["securityContext"] == {
        "fsGroup": 2000,
        "runAsUser": 1001,
        "runAsGroup": 65532,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    default = _one(_rendered_docs(helm), "Deployment")
    assert (
        "strategy" not in default["spec"] and "priorityClassName" not in default["spec"]["template"]["spec"]
    )


def test_webhook_container_values(helm: str) -> None:  # noqa: F811
    docs = _rendered_docs(
        helm,
        "--set",
        "webhook.containers.webhook.resources.limits.memory=1Gi",
        "--set",
        "webhook.containers.webhook.securityContext.privileged=false",
        "--set",
        "webhook.containers.webhook.securityContext.readOnlyRootFilesystem=false",
        "--set-json",
        'webhook.containers.webhook.env=[{"name":"EXTRA","value":"1"}]',
    )
    container = _webhook_pod(docs)["containers"][0]
    assert container["resources"] == {"limits": {"memory": "1Gi"}}
    assert container["securityContext"] == {
        "privileged": False,
        "readOnlyRootFilesystem": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert {"name": "EXTRA", "value": "1"} in container["env"]
    # NVIDIA's empty resources (its default) leave ours.
    container = _webhook_pod(_rendered_docs(helm, "--set-json", "webhook.containers.webhook.resources={}"))[
        "containers"
    ][0]
    assert container["resources"]["requests"] == {"cpu": "10m", "memory": "64Mi"}
    _refused(helm, "containers", "--set", "webhook.containers.sidecar.env=[]")


# ------------------------------------------------------------------------------------ webhook TLS


def test_nvidia_tls_secret_keys(helm: str) -> None:  # noqa: F811
    docs = _template(
        helm, "webhook.tls.mode=secret", "webhook.tls.secret.name=my-tls", f"webhook.tls.secret.caBundle={CA}"
    )
    volumes = {v["name"]: v for v in _webhook_pod(docs)["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "my-tls"
    assert _one(docs, "ValidatingWebhookConfiguration")["webhooks"][0]["clientConfig"]["caBundle"] == CA
    _refused(
        helm,
        "webhook.tls.secretName and NVIDIA's webhook.tls.secret.name differ",
        "--set",
        "webhook.tls.mode=secret",
        "--set",
        "webhook.tls.secret.name=a",
        "--set",
        "webhook.tls.secretName=b",
        "--set",
        f"webhook.tls.caBundle={CA}",
    )
    _refused(
        helm,
        "needs webhook.tls.caBundle (NVIDIA's webhook.tls.secret.caBundle)",
        "--set",
        "webhook.tls.mode=secret",
        "--set",
        "webhook.tls.secret.name=my-tls",
    )


def _cert_manager(helm: str, *args: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # noqa: F811
    docs = _rendered_docs(helm, "--set", "webhook.tls.mode=cert-manager", *args)
    serving = next(d for d in docs if d["kind"] == "Certificate" and not d["spec"].get("isCA"))
    return docs, serving


@pytest.mark.parametrize(("issuer_type", "kind"), [("clusterissuer", "ClusterIssuer"), ("issuer", "Issuer")])
def test_nvidia_issuer_type_uses_an_existing_issuer(helm: str, issuer_type: str, kind: str) -> None:  # noqa: F811
    docs, serving = _cert_manager(
        helm,
        "--set",
        f"webhook.tls.certManager.issuerType={issuer_type}",
        "--set",
        "webhook.tls.certManager.issuerName=corp-ca",
    )
    assert serving["spec"]["issuerRef"] == {"kind": kind, "name": "corp-ca"}
    assert not [d for d in docs if d["kind"] == "Issuer"]  # no chart CA: the named issuer signs
    annotations = _one(docs, "ValidatingWebhookConfiguration")["metadata"]["annotations"]
    assert annotations["cert-manager.io/inject-ca-from"] == f"dra-gpu/{serving['metadata']['name']}"
    _refused(
        helm,
        f"issuerType={issuer_type} needs webhook.tls.certManager.issuerName",
        "--set",
        "webhook.tls.mode=cert-manager",
        "--set",
        f"webhook.tls.certManager.issuerType={issuer_type}",
    )


def test_nvidia_selfsigned_is_the_charts_own_ca(helm: str) -> None:  # noqa: F811
    docs, serving = _cert_manager(helm, "--set", "webhook.tls.certManager.issuerType=selfsigned")
    assert serving["spec"]["issuerRef"] == {"kind": "Issuer", "name": "dra-gpu-webhook-ca"}
    assert len([d for d in docs if d["kind"] == "Issuer"]) == 2
    # With our issuerRef, NVIDIA's default `selfsigned` (its values.yaml) does not get in the way.
    _, serving = _cert_manager(
        helm,
        "--set",
        "webhook.tls.certManager.issuerType=selfsigned",
        "--set",
        "webhook.tls.certManager.issuerRef.kind=ClusterIssuer",
        "--set",
        "webhook.tls.certManager.issuerRef.name=x",
    )
    assert serving["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "x"}
    _refused(
        helm,
        "both name the webhook certificate's issuer",
        "--set",
        "webhook.tls.mode=cert-manager",
        "--set",
        "webhook.tls.certManager.issuerType=issuer",
        "--set",
        "webhook.tls.certManager.issuerName=a",
        "--set",
        "webhook.tls.certManager.issuerRef.name=b",
    )
    _refused(helm, "issuerType", "--set", "webhook.tls.certManager.issuerType=acme")


def test_nvidia_dns_names_are_added(helm: str) -> None:  # noqa: F811
    _, serving = _cert_manager(helm, "--set-json", 'webhook.tls.certManager.dnsNames=["webhook.example.com"]')
    assert serving["spec"]["dnsNames"] == [
        "dra-gpu-webhook.dra-gpu.svc",
        "dra-gpu-webhook.dra-gpu.svc.cluster.local",
        "webhook.example.com",
    ]


# ------------------------------------------------------------------------------- refused and gates


def test_alt_proc_devices_is_refused_when_set(helm: str) -> None:  # noqa: F811
    _refused(
        helm,
        "altProcDevices=/var/lib/nvml-mock/proc-devices: NVIDIA's stand-in for /proc/devices",
        "--set",
        "altProcDevices=/var/lib/nvml-mock/proc-devices",
    )
    _refused(helm, "hardware=dgx-h100", "--set", "altProcDevices=/x")
    assert _rendered_docs(helm, "--set-json", 'altProcDevices=""')  # NVIDIA's default


def test_the_webhook_gets_the_plugins_feature_gates(helm: str) -> None:  # noqa: F811
    def env(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
        container = _one(docs, kind)["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in container.get("env", [])}

    assert "FEATURE_GATES" not in env(_rendered_docs(helm), "Deployment")
    docs = _rendered_docs(helm, "--set-json", 'featureGates={"MPSSupport":false,"TimeSlicingSettings":true}')
    gates = env(docs, "Deployment")["FEATURE_GATES"]
    assert gates == env(docs, "DaemonSet")["FEATURE_GATES"] == "MPSSupport=false,TimeSlicingSettings=true,"
    # The webhook's parser reads the chart's rendering, and refuses MPS configs with it.
    assert set(refused_sharing_strategies(parse_feature_gates(gates))) == {"MPS"}


def test_nvidias_values_with_its_webhook_on_render_chart(helm: str) -> None:  # noqa: F811
    """NVIDIA's values.yaml with webhook.enabled=true (its cert-manager, selfsigned, ports 443, priority and
    strategy) renders, and each of those webhook values shows in the objects."""
    docs = _rendered_docs(
        helm, "-f", str(NVIDIA_VALUES), *WITHOUT_COMPUTE_DOMAINS, "--set", "webhook.enabled=true"
    )
    deployment = _one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["containers"][0]["ports"][0]["containerPort"] == 443
    assert pod["securityContext"]["sysctls"][0]["value"] == "443"
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in pod["tolerations"]
    assert _one(docs, "Service")["spec"]["ports"][0]["port"] == 443
    assert any(d["kind"] == "Certificate" for d in docs)
