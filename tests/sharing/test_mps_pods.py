"""The `pod` launcher: each MPS control daemon in its own pod, pinned to the node, known by its pod UID.

Against a real kube-apiserver. No kubelet runs here, so `KubeletStandIn` does the part of a kubelet these
tests need: it runs a new pod's container command with its env as a local process, and when the pod is
deleted it sends SIGTERM to that process and removes the pod object (what a kubelet does after the grace
period). The chart's end-to-end check with a real kubelet is in e2e/ (see the notes there).
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sim_node import SimNode

from dra_gpu.hardware.types import ComputeMode
from dra_gpu.sharing.mps_pods import PodLauncher, pod_name

pytestmark = pytest.mark.apiserver


class KubeletStandIn:
    def __init__(self, launcher: PodLauncher) -> None:
        self.launcher = launcher
        self.processes: dict[str, subprocess.Popen[bytes]] = {}  # pod uid -> process
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        core = self.launcher._core
        while not self._stop.wait(0.05):
            try:
                self._step(core)
            except Exception as err:  # keep going, as a kubelet would; the test fails on its own timeout
                self.errors.append(repr(err))

    def _step(self, core: Any) -> None:
        for pod in self.launcher.owned_pods():
            uid = pod["metadata"]["uid"]
            if pod["metadata"].get("deletionTimestamp"):
                process = self.processes.pop(uid, None)
                if process is not None:
                    process.send_signal(signal.SIGTERM)
                    process.wait(10)
                core.delete_namespaced_pod(
                    pod["metadata"]["name"],
                    self.launcher.namespace,
                    body={"preconditions": {"uid": uid}, "gracePeriodSeconds": 0},
                )
            elif uid not in self.processes:
                container = pod["spec"]["containers"][0]
                env = {e["name"]: e["value"] for e in container.get("env", [])}
                self.processes[uid] = subprocess.Popen(container["command"], env=env)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for process in self.processes.values():
            process.kill()
            process.wait(10)


@pytest.fixture
def launcher(kube_apiserver: Any, node: SimNode) -> Iterator[PodLauncher]:
    from kubernetes import client

    api_client = kube_apiserver.api_client()
    namespace = f"mps-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api_client).create_namespace({"metadata": {"name": namespace}})
    yield PodLauncher(
        api_client,
        namespace=namespace,
        node_name="gpu-node-1",
        image="dra-gpu:test",
        host_driver_root=str(node.root),
        container_driver_root="/driver-root",
        delete_timeout_s=10,
    )
    client.CoreV1Api(api_client).delete_namespace(namespace)


def record_for(node: SimNode, daemon_id: str) -> dict[str, Any]:
    base = node.plugin_dir / "mps" / daemon_id
    return {
        "id": daemon_id,
        "pipeDir": str(base / "pipe"),
        "logDir": str(base / "log"),
        "shmDir": str(base / "shm"),
        "multiUser": True,
    }


def test_the_daemon_pod_is_pinned_to_the_node_and_not_owned_by_the_plugin(
    launcher: PodLauncher, node: SimNode
) -> None:
    record = record_for(node, "claim-a-12345")
    launcher.launch(record, {"CUDA_VISIBLE_DEVICES": node.uuid(), "SECRET": "not copied"})
    pod = launcher.get(pod_name("claim-a-12345"))
    assert pod is not None and pod["metadata"]["uid"] == record["podUid"]
    assert "ownerReferences" not in pod["metadata"]  # a rolling update of the plugin must not collect it
    spec = pod["spec"]
    assert spec["nodeName"] == "gpu-node-1" and spec["restartPolicy"] == "Always"
    (container,) = spec["containers"]
    assert container["command"] == ["/driver-root/usr/bin/nvidia-cuda-mps-control", "-f", "-M"]
    assert container["env"] == [{"name": "CUDA_VISIBLE_DEVICES", "value": node.uuid()}]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {
        "driver-root": "/driver-root",
        "pipe": record["pipeDir"],
        "log": record["logDir"],
        "shm": "/dev/shm",
    }
    hosts = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    assert hosts["driver-root"] == str(node.root) and hosts["shm"] == record["shmDir"]
    assert launcher.alive(record)

    # The pod is replaced behind our back (same name, new UID): stopping the old identity leaves it alone.
    launcher._core.delete_namespaced_pod(
        pod_name("claim-a-12345"), launcher.namespace, grace_period_seconds=0
    )
    impostor = dict(record, podUid=None)
    launcher.launch(impostor, {})
    assert impostor["podUid"] != record["podUid"]
    assert not launcher.alive(record)
    assert launcher.stop(record) == []
    assert launcher.alive(impostor)
    launcher._core.delete_namespaced_pod(
        pod_name("claim-a-12345"), launcher.namespace, grace_period_seconds=0
    )


def test_a_share_in_pod_mode_prepares_reconciles_and_unprepares(launcher: PodLauncher, node: SimNode) -> None:
    # The stand-in runs the pod's command on this machine: the driver root must be where the pod sees it.
    launcher.container_driver_root = str(node.root)
    kubelet = KubeletStandIn(launcher)
    try:
        manager = node.manager(mps_pods=launcher)
        share = node.alloc(
            "gpu-0-shared", share_id="s1", consumed_capacity={"compute": "30", "memory": "2Gi"}
        )
        result = manager.prepare_group("claim-a", None, [share])
        daemon = result.state["mpsDaemon"]
        assert daemon["launcher"] == "pod" and daemon["pid"] is None and daemon["podUid"]
        record = node.mps_records()[daemon["pipeDir"]]
        assert record["running"] and record["default_active_thread_percentage"] == 30
        assert manager.reconcile_mps([result.state]).restarted == []

        # the pod object is deleted by someone: the reconcile loop creates a new one with the same limits
        launcher._core.delete_namespaced_pod(pod_name(daemon["id"]), launcher.namespace)
        deadline = time.monotonic() + 10
        while launcher.get(pod_name(daemon["id"])) is not None:
            assert time.monotonic() < deadline, kubelet.errors
            time.sleep(0.05)
        report = manager.reconcile_mps([result.state])
        assert report.restarted == [daemon["id"]]
        latest = manager._mps.latest(daemon)
        assert latest["podUid"] != daemon["podUid"]
        assert manager._mps.limits_in_force(latest)["threadPercentage"] == 30

        manager.unprepare_group("claim-a", result.state)
        assert launcher.owned_pods() == []
        assert node.leftovers() == []
        assert node.gpu_state(node.uuid()).compute_mode == int(ComputeMode.DEFAULT)
    finally:
        kubelet.stop()


def test_a_daemon_whose_pod_still_exists_is_left_to_the_kubelet_then_reported(
    launcher: PodLauncher, node: SimNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dra_gpu.sharing.manager as manager_module

    launcher.container_driver_root = str(node.root)
    kubelet = KubeletStandIn(launcher)
    try:
        manager = node.manager(mps_pods=launcher)
        share = node.alloc(
            "gpu-0-shared", share_id="s1", consumed_capacity={"compute": "30", "memory": "2Gi"}
        )
        result = manager.prepare_group("claim-a", None, [share])
        daemon = result.state["mpsDaemon"]
        (process,) = kubelet.processes.values()
        process.kill()  # the container died; the pod object stays (this stand-in does not restart it)
        process.wait(10)
        report = manager.reconcile_mps([result.state])
        assert report.restarted == [] and report.failed == {}  # the kubelet's job first: no second daemon
        assert manager._mps.latest(daemon)["podUid"] == daemon["podUid"]
        monkeypatch.setattr(manager_module, "POD_RESTART_GRACE_S", 0.0)
        report = manager.reconcile_mps([result.state])
        assert list(report.failed) == [daemon["id"]] and report.failed[daemon["id"]][0] == [node.uuid()]
        manager.unprepare_group("claim-a", result.state)
        assert launcher.owned_pods() == [] and node.leftovers() == []
    finally:
        kubelet.stop()
