"""Faults on a real cluster (issue 15): the webhook down, a double-bit ECC error (XID 48) on a GPU.

Both tests change the driver that the rest of the suite uses (the webhook, the plugin's taint effect) and put
it back in `finally`, so they are marked disruptive (run last). On the local cluster they stop and restart the
driver's host processes and write the simulator's state on this machine; on kind they go through Kubernetes:
the webhook Deployment scaled to 0 and its configuration deleted and put back, the plugin's taint effect set
with `helm upgrade`, the simulator's tools run in the node's plugin pod.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.lib.claims import pod_claim_names
from e2e.lib.cluster_control import feature_enabled
from e2e.lib.driver import PLUGIN, WEBHOOK, DriverControl, HostDriver, node_slices, python_cli
from e2e.lib.example_runner import cluster_has
from e2e.lib.incluster import InClusterDriver
from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import E2ESettings
from e2e.lib.waiting import namespace_report, wait_for_pods, wait_until
from e2e.lib.workloads import (
    claim,
    claim_template,
    claim_with_opaque,
    gpu_config_time_slicing,
    pod_with_template,
)

CLAIMS = "resourceclaims.resource.k8s.io"
XID_TAINT_KEY = "gpu.nvidia.com/xid"  # dra_gpu/inventory/device_health.py


def _either(driver: DriverControl) -> HostDriver | InClusterDriver:
    assert isinstance(driver, HostDriver | InClusterDriver), f"unknown driver {type(driver).__name__}"
    return driver


class _InClusterWebhook:
    """The chart's webhook on kind, stopped and started as the host test does with its process: the
    configuration deleted (and kept, to put back), the Deployment scaled to 0 and back."""

    def __init__(self, driver: InClusterDriver) -> None:
        self.kubectl = driver.kubectl
        self.namespace = driver.namespace
        self.deployment = f"deployment/{driver.settings.chart_release}-webhook"
        self.config_name = f"{driver.settings.chart_release}-webhook"
        saved = self.kubectl.get_json("validatingwebhookconfiguration", self.config_name)
        for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
            saved["metadata"].pop(key, None)
        self.saved = saved

    def selector(self) -> str:
        return "app.kubernetes.io/component=webhook"

    def stop(self) -> None:
        self.kubectl.run(
            "delete", "validatingwebhookconfiguration", self.config_name, "--ignore-not-found", check=False
        )
        self.kubectl.run("scale", self.deployment, "-n", self.namespace, "--replicas=0")
        wait_until(
            lambda: not self.kubectl.items("pods", self.namespace, self.selector()),
            timeout_s=60, what="the webhook pods gone",
        )  # fmt: skip

    def put_back_config(self) -> None:
        self.kubectl.apply(yaml.safe_dump(self.saved))

    def start(self) -> None:
        self.put_back_config()
        self.kubectl.run("scale", self.deployment, "-n", self.namespace, "--replicas=2")
        self.kubectl.run("rollout", "status", self.deployment, "-n", self.namespace, "--timeout=180s")

    def running(self) -> bool:
        return bool(self.kubectl.items("pods", self.namespace, self.selector()))


@pytest.mark.e2e
@pytest.mark.disruptive
def test_webhook_down_blocks_only_gpu_nvidia_com_configs(
    kubectl: Kubectl, driver: DriverControl, namespace: str
) -> None:
    """With the webhook process gone (its configuration still there, failurePolicy Fail), only objects that
    carry a gpu.nvidia.com opaque config wait for it: claims for another driver and claims without a config
    create, and a claim stored invalid before the webhook existed can still be annotated and deleted."""
    ok, why = cluster_has("webhook", kubectl)
    if not ok:
        pytest.skip(why)
    either = _either(driver)
    webhook = _InClusterWebhook(either) if isinstance(either, InClusterDriver) else None

    def kubectl_apply(doc: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return kubectl.try_apply(yaml.safe_dump(doc))

    try:
        # A claim the webhook would refuse, stored while no webhook configuration exists (as objects made
        # before the driver was installed, or while it was uninstalled).
        if webhook is None:
            assert isinstance(either, HostDriver)
            either.stop_webhook()
        else:
            webhook.stop()
        stored = kubectl_apply(claim(namespace, "stored-bad", gpu_config_time_slicing("VeryLong")))
        assert stored.returncode == 0, stored.stderr
        # The configuration back, the process gone: the API server calls a webhook nobody answers.
        if webhook is None:
            assert isinstance(either, HostDriver)
            either.start_webhook()
            either.processes.stop(WEBHOOK)
            assert not either.webhook_running()
        else:
            webhook.put_back_config()
            assert not webhook.running()

        refused = kubectl_apply(claim(namespace, "gpu-valid", gpu_config_time_slicing("Medium")))
        assert refused.returncode != 0, "a gpu.nvidia.com config was admitted with its webhook down"
        assert "failed calling webhook" in refused.stderr, refused.stderr

        other = {"driver": "other.example.com", "parameters": {"kind": "Anything", "interval": "VeryLong"}}
        for doc in (
            claim_with_opaque(namespace, "other-driver", other),
            claim_with_opaque(namespace, "no-config"),
            claim_template(namespace, "template-no-config"),
        ):
            result = kubectl_apply(doc)
            assert result.returncode == 0, (
                f"{doc['kind']} {doc['metadata']['name']} refused with the webhook down: {result.stderr}"
            )

        # The stored invalid claim: a metadata-only update and the delete do not reach the webhook.
        kubectl.run("annotate", CLAIMS, "stored-bad", "-n", namespace, "e2e.dra-gpu/touched=yes")
        kubectl.run("delete", CLAIMS, "stored-bad", "-n", namespace, "--wait=true", "--timeout=60s")
        left = kubectl.run("get", CLAIMS, "stored-bad", "-n", namespace, check=False)
        assert left.returncode != 0 and "NotFound" in left.stderr, left.stdout
    finally:
        if webhook is not None:
            webhook.start()
        elif isinstance(either, HostDriver) and not either.webhook_running():
            either.stop_webhook()
            either.start_webhook()
    # Back to normal: the same valid claim goes through, an invalid one is refused naming the field.
    valid = claim(namespace, "gpu-valid", gpu_config_time_slicing("Medium"))
    wait_until(
        lambda: kubectl_apply(valid).returncode == 0, timeout_s=60, what="a valid config admitted again"
    )
    bad = kubectl_apply(claim(namespace, "bad-again", gpu_config_time_slicing("VeryLong")))
    assert bad.returncode != 0 and "sharing.timeSlicingConfig.interval" in bad.stderr, bad.stderr


def _hardware(driver: HostDriver | InClusterDriver, *args: str) -> None:
    """The simulator's control tools on the node's driver root: here, or in the node's plugin pod (kind)."""
    if isinstance(driver, InClusterDriver):
        driver.hardware(*args)
        return
    argv = [*python_cli(), "hardware", *args, "--driver-root", str(driver.settings.driver_root)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, f"`{' '.join(argv)}` failed: {proc.stderr.strip()}"


HEALTH_ENV = {"DEVICE_HEALTH_TAINT_EFFECT": "NoExecute", "DEVICE_HEALTH_RECOVERY_SECONDS": "2"}


@contextlib.contextmanager
def _plugin_with_health_env(driver: HostDriver | InClusterDriver) -> Iterator[None]:
    """The plugin with HEALTH_ENV for a while: the host plugin restarted with it, or the chart's release
    upgraded (kubeletPlugin.deviceHealthTaintEffect and extraEnv); as the suite started it afterwards."""
    if isinstance(driver, InClusterDriver):
        driver.upgrade_chart({
            "kubeletPlugin.deviceHealthTaintEffect": HEALTH_ENV["DEVICE_HEALTH_TAINT_EFFECT"],
            "kubeletPlugin.extraEnv[0].name": "DEVICE_HEALTH_RECOVERY_SECONDS",
            "kubeletPlugin.extraEnv[0].value": HEALTH_ENV["DEVICE_HEALTH_RECOVERY_SECONDS"],
        })  # fmt: skip
        try:
            driver.wait_slices()
            yield
        finally:
            driver.upgrade_chart(
                {"kubeletPlugin.deviceHealthTaintEffect": "NoSchedule", "kubeletPlugin.extraEnv": None}
            )
            driver.wait_slices()
        return
    saved = driver.processes.get(PLUGIN)
    assert saved is not None, "no recorded plugin process to restart"
    try:
        driver.stop_plugin()
        driver.start_plugin(env=HEALTH_ENV)
        driver.wait_plugin_ready()
        driver.wait_slices()
        yield
    finally:
        # The plugin as the suite started it (same argv and environment, without the overrides above).
        driver.stop_plugin()
        driver.processes.start(PLUGIN, saved.argv, driver.settings.artifacts / "plugin.log", env=saved.env)
        driver.wait_plugin_ready()
        driver.wait_slices()


def _xid_taints(kubectl: Kubectl, node: str, uuid: str) -> dict[str, list[dict[str, Any]]]:
    """device name -> its XID taints, for the devices of the GPU `uuid` (whole GPU, share, MIG)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for s in node_slices(kubectl, node):
        for d in s["spec"].get("devices") or []:
            attrs = d.get("attributes") or {}
            owner = {(attrs.get(k) or {}).get("string") for k in ("uuid", "parentUUID")}
            if uuid in owner:
                found[d["name"]] = [t for t in d.get("taints") or [] if t.get("key") == XID_TAINT_KEY]
    return found


@pytest.mark.e2e
@pytest.mark.disruptive
def test_double_bit_ecc_taints_until_reset_and_evicts_the_pod(
    kubectl: Kubectl, driver: DriverControl, settings: E2ESettings, namespace: str
) -> None:
    """XID 48 sent as a double-bit ECC event on the GPU a running pod uses, plugin with
    `DEVICE_HEALTH_TAINT_EFFECT=NoExecute` and a 2 s quiet period: every device of that GPU gets a NoExecute
    taint, the device taint eviction controller deletes the pod, the taint stays past the quiet period (the
    GPU asks for a reset) and goes only after `dra-gpu hardware recover`."""
    host = _either(driver)
    if not feature_enabled(kubectl, "DRADeviceTaints"):
        pytest.skip(
            "DRADeviceTaints is off in this cluster: the API server drops ResourceSlice taints and nothing "
            "evicts for them (enable the gate; e2e/cluster/cluster.py enables it where the release has it)"
        )
    minor: int | None = None
    with _plugin_with_health_env(host):
        try:
            kubectl.apply(
                yaml.safe_dump_all(
                    [
                        claim_template(namespace, "gpu"),
                        pod_with_template(namespace, "pod", "gpu", settings.test_image),
                    ]
                )
            )
            pods = wait_for_pods(
                kubectl,
                namespace,
                ["pod"],
                phases=("Running",),
                timeout_s=settings.pod_timeout_s,
                driver_log_tail=host.log_tail,
            )
            claim_obj = kubectl.get_json(CLAIMS, pod_claim_names(pods["pod"])["gpu"], namespace)
            device = claim_obj["status"]["allocation"]["devices"]["results"][0]["device"]
            by_name = {d["name"]: d for s in host.slices() for d in s["spec"].get("devices") or []}
            uuid = by_name[device]["attributes"]["uuid"]["string"]
            minor = int(next(g for g in host.sim_state()["gpus"] if g["uuid"] == uuid)["minor"])

            _hardware(host, "xid", "--gpu", str(minor), "--xid", "48", "--ecc-event")

            def all_tainted() -> dict[str, list[dict[str, Any]]] | None:
                taints = _xid_taints(kubectl, host.node_name, uuid)
                return taints if taints and all(taints.values()) else None

            taints = wait_until(
                all_tainted,
                timeout_s=60,
                what=f"an XID 48 taint on every device of GPU {minor} ({uuid})",
                explain=host.log_tail,
            )
            for name, found in taints.items():
                assert [(t["value"], t["effect"]) for t in found] == [("48", "NoExecute")], (name, found)
            assert device in taints

            def evicted() -> bool:
                got = kubectl.run("get", "pod", "pod", "-n", namespace, "-o", "json", check=False)
                if got.returncode != 0:
                    return "NotFound" in got.stderr
                return bool(yaml.safe_load(got.stdout)["metadata"].get("deletionTimestamp"))

            wait_until(
                evicted,
                timeout_s=120,
                what="the pod on the tainted GPU to be evicted (NoExecute device taint)",
                explain=lambda: namespace_report(kubectl, namespace, host.log_tail),
            )

            # Past the 2 s quiet period the taint stays: the simulated GPU still asks for a reset.
            time.sleep(6)
            still = _xid_taints(kubectl, host.node_name, uuid)
            assert still.get(device), f"the XID 48 taint on {device} went without a reset: {still}"

            _hardware(host, "recover", "--gpu", str(minor))
            wait_until(
                lambda: not any(_xid_taints(kubectl, host.node_name, uuid).values()),
                timeout_s=90,
                what=f"the XID taints of GPU {minor} to go after the reset",
                explain=host.log_tail,
            )
        finally:
            if minor is not None:
                _hardware(host, "recover", "--gpu", str(minor))
    left = {
        d["name"]
        for s in node_slices(kubectl, host.node_name)
        for d in s["spec"].get("devices") or []
        if any(t.get("key") == XID_TAINT_KEY for t in d.get("taints") or [])
    }
    assert not left, f"XID taints left after the test: {sorted(left)[:8]}"
