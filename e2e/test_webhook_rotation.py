"""The webhook's serving certificate is renewed while claims are created, and not one claim is refused.

Runs on kind (`make e2e-kind`, with the image run.sh built and loaded) and, opt-in with the chart tests
(`DRA_GPU_E2E_CHART=1`, e2e/run-e2e.sh runs it after e2e/test_chart_install.py), on the local cluster. Neither
has cert-manager: the chart is installed with its default webhook TLS mode (Helm-generated CA and
certificate), which also shows that the README's `helm install` needs no cert-manager. Only the webhook
runs: the plugin DaemonSet selects no node and the DeviceClasses are off, so this release stays out of the
way of the plugin release.

The renewal is what an operator does in that mode: `helm upgrade --reuse-values --set
webhook.tls.helm.rotation=<new>`. The CA and the caBundle stay, the serving Secret changes, the kubelet
updates the mounted files (within about a minute) and each webhook pod serves the new certificate without a
restart (each pod's certificate is read from inside the pod: pod IPs are not reachable from the host on
kind). Meanwhile a loop creates claims with a gpu.nvidia.com config (each one a webhook call, failurePolicy
Fail) and, now and then, a bad one, which must be refused by the webhook (so the webhook was answering).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from e2e.image.build_local_image import DEFAULT_REFERENCE, build_for_cluster, import_into_cluster
from e2e.lib.chart import CHART_DIR, find_helm
from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import DriverMode, E2ESettings, load_settings
from e2e.lib.waiting import wait_until
from e2e.lib.workloads import claim, gpu_config_time_slicing

_SETTINGS = load_settings()
ON_KIND = _SETTINGS.mode is DriverMode.IN_CLUSTER and _SETTINGS.kind_cluster is not None
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.environ.get("DRA_GPU_E2E_CHART") != "1" and not ON_KIND,
        reason="chart tests are opt-in on the local cluster: set DRA_GPU_E2E_CHART=1 (kind runs them)",
    ),
]

RELEASE = "dra-gpu-rotation"
NAMESPACE = "dra-gpu-rotation-e2e"
WEBHOOK = f"{RELEASE}-webhook"  # the release name contains the chart name: fullname is the release
WEBHOOK_SELECTOR = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=webhook"
WEBHOOK_NAME = "validate-resource-claim-parameters.gpu.nvidia.com"
CLAIMS = "resourceclaims.resource.k8s.io"
PICKUP_TIMEOUT_S = 180  # the kubelet refreshes a mounted Secret at its next sync of the pod (about a minute)
BAD_EVERY = 5  # one claim in five has an invalid config


def _helm(helm: str, settings: E2ESettings, *args: str) -> str:
    argv = [helm, f"--kubeconfig={settings.kubeconfig}", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


@dataclass
class Release:
    kubectl: Kubectl
    settings: E2ESettings
    helm: str
    timings: dict[str, float] = field(default_factory=dict)

    def upgrade(self, *sets: str) -> None:
        args = ["upgrade", RELEASE, str(CHART_DIR), "-n", NAMESPACE, "--reuse-values"]
        for s in sets:
            args += ["--set", s]
        _helm(self.helm, self.settings, *args)

    def secret(self, name: str) -> dict[str, Any]:
        return self.kubectl.get_json("secret", name, namespace=NAMESPACE)

    def ca_bundle(self) -> str:
        config = self.kubectl.get_json("validatingwebhookconfiguration", WEBHOOK)
        return str(config["webhooks"][0]["clientConfig"]["caBundle"])

    def pods(self) -> list[dict[str, Any]]:
        out = self.kubectl.run("get", "pods", "-n", NAMESPACE, "-l", WEBHOOK_SELECTOR, "-o", "json").stdout
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@pytest.fixture(scope="module")
def release(kubectl: Kubectl, settings: E2ESettings) -> Iterator[Release]:
    helm = find_helm()
    if helm is None:
        pytest.fail("no helm: build it with `e2e/cluster/build.sh helm`", pytrace=False)
    reference = _kind_image(kubectl, settings) if ON_KIND else DEFAULT_REFERENCE
    if not ON_KIND:
        import_into_cluster(build_for_cluster())  # cached: the chart install test built it already
    repository, tag = reference.rsplit(":", 1)
    rel = Release(kubectl, settings, helm)
    try:
        _helm(
            helm, settings, "install", RELEASE, str(CHART_DIR), "-n", NAMESPACE, "--create-namespace",
            "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
            "--set", "image.pullPolicy=Never", "--set", "hardware=dgx-h100",
            # only the webhook: no plugin pod (no node has this label), no cluster-wide DeviceClasses
            "--set-string", "kubeletPlugin.nodeSelector.dra-gpu-e2e/no-such-node=true",
            "--set", "deviceClasses.gpu.enabled=false", "--set", "deviceClasses.mig.enabled=false",
            "--set", "deviceClasses.gpuShare.enabled=false", "--set", "resourceSlicePolicy.enabled=false",
            "--wait", "--timeout=180s",
        )  # fmt: skip
        yield rel
    finally:
        try:
            _helm(helm, settings, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--ignore-not-found")
        finally:
            kubectl.run("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", check=False)
            print(
                f"\n[webhook rotation] timings {json.dumps({k: round(v, 1) for k, v in rel.timings.items()})}"
            )


def _kind_image(kubectl: Kubectl, settings: E2ESettings) -> str:
    """The image of the release e2e/kind/run.sh installed (built here and loaded into the nodes)."""
    (daemonset,) = kubectl.items(
        "daemonsets", settings.chart_namespace, "app.kubernetes.io/component=kubelet-plugin"
    )
    return str(daemonset["spec"]["template"]["spec"]["containers"][0]["image"])


# Run in the webhook container (the driver image's python): connect to the pod's own port, print the DER
# certificate it presents to a new connection.
_PEER_CERTIFICATE = """
import base64, socket, ssl, sys
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5) as raw:
    with context.wrap_socket(raw) as tls:
        print(base64.b64encode(tls.getpeercert(binary_form=True)).decode())
"""


def _served_certificate(kubectl: Kubectl, pod: dict[str, Any], port: int) -> bytes:
    """The DER certificate a webhook pod presents to a new connection."""
    out = kubectl.exec(NAMESPACE, pod["metadata"]["name"], ["python", "-c", _PEER_CERTIFICATE, str(port)])
    return base64.b64decode(out.strip())


def _secret_certificate(secret: dict[str, Any]) -> bytes:
    return ssl.PEM_cert_to_DER_cert(base64.b64decode(secret["data"]["tls.crt"]).decode())


@dataclass
class ClaimLoop:
    """Creates claims until stopped: valid ones must be admitted, every BAD_EVERY-th (invalid) refused by
    the webhook. Records every outcome that breaks that."""

    kubectl: Kubectl
    namespace: str
    admitted: int = 0
    refused_bad: int = 0
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        index = 0
        while not self.stop.is_set():
            index += 1
            bad = index % BAD_EVERY == 0
            config = gpu_config_time_slicing("VeryLong" if bad else "Medium")
            doc = claim(self.namespace, f"{'bad' if bad else 'ok'}-{index}", config)
            proc = self.kubectl.try_apply(json.dumps(doc), namespace=self.namespace)
            if bad:
                if proc.returncode != 0 and WEBHOOK_NAME in proc.stderr and "interval" in proc.stderr:
                    self.refused_bad += 1
                else:
                    self.failures.append(f"bad claim {index}: rc={proc.returncode} {proc.stderr.strip()}")
            elif proc.returncode == 0:
                self.admitted += 1
            else:
                self.failures.append(
                    f"{time.strftime('%H:%M:%S')} claim {index} refused: {proc.stderr.strip()}"
                )
            time.sleep(0.1)


def test_serving_certificate_renewal_refuses_no_claim(release: Release, namespace: str) -> None:
    kubectl = release.kubectl

    def two_ready() -> list[dict[str, Any]] | None:
        pods = release.pods()
        return pods if len(pods) == 2 and all(_ready(p) for p in pods) else None

    pods = wait_until(two_ready, timeout_s=180, what="two webhook pods Ready")
    port = int(pods[0]["spec"]["containers"][0]["ports"][0]["containerPort"])
    uids = sorted(p["metadata"]["uid"] for p in pods)
    ca, served = release.secret(f"{WEBHOOK}-ca"), release.secret(f"{WEBHOOK}-tls")
    bundle = release.ca_bundle()
    assert bundle == ca["data"]["tls.crt"] == served["data"]["ca.crt"]
    old_cert = _secret_certificate(served)
    for pod in pods:
        assert _served_certificate(kubectl, pod, port) == old_cert

    # An upgrade that changes nothing leaves the certificates alone (no new CA at every upgrade).
    release.upgrade()
    assert (
        release.secret(f"{WEBHOOK}-tls")["metadata"]["resourceVersion"]
        == served["metadata"]["resourceVersion"]
    )
    assert release.ca_bundle() == bundle

    loop = ClaimLoop(kubectl, namespace)
    worker = threading.Thread(target=loop.run, name="claims", daemon=True)
    worker.start()
    try:
        time.sleep(3)  # claims admitted with the old certificate first
        rotated_at = time.monotonic()
        release.upgrade(f"webhook.tls.helm.rotation=e2e-{int(time.time())}")
        rotated = release.secret(f"{WEBHOOK}-tls")
        new_cert = _secret_certificate(rotated)
        assert new_cert != old_cert, "the upgrade with a new rotation value issued no new certificate"
        assert release.secret(f"{WEBHOOK}-ca")["data"] == ca["data"], "the CA changed"
        assert release.ca_bundle() == bundle, "the caBundle changed"

        def all_serve_new() -> bool:
            return all(_served_certificate(kubectl, p, port) == new_cert for p in pods)

        def explain() -> str:
            logs = kubectl.run("logs", "-n", NAMESPACE, "-l", WEBHOOK_SELECTOR, "--tail=20", check=False)
            return (logs.stdout or logs.stderr)[-3000:]

        wait_until(
            all_serve_new, timeout_s=PICKUP_TIMEOUT_S, interval_s=1,
            what="both webhook pods serving the renewed certificate", explain=explain,
        )  # fmt: skip
        release.timings["certificate_pickup_s"] = time.monotonic() - rotated_at
        time.sleep(5)  # and claims admitted with the new one
    finally:
        loop.stop.set()
        worker.join(timeout=60)
    release.timings["claims_admitted"] = float(loop.admitted)
    assert not loop.failures, f"{len(loop.failures)} claims went wrong:\n" + "\n".join(loop.failures[:10])
    assert loop.admitted >= 20 and loop.refused_bad >= 5, (loop.admitted, loop.refused_bad)
    after = release.pods()
    assert sorted(p["metadata"]["uid"] for p in after) == uids, "webhook pods were replaced"
    restarts = [c.get("restartCount", 0) for p in after for c in p["status"].get("containerStatuses", [])]
    assert restarts == [0, 0], f"webhook containers restarted: {restarts}"
    stored = json.loads(kubectl.run("get", CLAIMS, "-n", namespace, "-o", "json").stdout)["items"]
    assert len(stored) == loop.admitted
