"""The chart's webhook: Deployment, Service and configuration; its certificates in each TLS mode (a CA that
outlives the serving certificate); the optional NetworkPolicy; and, against a real API server, that
`helm upgrade` keeps the Helm-generated certificates and a rotation keeps the CA."""

from __future__ import annotations

import base64
import contextlib
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from .test_chart import CHART, NAMESPACE, _helm, _kinds, _one, _run_helm, _template


@pytest.fixture(scope="module")
def helm() -> str:
    binary = _helm()
    if binary is None:
        pytest.skip("no helm binary: e2e/cluster/build.sh helm could not build one")
    return binary


def _webhook_parts(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    return _one(docs, "Deployment"), _one(docs, "Service"), _one(docs, "ValidatingWebhookConfiguration")


def _tls_volume(deployment: dict[str, Any]) -> str:
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    return str(next(v for v in volumes if v["name"] == "tls")["secret"]["secretName"])


def _pem(b64: str) -> bytes:
    return base64.b64decode(b64)


def _openssl(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["openssl", *args], input=stdin, capture_output=True, check=False)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def _assert_signed_by(leaf_b64: str, ca_b64: str, dns_name: str, tmp_path: Path) -> None:
    """The serving certificate chains to the CA and names the Service (what the API server checks)."""
    ca, leaf = tmp_path / "ca.pem", tmp_path / "leaf.pem"
    ca.write_bytes(_pem(ca_b64))
    leaf.write_bytes(_pem(leaf_b64))
    verified = _openssl("verify", "-CAfile", str(ca), "-verify_hostname", dns_name, str(leaf))
    assert verified.returncode == 0, verified.stdout + verified.stderr


# ------------------------------------------------------------------------------------- objects, default mode
def test_webhook_deployment_service_and_configuration(helm: str) -> None:
    docs = _template(helm)
    deployment, service, config = _webhook_parts(docs)
    pod = deployment["spec"]["template"]["spec"]
    (ctr,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert ctr["securityContext"]["readOnlyRootFilesystem"] is True
    assert ctr["command"] == ["dra-gpu", "webhook"] and "--port=8443" in ctr["args"]
    assert service["spec"]["ports"][0]["targetPort"] == "https"
    (hook,) = config["webhooks"]
    assert hook["clientConfig"]["service"] == {
        "name": service["metadata"]["name"],
        "namespace": NAMESPACE,
        "path": "/validate-resource-claim-parameters",
        "port": 443,
    }
    resources = {r for rule in hook["rules"] for r in rule["resources"]}
    assert resources == {"resourceclaims", "resourceclaimtemplates", "deviceclasses"}
    assert all("v1" in rule["apiVersions"] for rule in hook["rules"])


def test_default_install_needs_no_cert_manager(helm: str, tmp_path: Path) -> None:
    """The README's `helm install` with default values: Helm makes a CA and a serving certificate signed by
    it for the Service's names; the caBundle is that CA; no cert-manager object anywhere."""
    docs = _template(helm)
    assert not {d["apiVersion"] for d in docs if d["apiVersion"].startswith("cert-manager.io/")}
    deployment, service, config = _webhook_parts(docs)
    served = _one(docs, "Secret", _tls_volume(deployment))
    ca = _one(docs, "Secret", f"{service['metadata']['name']}-ca")
    ca_bundle = config["webhooks"][0]["clientConfig"]["caBundle"]
    assert ca_bundle == ca["data"]["tls.crt"] == served["data"]["ca.crt"]
    assert "tls.key" not in served["data"]["ca.crt"]
    assert _pem(ca["data"]["tls.key"]) != _pem(served["data"]["tls.key"])
    dns = f"{service['metadata']['name']}.{NAMESPACE}.svc"
    _assert_signed_by(served["data"]["tls.crt"], ca_bundle, dns, tmp_path)
    # the CA's key signs at upgrades only: no pod mounts its Secret
    mounted = {
        v["secret"]["secretName"]
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet")
        for v in d["spec"]["template"]["spec"].get("volumes", [])
        if "secret" in v
    }
    assert ca["metadata"]["name"] not in mounted


# ------------------------------------------------------------------------------------------- cert-manager
def test_cert_manager_serving_certificate_comes_from_a_ca_that_outlives_it(helm: str) -> None:
    """Self-signed Issuer -> CA Certificate -> CA Issuer -> serving Certificate; the caBundle is injected from
    the CA Certificate, so renewing the serving certificate leaves it as it is."""
    docs = _template(helm, "webhook.tls.mode=cert-manager")
    deployment, service, config = _webhook_parts(docs)
    name = service["metadata"]["name"]
    assert "Secret" not in _kinds(docs), "cert-manager writes the Secrets"
    selfsigned = _one(docs, "Issuer", f"{name}-selfsigned")
    assert selfsigned["spec"] == {"selfSigned": {}}
    ca_cert = _one(docs, "Certificate", f"{name}-ca")
    assert ca_cert["spec"]["isCA"] is True
    assert ca_cert["spec"]["issuerRef"] == {"kind": "Issuer", "name": f"{name}-selfsigned"}
    assert ca_cert["spec"]["privateKey"]["rotationPolicy"] == "Never", "a renewed CA keeps its key"
    ca_issuer = _one(docs, "Issuer", f"{name}-ca")
    assert ca_issuer["spec"] == {"ca": {"secretName": ca_cert["spec"]["secretName"]}}
    serving = _one(docs, "Certificate", name)
    assert serving["spec"]["issuerRef"] == {"kind": "Issuer", "name": f"{name}-ca"}
    assert serving["spec"]["secretName"] == _tls_volume(deployment)
    assert serving["spec"]["secretName"] != ca_cert["spec"]["secretName"]
    assert f"{name}.{NAMESPACE}.svc" in serving["spec"]["dnsNames"]
    annotations = config["metadata"]["annotations"]
    assert annotations["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{ca_cert['metadata']['name']}"
    assert "caBundle" not in config["webhooks"][0]["clientConfig"], "cainjector fills it"


def test_cert_manager_with_a_users_issuer(helm: str) -> None:
    docs = _template(
        helm,
        "webhook.tls.mode=cert-manager",
        "webhook.tls.certManager.issuerRef.kind=ClusterIssuer",
        "webhook.tls.certManager.issuerRef.name=corp-ca",
    )
    assert "Issuer" not in _kinds(docs)
    serving = _one(docs, "Certificate")
    assert serving["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "corp-ca"}
    config = _one(docs, "ValidatingWebhookConfiguration")
    ref = f"{NAMESPACE}/{serving['metadata']['name']}"
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == ref


# ------------------------------------------------------------------------------------------ other modes
def test_webhook_with_existing_secret(helm: str) -> None:
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
    docs = _template(
        helm, "webhook.tls.mode=secret", "webhook.tls.secretName=my-tls", f"webhook.tls.caBundle={ca}"
    )
    assert not _kinds(docs) & {"Certificate", "Issuer", "Secret"}
    deployment, _, config = _webhook_parts(docs)
    assert config["webhooks"][0]["clientConfig"]["caBundle"] == ca
    assert _tls_volume(deployment) == "my-tls"


def test_webhook_disabled(helm: str) -> None:
    docs = _template(helm, "webhook.enabled=false", "webhook.networkPolicy.enabled=true")
    gone = {
        "Deployment",
        "Service",
        "ValidatingWebhookConfiguration",
        "Certificate",
        "PodDisruptionBudget",
        "NetworkPolicy",
    }
    assert not _kinds(docs) & gone
    assert not [d for d in docs if d["kind"] == "Secret" and "webhook" in d["metadata"]["name"]]


# ------------------------------------------------------------------------------------ what reaches it
def test_webhook_match_conditions_are_the_tested_ones(helm: str) -> None:
    """The chart's matchConditions are, character for character, those the apiserver test proves."""
    from dra_gpu.webhook.match_conditions import MATCH_CONDITIONS

    (hook,) = _one(_template(helm), "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["matchConditions"] == list(MATCH_CONDITIONS)
    assert hook["failurePolicy"] == "Fail", "what the webhook does match stays fail-closed"


def _has_gpu_config(doc: dict[str, Any]) -> bool:
    spec = doc.get("spec", {})
    configs = spec.get("config") or spec.get("devices", {}).get("config") or []
    configs += spec.get("spec", {}).get("devices", {}).get("config") or []
    return any(c.get("opaque", {}).get("driver") == "gpu.nvidia.com" for c in configs)


def test_no_label_lets_an_object_skip_validation(helm: str) -> None:
    """No objectSelector on the release label: a claim labelled app.kubernetes.io/instance=<release> is
    validated like any other. The exclusion is not needed: none of the chart's own objects carries a
    gpu.nvidia.com opaque config, so the matchConditions never send them to the webhook (which `helm install`
    creates in the same step and which cannot answer yet)."""
    docs = _template(helm)
    (hook,) = _one(docs, "ValidatingWebhookConfiguration")["webhooks"]
    assert "objectSelector" not in hook and "namespaceSelector" not in hook
    resource_kinds = {"DeviceClass", "ResourceClaim", "ResourceClaimTemplate"}
    own = [d for d in docs if d["kind"] in resource_kinds]
    assert own, "the chart renders its DeviceClasses"
    assert not [d["metadata"]["name"] for d in own if _has_gpu_config(d)]


def test_webhook_survives_one_pod_down(helm: str) -> None:
    docs = _template(helm)
    deployment = _one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    selector = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    pdb = _one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    (ctr,) = pod["containers"]
    assert ctr["livenessProbe"]["timeoutSeconds"] > 0 and ctr["readinessProbe"]["timeoutSeconds"] > 0
    # A user's own affinity replaces the default; the PDB can be turned off.
    custom = _template(
        helm,
        "webhook.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].key=pool",
        "webhook.podDisruptionBudget.enabled=false",
    )
    affinity = _one(custom, "Deployment")["spec"]["template"]["spec"]["affinity"]
    assert "podAntiAffinity" not in affinity and "nodeAffinity" in affinity
    assert "PodDisruptionBudget" not in _kinds(custom)


# ------------------------------------------------------------------------------------------ NetworkPolicy
def test_network_policy_is_off_by_default(helm: str) -> None:
    assert "NetworkPolicy" not in _kinds(_template(helm))


def test_network_policy_admits_only_the_webhook_port_from_the_given_peers(helm: str) -> None:
    deployment = _one(_template(helm), "Deployment")
    open_port = _one(
        _template(helm, "webhook.networkPolicy.enabled=true", "webhook.port=9443"), "NetworkPolicy"
    )
    spec = open_port["spec"]
    assert (
        spec["podSelector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "webhook"
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert rule == {"ports": [{"port": 9443, "protocol": "TCP"}]}, "any source, the webhook port only"
    closed = _one(
        _template(
            helm,
            "webhook.networkPolicy.enabled=true",
            "webhook.networkPolicy.from[0].ipBlock.cidr=10.0.0.0/24",
        ),
        "NetworkPolicy",
    )
    (rule,) = closed["spec"]["ingress"]
    assert rule["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    assert rule["ports"] == [{"port": 8443, "protocol": "TCP"}]


# ----------------------------------------------------------------- helm mode against a real API server
# Everything cluster-scoped with a fixed name is off, and failurePolicy Ignore: the release shares the
# session API server with other tests, and no webhook pod runs there.
ISOLATED = (
    "deviceClasses.gpu.enabled=false",
    "deviceClasses.mig.enabled=false",
    "deviceClasses.gpuShare.enabled=false",
    "resourceSlicePolicy.enabled=false",
    "webhook.failurePolicy=Ignore",
)


class _Release:
    def __init__(self, helm: str, kubeconfig: Path, api_client: Any) -> None:
        self.helm, self.kubeconfig = helm, kubeconfig
        self.name = f"wh{uuid.uuid4().hex[:6]}"
        self.namespace = f"dra-gpu-{self.name}"
        from kubernetes import client

        self.core: Any = client.CoreV1Api(api_client)
        self.admission: Any = client.AdmissionregistrationV1Api(api_client)

    def helm_run(self, verb: str, *sets: str) -> None:
        args = [verb, self.name, str(CHART), "-n", self.namespace]
        if verb == "install":
            args.append("--create-namespace")
        for s in (*ISOLATED, *sets):
            args += ["--set", s]
        out = _run_helm(self.helm, f"--kubeconfig={self.kubeconfig}", *args)
        assert out.returncode == 0, out.stdout + out.stderr

    @property
    def webhook(self) -> str:
        return f"{self.name}-dra-gpu-webhook"

    def secret(self, suffix: str) -> Any:
        return self.core.read_namespaced_secret(f"{self.webhook}-{suffix}", self.namespace)

    def ca_bundle(self) -> str:
        config = self.admission.read_validating_webhook_configuration(self.webhook)
        return str(config.webhooks[0].client_config.ca_bundle)  # base64 text, as in the manifest


@pytest.fixture
def release(helm: str, kube_apiserver: Any) -> Iterator[_Release]:
    rel = _Release(helm, kube_apiserver.kubeconfig, kube_apiserver.api_client())
    try:
        yield rel
    finally:
        _run_helm(helm, f"--kubeconfig={rel.kubeconfig}", "uninstall", rel.name, "-n", rel.namespace)
        with contextlib.suppress(ApiException):  # absent when the install failed
            rel.core.delete_namespace(rel.namespace)


@pytest.mark.apiserver
def test_helm_upgrade_keeps_the_certificates_and_a_rotation_keeps_the_ca(
    release: _Release, tmp_path: Path
) -> None:
    release.helm_run("install")
    ca, served = release.secret("ca"), release.secret("tls")
    bundle = release.ca_bundle()
    assert bundle == ca.data["tls.crt"] == served.data["ca.crt"]
    dns = f"{release.webhook}.{release.namespace}.svc"
    _assert_signed_by(served.data["tls.crt"], bundle, dns, tmp_path)

    # An upgrade with nothing to change renders the same bytes: Helm patches nothing.
    release.helm_run("upgrade")
    assert release.secret("ca").metadata.resource_version == ca.metadata.resource_version
    assert release.secret("tls").metadata.resource_version == served.metadata.resource_version
    assert release.ca_bundle() == bundle

    # webhook.tls.helm.rotation: a new serving certificate and key from the same CA; the caBundle stays.
    release.helm_run("upgrade", "webhook.tls.helm.rotation=2026-11-27")
    rotated = release.secret("tls")
    assert rotated.data["tls.crt"] != served.data["tls.crt"]
    assert rotated.data["tls.key"] != served.data["tls.key"]
    assert release.secret("ca").data == ca.data and release.ca_bundle() == bundle
    _assert_signed_by(rotated.data["tls.crt"], bundle, dns, tmp_path)
    release.helm_run("upgrade", "webhook.tls.helm.rotation=2026-11-27")
    assert release.secret("tls").metadata.resource_version == rotated.metadata.resource_version

    # The serving Secret deleted: the next upgrade issues a new one from the same CA.
    release.core.delete_namespaced_secret(f"{release.webhook}-tls", release.namespace)
    release.helm_run("upgrade", "webhook.tls.helm.rotation=2026-11-27")
    reissued = release.secret("tls")
    assert reissued.data["tls.crt"] not in (served.data["tls.crt"], rotated.data["tls.crt"])
    assert release.ca_bundle() == bundle
    _assert_signed_by(reissued.data["tls.crt"], bundle, dns, tmp_path)
