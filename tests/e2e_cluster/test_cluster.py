"""The local single-node cluster runs pods, and a DRA claim's CDI device reaches the container."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e_cluster.cdi_test_driver import CdiTestDriver

pytestmark = pytest.mark.cluster

BUSYBOX = "registry.local/busybox:1"


def _wait_phase(core: Any, ns: str, name: str, phases: set[str], timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        pod = core.read_namespaced_pod(name, ns)
        if pod.status.phase in phases or time.monotonic() > deadline:
            return pod
        time.sleep(0.5)


@pytest.fixture
def namespace(local_cluster: Any) -> Iterator[tuple[Any, str]]:
    from kubernetes import client

    api = local_cluster.api_client()
    core = client.CoreV1Api(api)
    ns = f"e2e-{uuid.uuid4().hex[:8]}"
    ns_body: Any = {"metadata": {"name": ns}}
    core.create_namespace(ns_body)
    # The ServiceAccount admission plugin needs the namespace's default ServiceAccount (made by the
    # controller manager) before it admits pods.
    deadline = time.monotonic() + 60
    while not core.list_namespaced_service_account(ns).items and time.monotonic() < deadline:
        time.sleep(0.25)
    yield api, ns
    core.delete_namespace(ns)


def _busybox_pod(name: str, script: str, **spec: Any) -> Any:
    return {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", script],
                }
            ],
            **spec,
        },
    }


def test_busybox_pod_runs_to_completion(local_cluster: Any, namespace: tuple[Any, str]) -> None:
    from kubernetes import client

    api, ns = namespace
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(
        ns, _busybox_pod("hello", "echo hello from $(hostname); cat /proc/self/cgroup")
    )
    pod = _wait_phase(core, ns, "hello", {"Succeeded", "Failed"})
    logs = core.read_namespaced_pod_log("hello", ns)
    assert pod.status.phase == "Succeeded", logs
    assert "hello from hello" in logs
    assert pod.spec.node_name == local_cluster.node_name
    # Pod cgroups stay inside the cgroup of the process that started the cluster.
    memory_line = next(line for line in logs.splitlines() if ":memory:" in line)
    assert memory_line.split(":", 2)[2].startswith(local_cluster.cgroup_root + "/kubepods"), memory_line


@pytest.fixture
def cdi_spec() -> Iterator[Callable[[str, str], str]]:
    written: list[Path] = []

    def write(kind: str, value: str) -> str:
        path = Path("/var/run/cdi") / f"dra-e2e-{uuid.uuid4().hex[:8]}.json"
        spec = {
            "cdiVersion": "0.6.0",
            "kind": kind,
            "devices": [{"name": "dev0", "containerEdits": {"env": [f"DRA_E2E_CDI={value}"]}}],
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(spec))
        written.append(path)
        return f"{kind}=dev0"

    yield write
    for path in written:
        path.unlink(missing_ok=True)


def test_claim_with_cdi_device_injects_env(
    local_cluster: Any, namespace: tuple[Any, str], cdi_spec: Callable[[str, str], str]
) -> None:
    from kubernetes import client

    api, ns = namespace
    core = client.CoreV1Api(api)
    objects = client.CustomObjectsApi(api)
    suffix = uuid.uuid4().hex[:8]
    driver = f"cdi-{suffix}.e2e.example.com"
    marker = f"injected-{suffix}"
    cdi_id = cdi_spec(f"{driver}/test", marker)
    node = local_cluster.node_name
    plugin = CdiTestDriver(driver, cdi_id).start()
    objects.create_cluster_custom_object(
        "resource.k8s.io",
        "v1",
        "deviceclasses",
        {
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]},
        },
    )
    objects.create_cluster_custom_object(
        "resource.k8s.io",
        "v1",
        "resourceslices",
        {
            "metadata": {"name": f"{node}-{driver}"},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "dev0"}],
            },
        },
    )
    try:
        assert plugin.registered.wait(60), f"kubelet did not register the plugin: {plugin.registration.error}"
        objects.create_namespaced_custom_object(
            "resource.k8s.io",
            "v1",
            ns,
            "resourceclaimtemplates",
            {
                "metadata": {"name": "dev"},
                "spec": {
                    "spec": {
                        "devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": driver}}]}
                    }
                },
            },
        )
        pod = _busybox_pod(
            "cdi",
            "echo CDI=$DRA_E2E_CDI",
            resourceClaims=[{"name": "dev", "resourceClaimTemplateName": "dev"}],
        )
        pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "dev"}]}
        core.create_namespaced_pod(ns, pod)
        done = _wait_phase(core, ns, "cdi", {"Succeeded", "Failed"})
        logs = core.read_namespaced_pod_log("cdi", ns)
        assert done.status.phase == "Succeeded", logs
        assert f"CDI={marker}" in logs
        assert len(plugin.dra.prepared) == 1
        core.delete_namespaced_pod("cdi", ns)
        deadline = time.monotonic() + 60
        while not plugin.dra.unprepared and time.monotonic() < deadline:
            time.sleep(0.25)
        assert plugin.dra.unprepared == plugin.dra.prepared
    finally:
        plugin.stop()
        objects.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", f"{node}-{driver}")
        objects.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", driver)


def test_kubelet_restart_keeps_the_node_usable(local_cluster: Any, namespace: tuple[Any, str]) -> None:
    from kubernetes import client

    api, ns = namespace
    core = client.CoreV1Api(api)
    before = {e["name"]: e["pid"] for e in json.loads(local_cluster.pids_file.read_text())}
    local_cluster.restart_kubelet(wait_ready=True)
    after = {e["name"]: e["pid"] for e in json.loads(local_cluster.pids_file.read_text())}
    assert after["kubelet"] != before["kubelet"]
    assert {k: v for k, v in after.items() if k != "kubelet"} == {
        k: v for k, v in before.items() if k != "kubelet"
    }
    core.create_namespaced_pod(ns, _busybox_pod("after-restart", "echo still-works"))
    pod = _wait_phase(core, ns, "after-restart", {"Succeeded", "Failed"})
    assert pod.status.phase == "Succeeded"
    assert "still-works" in core.read_namespaced_pod_log("after-restart", ns)
