"""The `pod` launcher: each MPS control daemon in its own pod, pinned to the node, known by its pod UID.

Against a real kube-apiserver. No kubelet runs here, so `KubeletStandIn` does the part of a kubelet these
tests need: it runs a new pod's container command with its env as a local process, with the pod's hostPath
volumes bound at their mount paths in a private mount namespace (as a container sees them), and when the pod
is deleted it sends SIGTERM to that process and removes the pod object (what a kubelet does after the grace
period). The chart's end-to-end check with a real kubelet is in e2e/ (see the notes there).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from sim_node import SimNode

from dra_gpu.hardware.types import ComputeMode
from dra_gpu.sharing.interface import CdiEdits, CdiMount, GroupResult, SharingError
from dra_gpu.sharing.manager import HardwareSharingManager
from dra_gpu.sharing.mps_pods import DaemonPodSettings, PodLauncher, pod_name
from tests.support.container_view import container_argv, sim_client

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
                self.processes[uid] = subprocess.Popen(_in_pod(pod), env=env, start_new_session=True)
            elif self.restart_in_place and self.processes[uid].poll() is not None:
                container = pod["spec"]["containers"][0]
                env = {e["name"]: e["value"] for e in container.get("env", [])}
                env = {k: v for k, v in env.items() if k not in self.restart_without}
                self.processes[uid] = subprocess.Popen(_in_pod(pod), env=env, start_new_session=True)
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
        settings=DaemonPodSettings(image="dra-gpu:test", driver_root_read_only=False),
        host_driver_root=str(node.root),
        container_driver_root="/driver-root",
        delete_timeout_s=10,
    )
    client.CoreV1Api(api_client).delete_namespace(namespace)


def _in_pod(pod: dict[str, Any]) -> list[str]:
    """The pod's container command where its hostPath volumes are at their mount paths (those that differ)."""
    container = pod["spec"]["containers"][0]
    hosts = {v["name"]: v["hostPath"]["path"] for v in pod["spec"]["volumes"]}
    mounts = tuple(
        CdiMount(hosts[m["name"]], m["mountPath"])
        for m in container["volumeMounts"]
        if hosts[m["name"]] != m["mountPath"]
    )
    return container_argv(CdiEdits(mounts=mounts), container["command"])


def record_for(node: SimNode, daemon_id: str) -> dict[str, Any]:
    base = node.plugin_dir / "mps" / daemon_id
    return {
        "id": daemon_id,
        "layout": 2,
        "clientsDir": str(base / "clients"),
        "pipeDir": str(base / "clients" / "pipe"),
        "stageDir": str(base / "stage"),
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
    assert "ownerReferences" not in pod["metadata"]  # no plugin pod named: no DaemonSet to own it
    spec = pod["spec"]
    assert spec["nodeName"] == "gpu-node-1" and spec["restartPolicy"] == "Always"
    (container,) = spec["containers"]
    assert container["command"][:2] == ["sh", "-c"]  # the entrypoint that sets the limits at every start
    assert container["command"][3:] == ["/driver-root/usr/bin/nvidia-cuda-mps-control", "-M"]
    assert container["env"] == [{"name": "CUDA_VISIBLE_DEVICES", "value": node.uuid()}]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {  # short paths: the real tool refuses a pipe directory of 88 characters or more
        "driver-root": "/driver-root",
        "pipe": "/tmp/nvidia-mps",
        "log": "/var/log/nvidia-mps",
        "shm": "/dev/shm",
    }
    hosts = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    assert hosts["driver-root"] == str(node.root) and hosts["shm"] == record["shmDir"]
    assert hosts["pipe"] == record["stageDir"]  # where no container looks, until the plugin places it
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


def test_the_daemon_pod_is_hardened_and_owned_by_the_plugins_daemonset(
    launcher: PodLauncher, node: SimNode
) -> None:
    """No token, its own account, requests and node-critical priority, the pull settings, the driver root
    read-only, only the tolerations given; its owner is the DaemonSet of the plugin's pod (not that pod, which
    a rolling update replaces), as a plain owner reference."""
    core: Any = client.CoreV1Api(launcher.api_client)
    apps: Any = client.AppsV1Api(launcher.api_client)
    labels = {"app": "plugin"}
    daemonset = apps.create_namespaced_daemon_set(
        launcher.namespace,
        {
            "metadata": {"name": "dra-gpu-kubelet-plugin"},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "plugin", "image": "dra-gpu:test"}]},
                },
            },
        },
    )
    owner = {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "dra-gpu-kubelet-plugin",
        "uid": daemonset.metadata.uid, "controller": True, "blockOwnerDeletion": True,
    }  # fmt: skip
    core.create_namespaced_pod(
        launcher.namespace,
        {
            "metadata": {"name": "plugin-abcde", "labels": labels, "ownerReferences": [owner]},
            "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "plugin", "image": "dra-gpu:test"}]},
        },
    )
    gpu_taint = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}
    hardened = PodLauncher(
        launcher.api_client,
        namespace=launcher.namespace,
        node_name="gpu-node-1",
        settings=DaemonPodSettings(
            image="registry.example.com/dra-gpu:1.2.3",
            image_pull_policy="Always",
            image_pull_secrets=("regcred",),
            service_account="dra-gpu-mps-daemon",
            tolerations=(*DaemonPodSettings(image="x").tolerations, gpu_taint),
            resources={"requests": {"cpu": "20m", "memory": "100Mi"}},
        ),
        host_driver_root=str(node.root),
        container_driver_root="/driver-root",
        plugin_pod="plugin-abcde",
        delete_timeout_s=10,
    )
    core.create_namespaced_service_account(launcher.namespace, {"metadata": {"name": "dra-gpu-mps-daemon"}})
    record = record_for(node, "claim-h-12345")
    hardened.launch(record, {})
    pod = hardened.get(pod_name("claim-h-12345"))
    assert pod is not None
    assert pod["metadata"]["ownerReferences"] == [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "dra-gpu-kubelet-plugin",
         "uid": daemonset.metadata.uid},
    ]  # fmt: skip
    spec = pod["spec"]
    assert (
        spec["serviceAccountName"] == "dra-gpu-mps-daemon" and spec["automountServiceAccountToken"] is False
    )
    assert [v["name"] for v in spec["volumes"]] == ["driver-root", "pipe", "log", "shm"]  # no token volume
    assert spec["priorityClassName"] == "system-node-critical" and spec["priority"] == 2000001000
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert {t["key"] for t in spec["tolerations"]} == {
        "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable", "nvidia.com/gpu",
    }  # fmt: skip
    assert all(t.get("tolerationSeconds") is None for t in spec["tolerations"])
    (container,) = spec["containers"]
    assert container["image"] == "registry.example.com/dra-gpu:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"] == {"requests": {"cpu": "20m", "memory": "100Mi"}}
    assert pod["status"]["qosClass"] == "Burstable"  # not BestEffort: evicted after those under pressure
    read_only = {m["name"] for m in container["volumeMounts"] if m.get("readOnly")}
    assert read_only == {"driver-root"}
    core.delete_namespaced_pod(pod_name("claim-h-12345"), launcher.namespace, grace_period_seconds=0)


def test_a_plugin_pod_that_is_gone_is_reported_not_guessed(launcher: PodLauncher, node: SimNode) -> None:
    """Without the real DaemonSet UID the garbage collector would delete the daemon: never make one up."""
    missing = PodLauncher(
        launcher.api_client,
        namespace=launcher.namespace,
        node_name="gpu-node-1",
        settings=DaemonPodSettings(image="dra-gpu:test"),
        host_driver_root=str(node.root),
        container_driver_root="/driver-root",
        plugin_pod="no-such-plugin-pod",
    )
    with pytest.raises(SharingError, match=r"no-such-plugin-pod .*does not exist"):
        missing.launch(record_for(node, "claim-m-12345"), {})
    assert missing.get(pod_name("claim-m-12345")) is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"image": ""}, "--mps-daemon-image: an image is required"),
        ({"image": "x", "image_pull_policy": "Sometimes"}, "--mps-daemon-image-pull-policy: 'Sometimes'"),
        (
            {"image": "x", "tolerations": ({"key": "a", "operatr": "Exists"},)},
            r"--mps-daemon-tolerations\[0\]",
        ),
        ({"image": "x", "resources": {"request": {}}}, "--mps-daemon-resources"),
    ],
)
def test_bad_daemon_pod_settings_name_the_flag(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DaemonPodSettings(**settings)


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
        daemon = manager.describe()["sharedMps"][node.uuid()]["daemon"]
        assert daemon["launcher"] == "pod" and daemon["pid"] is None and daemon["podUid"]
        record = node.mps_records()[daemon["pipeDir"]]
        assert record["running"] and record["default_active_thread_percentage"] == 30
        assert sim_client(result.edits, node.root)["activeThreadPercentage"] == 30
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
        assert sim_client(result.edits, node.root)["activeThreadPercentage"] == 30

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
        daemon = manager.describe()["sharedMps"][node.uuid()]["daemon"]
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


def _answers_in_stage(manager: HardwareSharingManager, daemon: dict[str, Any]) -> bool:
    try:
        manager._mps.command(daemon, "get_server_list", timeout_s=1, at=daemon["stageDir"])
    except SharingError:
        return False
    return True


def _wait_restarted(kubelet: KubeletStandIn, uid: str, count: int) -> None:
    deadline = time.monotonic() + 10
    while kubelet.restarts.get(uid, 0) < count:
        assert time.monotonic() < deadline, kubelet.errors
        time.sleep(0.05)


def test_a_daemon_container_restarted_in_place_is_reached_only_once_placed_with_its_limits(
    launcher: PodLauncher, node: SimNode
) -> None:
    """The kubelet restarts a daemon that exits in its pod (same UID) and tells no one. The restarted daemon
    starts in stage/ (the pod's hostPath), where no container looks: a tenant's CUDA process finds no daemon
    until the reconcile pass has given it its limits and put it where the clients look, so no MPS server is
    ever spawned without them (on a real H200 one spawned before its limits kept 132 SMs for good)."""
    launcher.container_driver_root = str(node.root)
    kubelet = KubeletStandIn(launcher, restart_in_place=True)
    try:
        manager, result = _prepare_share(launcher, node)
        daemon = manager.describe()["sharedMps"][node.uuid()]["daemon"]
        (container,) = launcher.get(pod_name(daemon["id"]))["spec"]["containers"]  # type: ignore[index]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
        assert env["DRA_GPU_MPS_LIMITS"].splitlines() == [
            "set_default_active_thread_percentage 30",
            f"set_default_device_pinned_mem_limit {node.uuid()} 2048M",
        ]
        assert manager.reconcile_mps([result.state]).limits_restored == []  # first look: limits in force
        wide = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}
        share_view = (30, {node.uuid(): "2048M"})

        def view() -> tuple[object, object] | None:
            seen = sim_client(result.edits, node.root, "--gpu", node.uuid(), env=wide)
            if not seen.get("mps"):
                return None
            return seen["activeThreadPercentage"], seen["pinnedDeviceMemoryLimits"]

        for round_, without in enumerate(
            ((), ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "DRA_GPU_MPS_LIMITS")), 1
        ):
            kubelet.restart_without = without  # the second time: a daemon that comes back without limits
            (process,) = kubelet.processes.values()
            kubelet.kill_container(process)
            _wait_restarted(kubelet, daemon["podUid"], round_)
            deadline = time.monotonic() + 10
            while not _answers_in_stage(manager, daemon):
                assert time.monotonic() < deadline, "the restarted daemon does not answer in stage/"
                time.sleep(0.05)
            assert view() is None  # the new daemon is out of the tenants' reach
            report = manager.reconcile_mps([result.state])
            assert report.limits_restored == [daemon["id"]] and report.failed == {}
            assert view() == share_view
            assert manager.reconcile_mps([result.state]).limits_restored == []  # nothing new since
        assert manager._mps.latest(daemon)["podUid"] == daemon["podUid"]  # the same pod throughout

        manager.unprepare_group("claim-a", result.state)
        assert launcher.owned_pods() == [] and node.leftovers() == []
    finally:
        kubelet.stop()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"mps_daemon_tolerations": "[{"}, "--mps-daemon-tolerations: not JSON"),
        ({"mps_daemon_tolerations": '{"key": "a"}'}, "--mps-daemon-tolerations: expected a JSON list"),
        ({"mps_daemon_resources": "[]"}, "--mps-daemon-resources: expected a JSON dict"),
        ({"mps_daemon_image_pull_policy": "always"}, "--mps-daemon-image-pull-policy: 'always'"),
    ],
)
def test_bad_daemon_pod_flags_are_named(flags: dict[str, str], message: str) -> None:
    import argparse

    from dra_gpu.cli.kubelet_plugin import daemon_pod_settings

    args = argparse.Namespace(
        mps_daemon_image="dra-gpu:test", mps_daemon_image_pull_policy="",
        mps_daemon_image_pull_secrets="a, b", mps_daemon_service_account="",
        mps_daemon_priority_class="system-node-critical", mps_daemon_tolerations="[]",
        mps_daemon_resources="", hardware="real",
    )  # fmt: skip
    assert daemon_pod_settings(args).image_pull_secrets == ("a", "b")
    for name, value in flags.items():
        setattr(args, name, value)
    with pytest.raises(ValueError, match=message):
        daemon_pod_settings(args)


@pytest.mark.parametrize(("layout", "tools"), [("standard", "usr/bin"), ("gke", "bin")])
def test_the_daemon_pod_runs_the_control_binary_where_the_driver_root_keeps_it(
    tmp_path: Any, layout: str, tools: str
) -> None:
    # GKE/COS keep the tools in bin/: a pod that ran usr/bin/nvidia-cuda-mps-control there would crash-loop.
    root = tmp_path / "driver-root"
    subprocess.run(
        [".venv/bin/dra-gpu", "hardware", "init-sim", "--hardware", "dgx-h100", "--driver-root", str(root),
         "--driver-layout", layout],
        check=True, capture_output=True,
    )  # fmt: skip
    pods = PodLauncher(
        None,
        namespace="dra-gpu",
        node_name="gpu-node-1",
        settings=DaemonPodSettings(image="dra-gpu:test", driver_root_read_only=True),
        host_driver_root="/home/kubernetes/bin/nvidia",
        container_driver_root=str(root),
    )
    pod = pods.manifest(record_for_root(tmp_path, "claim-a-12345"), {})
    binary = pod["spec"]["containers"][0]["command"][3]
    assert binary == f"{root}/{tools}/nvidia-cuda-mps-control" and os.access(binary, os.X_OK)


def record_for_root(base: Any, daemon_id: str) -> dict[str, Any]:
    mps = base / "plugins" / "mps" / daemon_id
    return {
        "id": daemon_id,
        "layout": 2,
        "clientsDir": str(mps / "clients"),
        "pipeDir": str(mps / "clients" / "pipe"),
        "stageDir": str(mps / "stage"),
        "logDir": str(mps / "log"),
        "shmDir": str(mps / "shm"),
        "multiUser": True,
    }
