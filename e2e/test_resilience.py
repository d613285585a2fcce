"""The driver under disturbance on a real cluster: kubelet restarts, plugin crashes, bad input.

Upstream's e2e suites assert the same things users depend on (nvidia-conventions §15): an unmatchable selector
leaves the pod Pending with a clear event; no leaked claims or devices; slices come back after a wipe.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml

from e2e.lib.claims import is_allocated, pod_claim_names
from e2e.lib.cluster_control import restart_local_kubelet
from e2e.lib.driver import DriverControl, HostDriver, node_slices
from e2e.lib.example_runner import cluster_has
from e2e.lib.incluster import InClusterDriver
from e2e.lib.kubectl import Kubectl, KubectlError
from e2e.lib.settings import E2ESettings
from e2e.lib.sim_view import mig_instances_by_gpu
from e2e.lib.waiting import namespace_report, wait_for_pods, wait_until
from e2e.lib.workloads import claim, claim_template, gpu_config_time_slicing, pod_with_template


def _device_names(slices: list[dict[str, Any]]) -> set[str]:
    names: set[str] = set()
    for s in slices:
        spec = s.get("spec")
        assert isinstance(spec, dict)
        names |= {d["name"] for d in spec.get("devices") or []}
    return names


def _apply(kubectl: Kubectl, *docs: dict[str, Any]) -> None:
    kubectl.apply(yaml.safe_dump_all(list(docs)))


@pytest.mark.e2e
@pytest.mark.disruptive
def test_slices_republished_after_kubelet_restart_wipes_them(
    kubectl: Kubectl, driver: DriverControl, settings: E2ESettings, namespace: str
) -> None:
    before = node_slices(kubectl, driver.node_name)
    assert before, "the driver has published no ResourceSlices to start with"
    devices_before = _device_names(before)
    uids_before = {s["metadata"]["uid"] for s in before}
    if isinstance(driver, InClusterDriver):
        driver.restart_kubelet()
    else:
        restart_local_kubelet()

    def republished() -> bool:
        now = node_slices(kubectl, driver.node_name)
        uids = {s["metadata"]["uid"] for s in now}
        # New objects (the kubelet wiped the old ones at start-up) carrying the same devices.
        return bool(now) and not (uids & uids_before) and _device_names(now) == devices_before

    wait_until(
        republished,
        timeout_s=120,
        what="the node's ResourceSlices to be wiped and republished",
        explain=lambda: (
            f"slices now: {[s['metadata']['name'] for s in node_slices(kubectl, driver.node_name)]}"
            f"\n{driver.log_tail()}"
        ),
    )
    # And the node still serves claims through the re-registered plugin.
    _apply(
        kubectl,
        claim_template(namespace, "gpu"),
        pod_with_template(namespace, "pod", "gpu", settings.test_image),
    )
    wait_for_pods(
        kubectl,
        namespace,
        ["pod"],
        phases=("Running",),
        timeout_s=settings.pod_timeout_s,
        driver_log_tail=driver.log_tail,
    )


@pytest.mark.e2e
@pytest.mark.disruptive
def test_plugin_killed_during_pod_startup_then_pod_comes_up(
    kubectl: Kubectl, driver: DriverControl, settings: E2ESettings, namespace: str
) -> None:
    """SIGKILL the plugin in the middle of NodePrepareResources; after a restart the pod still starts.

    Host mode uses the plugin's fault points (`DRA_GPU_FAULT_KILL_AT=prepare-group-0`: the process kills
    itself after the sharing step began and before the CDI spec exists); in-cluster mode deletes the plugin
    pod as soon as the pod is scheduled.
    """
    template = claim_template(namespace, "gpu", config=gpu_config_time_slicing("Long"))
    pod = pod_with_template(namespace, "pod", "gpu", settings.test_image)
    if isinstance(driver, HostDriver):
        driver.stop_plugin()
        driver.start_plugin(env={"DRA_GPU_FAULT_KILL_AT": "prepare-group-0"})
        driver.wait_plugin_ready()
        _apply(kubectl, template, pod)
        driver.wait_plugin_exit(timeout_s=settings.pod_timeout_s)
        assert "fault injection: killing process at step prepare-group-0" in driver.log_tail(200)
        current = kubectl.get_json("pod", "pod", namespace)
        assert current["status"].get("phase") == "Pending", "the pod ran although its prepare was killed"
        time.sleep(2)
        driver.start_plugin()
    else:
        _apply(kubectl, template, pod)
        wait_until(
            lambda: kubectl.get_json("pod", "pod", namespace)["spec"].get("nodeName"),
            timeout_s=60,
            what="the pod to be scheduled",
        )
        driver.kill_plugin()
        driver.start_plugin()
    driver.wait_plugin_ready()
    pods = wait_for_pods(
        kubectl,
        namespace,
        ["pod"],
        phases=("Running",),
        timeout_s=settings.pod_timeout_s,
        driver_log_tail=driver.log_tail,
    )
    claim_name = pod_claim_names(pods["pod"])["gpu"]
    claim_obj = kubectl.get_json("resourceclaims.resource.k8s.io", claim_name, namespace)
    assert is_allocated(claim_obj)
    state = driver.sim_state()
    slices = {
        d["name"]: d for s in node_slices(kubectl, driver.node_name) for d in s["spec"].get("devices") or []
    }
    device = claim_obj["status"]["allocation"]["devices"]["results"][0]["device"]
    uuid = slices[device]["attributes"]["uuid"]["string"]
    gpu = next(g for g in state["gpus"] if g["uuid"] == uuid)
    assert gpu["timeslice"] == 3, (
        f"time slice of {device} after the restart: {gpu['timeslice']}, expected 3 (Long)"
    )


@pytest.mark.e2e
def test_unmatchable_selector_leaves_pod_pending_with_clear_event(
    kubectl: Kubectl, driver: DriverControl, settings: E2ESettings, namespace: str
) -> None:
    selector = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA Z9000'"
    _apply(
        kubectl,
        claim_template(namespace, "nothing", selector=selector),
        pod_with_template(namespace, "pod", "nothing", settings.test_image),
    )

    def failed_scheduling() -> list[str] | None:
        events = [e for e in kubectl.events(namespace, "pod") if e.get("reason") == "FailedScheduling"]
        return [e.get("message", "") for e in events] or None

    messages = wait_until(
        failed_scheduling,
        timeout_s=60,
        what="a FailedScheduling event for the pod",
        explain=lambda: namespace_report(kubectl, namespace, driver.log_tail),
    )
    assert any("cannot allocate all claims" in m for m in messages), messages
    time.sleep(5)
    pod = kubectl.get_json("pod", "pod", namespace)
    assert pod["status"].get("phase") == "Pending" and not pod["spec"].get("nodeName")
    claim_name = pod_claim_names(pod).get("gpu")
    if claim_name:
        assert not is_allocated(kubectl.get_json("resourceclaims.resource.k8s.io", claim_name, namespace))


@pytest.mark.e2e
def test_webhook_rejects_bad_config_naming_the_field(
    kubectl: Kubectl, driver: DriverControl, namespace: str
) -> None:
    ok, why = cluster_has("webhook", kubectl)
    if not ok:
        pytest.skip(why)
    bad = claim(namespace, "bad", gpu_config_time_slicing("VeryLong"))
    result = kubectl.try_apply(yaml.safe_dump(bad))
    assert result.returncode != 0, f"a claim with interval VeryLong was accepted: {result.stdout}"
    assert "denied the request" in result.stderr, result.stderr
    assert "sharing.timeSlicingConfig.interval" in result.stderr, result.stderr
    # The same claim with a valid value goes through the same webhook.
    good = claim(namespace, "good", gpu_config_time_slicing("Medium"))
    assert kubectl.try_apply(yaml.safe_dump(good)).returncode == 0


@pytest.mark.e2e
@pytest.mark.disruptive
def test_plugin_killed_during_unprepare_then_cleanup_completes(
    kubectl: Kubectl, driver: DriverControl, settings: E2ESettings, namespace: str
) -> None:
    """SIGKILL in the middle of NodeUnprepareResources of an on-demand MIG claim; after a restart the kubelet
    retries, and the MIG instance and the claim's CDI spec are gone (the checkpoint carried what to undo).

    Host mode uses the plugin's fault point (`DRA_GPU_FAULT_KILL_AT=unprepare-group-0`). On kind the
    simulator makes the MIG teardown's first step slow (`dra-gpu hardware fault --delay-seconds`, run in the
    plugin pod) and the plugin process is SIGKILLed while NodeUnprepareResources waits in it; the kubelet
    restarts the container in place."""
    assert isinstance(driver, HostDriver | InClusterDriver), type(driver)
    before = mig_instances_by_gpu(driver.sim_state())
    template = claim_template(
        namespace,
        "mig",
        device_class="mig.nvidia.com",
        selector="device.attributes['gpu.nvidia.com'].profile == '1g.10gb'",
    )
    _apply(kubectl, template, pod_with_template(namespace, "pod", "mig", settings.test_image))
    pods = wait_for_pods(
        kubectl,
        namespace,
        ["pod"],
        phases=("Running",),
        timeout_s=settings.pod_timeout_s,
        driver_log_tail=driver.log_tail,
    )
    claim_obj = kubectl.get_json(
        "resourceclaims.resource.k8s.io", pod_claim_names(pods["pod"])["gpu"], namespace
    )
    uid = claim_obj["metadata"]["uid"]
    created = {
        (gpu, key) for gpu, inst in mig_instances_by_gpu(driver.sim_state()).items() for key in inst
    } - {(gpu, key) for gpu, inst in before.items() for key in inst}
    assert len(created) == 1, f"expected one MIG instance created for the claim, got {created}"
    assert any(uid in name for name in driver.cdi_spec_names()), "no CDI spec named after the claim"
    if isinstance(driver, InClusterDriver):
        _sigkill_in_slow_unprepare(driver, kubectl, namespace, settings.pod_timeout_s)
    else:
        driver.stop_plugin()
        driver.start_plugin(env={"DRA_GPU_FAULT_KILL_AT": "unprepare-group-0"})
        driver.wait_plugin_ready()
        kubectl.run("delete", "pod", "pod", "-n", namespace, "--wait=false")
        driver.wait_plugin_exit(timeout_s=settings.pod_timeout_s)
        assert "fault injection: killing process at step unprepare-group-0" in driver.log_tail(200)
        driver.start_plugin()
        driver.wait_plugin_ready()

    def cleaned_up() -> bool:
        now = {(gpu, key) for gpu, inst in mig_instances_by_gpu(driver.sim_state()).items() for key in inst}
        return not (created & now) and not any(uid in name for name in driver.cdi_spec_names())

    wait_until(
        cleaned_up,
        timeout_s=settings.pod_timeout_s,
        what="the MIG instance and CDI spec to be removed",
        explain=lambda: f"MIG now: {mig_instances_by_gpu(driver.sim_state())}\n{driver.log_tail()}",
    )


SLOW_TEARDOWN = "nvmlComputeInstanceDestroy"  # the first step of a MIG device's teardown
TEARDOWN_DELAY_S = 30


def _sigkill_in_slow_unprepare(
    driver: InClusterDriver, kubectl: Kubectl, namespace: str, timeout_s: float
) -> None:
    """kind: the first step of the MIG teardown made slow on every GPU (30 s), the pod deleted, and the plugin
    SIGKILLed a few seconds after the pod's container stopped, while its NodeUnprepareResources waits in that
    step (the kubelet calls it right after the sandbox is down); faults cleared once the container runs
    again. The restarted plugin must then destroy the device itself: had the kill come after the teardown,
    it would find it gone. (The simulator holds its state lock through the delay, so nothing that reads the
    state, the plugin's metrics included, can say when the call began.)"""
    gpus = len(driver.sim_state()["gpus"])
    for index in range(gpus):
        driver.hardware(
            "fault", "-i", str(index), "--function", SLOW_TEARDOWN, "--delay-seconds", str(TEARDOWN_DELAY_S)
        )
    restarts = driver.plugin_restarts()
    try:
        kubectl.run("delete", "pod", "pod", "-n", namespace, "--wait=false")

        def container_stopped() -> bool:
            pod = kubectl.run("get", "pod", "pod", "-n", namespace, "-o", "json", check=False)
            if pod.returncode != 0:
                return True  # gone already
            statuses = yaml.safe_load(pod.stdout).get("status", {}).get("containerStatuses") or []
            return all("terminated" in (c.get("state") or {}) for c in statuses)

        wait_until(container_stopped, timeout_s=60, interval_s=0.3, what="the pod's container stopped")
        time.sleep(5)  # well inside the 30 s teardown step
        driver.sigkill_plugin()
        wait_until(
            lambda: driver.plugin_restarts() > restarts, timeout_s=60, what="the plugin container restarted"
        )
    finally:
        wait_until(
            lambda: _try_clear_faults(driver), timeout_s=timeout_s, what="the simulator's faults cleared"
        )
    driver.wait_plugin_ready()
    wait_until(
        lambda: "MIG device destroyed" in driver.log_tail(200), timeout_s=timeout_s,
        what="the restarted plugin destroying the claim's MIG device (the kill came before the teardown)",
        explain=driver.log_tail,
    )  # fmt: skip
    assert "MIG device already gone" not in driver.log_tail(200), driver.log_tail(200)


def _try_clear_faults(driver: InClusterDriver) -> bool:
    try:
        driver.hardware("fault", "--clear")
    except KubectlError:
        return False  # the restarted container is not up yet
    return True
