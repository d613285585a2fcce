"""The `pod` launcher: each MPS control daemon in its own pod, pinned to the node, known by its pod UID.

Against a real kube-apiserver. No kubelet runs here, so `KubeletStandIn` does the part of a kubelet these
tests need: it runs a new pod's container command with its env as a local process, and when the pod is
deleted it sends SIGTERM to that process and removes the pod object (what a kubelet does after the grace
period). The chart's end-to-end check with a real kubelet is in e2e/ (see the notes there).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from sim_node import SimNode

from dra_gpu.hardware.types import ComputeMode
from dra_gpu.sharing.interface import GroupResult
from dra_gpu.sharing.manager import HardwareSharingManager
from dra_gpu.sharing.mps_pods import PodLauncher, pod_name

pytestmark = pytest.mark.apiserver


class KubeletStandIn:
    def __init__(
        self, launcher: PodLauncher, *, restart_in_place: bool = False, restart_without: tuple[str, ...] = ()
    ) -> None:
        """`restart_in_place`: a container that exits is started again in its pod (as the kubelet does with
        `restartPolicy: Always`) and the pod's restartCount goes up; `restart_without`: env variables the
        restarted container does not get (to stand in for a daemon that ignores them)."""
        self.launcher = launcher
        self.restart_in_place = restart_in_place
        self.restart_without = restart_without
        self.processes: dict[str, subprocess.Popen[bytes]] = {}  # pod uid -> process
        self.restarts: dict[str, int] = {}  # pod uid -> restartCount
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        core = client.CoreV1Api(self.launcher.api_client)
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
                self.processes[uid] = subprocess.Popen(container["command"], env=env, start_new_session=True)
            elif self.restart_in_place and self.processes[uid].poll() is not None:
                container = pod["spec"]["containers"][0]
                env = {e["name"]: e["value"] for e in container.get("env", [])}
                env = {k: v for k, v in env.items() if k not in self.restart_without}
                self.processes[uid] = subprocess.Popen(container["command"], env=env, start_new_session=True)
                self.restarts[uid] = self.restarts.get(uid, 0) + 1
                status = {
                    "name": container["name"], "image": container["image"], "imageID": "", "ready": True,
                    "restartCount": self.restarts[uid],
                    "state": {"running": {"startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}},
                }  # fmt: skip
                body = {"status": {"containerStatuses": [status]}}
                core.patch_namespaced_pod_status(pod["metadata"]["name"], self.launcher.namespace, body)

    @staticmethod
    def kill_container(process: subprocess.Popen[bytes]) -> None:
        """SIGKILL every process of the container (the entrypoint and the daemon it started), as the runtime
        does when a container dies."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for process in self.processes.values():
            self.kill_container(process)


@pytest.fixture
def launcher(kube_apiserver: Any, node: SimNode) -> Iterator[PodLauncher]:
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
    assert container["command"][:2] == ["sh", "-c"]  # the entrypoint that sets the limits at every start
    assert container["command"][3:] == ["/driver-root/usr/bin/nvidia-cuda-mps-control", "-M"]
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
    client.CoreV1Api(launcher.api_client).delete_namespaced_pod(
        pod_name("claim-a-12345"), launcher.namespace, grace_period_seconds=0
    )
    impostor = dict(record, podUid=None)
    launcher.launch(impostor, {})
    assert impostor["podUid"] != record["podUid"]
    assert not launcher.alive(record)
    assert launcher.stop(record) == []
    assert launcher.alive(impostor)
    client.CoreV1Api(launcher.api_client).delete_namespaced_pod(
        pod_name("claim-a-12345"), launcher.namespace, grace_period_seconds=0
    )


def _prepare_share(launcher: PodLauncher, node: SimNode) -> tuple[HardwareSharingManager, GroupResult]:
    """A 30 % / 2Gi share of gpu-0 prepared in pod mode (claim-a)."""
    manager = node.manager(mps_pods=launcher)
    share = node.alloc("gpu-0-shared", share_id="s1", consumed_capacity={"compute": "30", "memory": "2Gi"})
    return manager, manager.prepare_group("claim-a", None, [share])


def test_a_share_in_pod_mode_prepares_reconciles_and_unprepares(launcher: PodLauncher, node: SimNode) -> None:
    # The stand-in runs the pod's command on this machine: the driver root must be where the pod sees it.
    launcher.container_driver_root = str(node.root)
    kubelet = KubeletStandIn(launcher)
    try:
        manager, result = _prepare_share(launcher, node)
        daemon = result.state["mpsDaemon"]
        assert daemon["launcher"] == "pod" and daemon["pid"] is None and daemon["podUid"]
        record = node.mps_records()[daemon["pipeDir"]]
        assert record["running"] and record["default_active_thread_percentage"] == 30
        assert manager.reconcile_mps([result.state]).restarted == []

        # the pod object is deleted by someone: the reconcile loop creates a new one with the same limits
        core = client.CoreV1Api(launcher.api_client)
        core.delete_namespaced_pod(pod_name(daemon["id"]), launcher.namespace)
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
        manager, result = _prepare_share(launcher, node)
        daemon = result.state["mpsDaemon"]
        (process,) = kubelet.processes.values()
        kubelet.kill_container(process)  # the container died; the pod stays (this stand-in does not restart)
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


def _client_view(node: SimNode, pipe_dir: str, **env: str) -> dict[str, Any]:
    """What a tenant's CUDA process with `env` gets from the daemon at `pipe_dir` (simulated MPS client)."""
    done = subprocess.run(
        [sys.executable, "-m", "dra_gpu.hardware.sim_tools.mps_client"],
        env={**os.environ, **env, "CUDA_MPS_PIPE_DIRECTORY": pipe_dir, "DRA_GPU_SIM_ROOT": str(node.root)},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _wait_restarted(kubelet: KubeletStandIn, uid: str, count: int) -> None:
    deadline = time.monotonic() + 10
    while kubelet.restarts.get(uid, 0) < count:
        assert time.monotonic() < deadline, kubelet.errors
        time.sleep(0.05)


def test_a_daemon_container_restarted_in_place_serves_with_its_limits_and_they_are_checked(
    launcher: PodLauncher, node: SimNode
) -> None:
    """The kubelet restarts a daemon that exits in its pod (same UID) and tells no one. The pod's entrypoint
    sets the limits at every start, so the restarted daemon's clients get their share before the plugin
    looks; the reconcile pass sees the new restartCount, checks the limits, and sets them again if the daemon
    came back without them."""
    launcher.container_driver_root = str(node.root)
    kubelet = KubeletStandIn(launcher, restart_in_place=True)
    try:
        manager, result = _prepare_share(launcher, node)
        daemon = result.state["mpsDaemon"]
        (container,) = launcher.get(pod_name(daemon["id"]))["spec"]["containers"]  # type: ignore[index]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
        assert env["DRA_GPU_MPS_LIMITS"].splitlines() == [
            "set_default_active_thread_percentage 30",
            f"set_default_device_pinned_mem_limit {node.uuid()} 2048M",
        ]
        assert manager.reconcile_mps([result.state]).limits_restored == []  # first look: limits in force
        share_view = {"activeThreadPercentage": 30, "pinnedDeviceMemoryLimits": {node.uuid(): "2048M"}}

        (process,) = kubelet.processes.values()
        kubelet.kill_container(process)
        _wait_restarted(kubelet, daemon["podUid"], 1)
        # with no reconcile pass: the entrypoint sets the limits as soon as the daemon answers, and a tenant
        # that asks for everything gets its share
        wide = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}
        deadline = time.monotonic() + 10
        while not (manager._mps.answers(daemon) and manager._mps.holds_limits(daemon)):
            assert time.monotonic() < deadline, "the restarted daemon does not hold its limits"
            time.sleep(0.05)
        assert _client_view(node, daemon["pipeDir"], **wide) == share_view
        report = manager.reconcile_mps([result.state])
        assert report.limits_restored == [] and report.restarted == [] and report.failed == {}

        # a daemon that comes back without its limits (one that ignored them in its env) gets them again
        kubelet.restart_without = ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "DRA_GPU_MPS_LIMITS")
        (process,) = kubelet.processes.values()
        kubelet.kill_container(process)
        _wait_restarted(kubelet, daemon["podUid"], 2)
        deadline = time.monotonic() + 10
        while not manager._mps.answers(daemon):
            assert time.monotonic() < deadline, "the restarted daemon does not answer"
            time.sleep(0.05)
        assert _client_view(node, daemon["pipeDir"], **wide)["activeThreadPercentage"] == 100
        report = manager.reconcile_mps([result.state])
        assert report.limits_restored == [daemon["id"]] and report.failed == {}
        assert _client_view(node, daemon["pipeDir"], **wide) == share_view
        assert manager.reconcile_mps([result.state]).limits_restored == []  # nothing new since
        assert manager._mps.latest(daemon)["podUid"] == daemon["podUid"]  # the same pod throughout

        manager.unprepare_group("claim-a", result.state)
        assert launcher.owned_pods() == [] and node.leftovers() == []
    finally:
        kubelet.stop()
