"""An example applied to a cluster without the driver fails with a clear event, not silently (issue 6).

"Without the driver" happens in two ways a user meets:
- the DeviceClass was never installed (the chart is missing, or the class name has a typo): the scheduler
  cannot even start allocating and says which class is missing;
- the classes exist but no node publishes devices (the plugin is not running, its slices are gone): the
  scheduler finds nothing to allocate; once the plugin comes back the same pod starts without being touched.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.lib.claims import is_allocated, pod_claim_names
from e2e.lib.driver import DriverControl, HostDriver, node_slice_selector, node_slices
from e2e.lib.incluster import InClusterDriver
from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import E2ESettings
from e2e.lib.waiting import namespace_report, wait_for_pods, wait_until
from e2e.lib.workloads import claim_template, pod_with_template

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gpu-per-pod" / "gpu-per-pod.yaml"
# A class name nobody installs: what a typo, or a cluster without the chart, leaves the claim pointing at.
MISSING_CLASS = "gpu.nvidia.com.missing"


def _node_slice_names(kubectl: Kubectl, node: str) -> list[str]:
    return [s["metadata"]["name"] for s in node_slices(kubectl, node)]


def _scheduling_failures(kubectl: Kubectl, namespace: str, pod: str) -> list[str] | None:
    events = [e for e in kubectl.events(namespace, pod) if e.get("reason") == "FailedScheduling"]
    return [str(e.get("message", "")) for e in events] or None


def _wait_scheduling_failures(kubectl: Kubectl, driver: DriverControl, namespace: str, pod: str) -> list[str]:
    return wait_until(
        lambda: _scheduling_failures(kubectl, namespace, pod),
        timeout_s=60,
        what=f"a FailedScheduling event for pod {pod}",
        explain=lambda: namespace_report(kubectl, namespace, driver.log_tail),
    )


def _assert_still_pending(kubectl: Kubectl, namespace: str, pod_name: str) -> dict[str, Any]:
    pod = kubectl.get_json("pod", pod_name, namespace)
    assert pod["status"].get("phase") == "Pending", f"{pod_name}: {pod['status']}"
    assert not pod["spec"].get("nodeName"), f"{pod_name} was bound to {pod['spec']['nodeName']}"
    return pod


def _example_in_namespace(namespace: str, device_class: str) -> list[dict[str, Any]]:
    """The gpu-per-pod example moved into the test's namespace, its claims asking for `device_class`."""
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d["kind"] != "Namespace"]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        if doc["kind"] == "ResourceClaimTemplate":
            for request in doc["spec"]["spec"]["devices"]["requests"]:
                request["exactly"]["deviceClassName"] = device_class
    return docs


@pytest.mark.e2e
def test_example_with_missing_device_class_fails_with_event_naming_it(
    kubectl: Kubectl, driver: DriverControl, namespace: str
) -> None:
    docs = _example_in_namespace(namespace, MISSING_CLASS)
    pods = [d["metadata"]["name"] for d in docs if d["kind"] == "Pod"]
    assert pods, f"{EXAMPLE} has no pods"
    kubectl.apply(yaml.safe_dump_all(docs))
    for pod in pods:
        messages = _wait_scheduling_failures(kubectl, driver, namespace, pod)
        # kube-scheduler 1.36 says: "0/1 nodes are available: request gpu: device class <name> does not
        # exist. no new claims to deallocate, preemption: ..." (the request and the class, both named).
        assert any(f"request gpu: device class {MISSING_CLASS} does not exist" in m for m in messages), (
            messages
        )
    time.sleep(3)
    for pod in pods:
        current = _assert_still_pending(kubectl, namespace, pod)
        claim_name = pod_claim_names(current).get("gpu")
        if claim_name:
            claim_obj = kubectl.get_json("resourceclaims.resource.k8s.io", claim_name, namespace)
            assert not is_allocated(claim_obj), f"claim {claim_name} allocated with a missing class"


@pytest.mark.e2e
@pytest.mark.disruptive
def test_no_published_devices_leaves_pod_pending_until_plugin_returns(
    kubectl: Kubectl, driver: DriverControl, settings: E2ESettings, namespace: str
) -> None:
    """The node's plugin stopped (the host process; on kind its DaemonSet pod, the node unlabelled) and its
    slices gone: a GPU pod stays Pending saying it cannot allocate its claims, and runs once the plugin is
    back and has published again."""
    assert isinstance(driver, HostDriver | InClusterDriver), type(driver)
    assert _node_slice_names(kubectl, driver.node_name), "the driver has published no ResourceSlices"
    if isinstance(driver, HostDriver):
        driver.stop_plugin()
    else:
        driver.take_plugin_off_node()
    try:
        # The kubelet wipes a gone plugin's slices after a grace period; do it now rather than wait for it.
        kubectl.run("delete", "resourceslices.resource.k8s.io", node_slice_selector(driver.node_name))
        wait_until(
            lambda: not _node_slice_names(kubectl, driver.node_name),
            timeout_s=60,
            what="the node's ResourceSlices to be gone",
        )
        kubectl.apply(
            yaml.safe_dump_all(
                [
                    claim_template(namespace, "gpu"),
                    pod_with_template(namespace, "pod", "gpu", settings.test_image),
                ]
            )
        )
        messages = _wait_scheduling_failures(kubectl, driver, namespace, "pod")
        # kube-scheduler 1.36: "0/1 nodes are available: 1 cannot allocate all claims. still not
        # schedulable, preemption: ...".
        assert any("cannot allocate all claims" in m for m in messages), messages
        time.sleep(3)
        _assert_still_pending(kubectl, namespace, "pod")
        assert not _node_slice_names(kubectl, driver.node_name), "slices came back with the plugin stopped"
    finally:
        if isinstance(driver, InClusterDriver):
            driver.put_plugin_back_on_node()
        elif not driver.plugin_running():
            driver.start_plugin()
    driver.wait_plugin_ready()
    wait_until(
        lambda: _node_slice_names(kubectl, driver.node_name),
        timeout_s=60,
        what="the restarted plugin to publish its ResourceSlices",
        explain=driver.log_tail,
    )
    wait_for_pods(
        kubectl,
        namespace,
        ["pod"],
        phases=("Running",),
        timeout_s=settings.pod_timeout_s,
        driver_log_tail=driver.log_tail,
    )
