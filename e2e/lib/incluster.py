"""The driver as the Helm chart deploys it (kind): the same `DriverControl` seen through kubectl."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Mapping
from typing import Any

import yaml

from e2e.lib.chart import CHART_DIR, find_helm
from e2e.lib.container_client import container_ids, host_pid_of_container
from e2e.lib.driver import node_slices, wait_complete_pool
from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import E2ESettings
from e2e.lib.waiting import wait_until

PLUGIN_SELECTOR = "app.kubernetes.io/component=kubelet-plugin"
GPU_NODE_LABEL = (
    "nvidia.com/gpu.present"  # the chart's kubeletPlugin.gpuNodeLabel; kind's GPU workers have it
)


class InClusterDriver:
    def __init__(self, settings: E2ESettings, kubectl: Kubectl, node_name: str | None = None) -> None:
        self.settings = settings
        self.kubectl = kubectl
        self.namespace = settings.chart_namespace
        self.node_name: str = (
            node_name or settings.node_name or self._live_plugin_pods(None)[0]["spec"]["nodeName"]
        )

    def _live_plugin_pods(self, node: str | None) -> list[dict[str, Any]]:
        """The plugin pods not being deleted, on `node` (None: on any node); at least one."""
        pods = [
            p
            for p in self.kubectl.items("pods", self.namespace, PLUGIN_SELECTOR)
            if p["metadata"].get("deletionTimestamp") is None and node in (None, p["spec"].get("nodeName"))
        ]
        if not pods:
            where = f" on node {node}" if node else ""
            raise RuntimeError(
                f"no kubelet-plugin pod ({PLUGIN_SELECTOR}) in namespace {self.namespace}{where}"
            )
        return pods

    def _plugin_pod(self) -> dict[str, Any]:
        """The live plugin pod on this driver's node."""
        return self._live_plugin_pods(self.node_name)[0]

    def _exec(self, *command: str) -> str:
        pod = self._plugin_pod()["metadata"]["name"]
        return self.kubectl.exec(self.namespace, pod, command)

    def log_tail(self, lines: int = 60) -> str:
        try:
            pod = self._plugin_pod()["metadata"]["name"]
        except RuntimeError as exc:
            return str(exc)
        return self.kubectl.logs(self.namespace, pod, tail=lines)

    def sim_state(self) -> dict[str, Any]:
        # The chart mounts a simulated driver root at its host path (only a real "/" moves to /driver-root).
        root = str(self.settings.driver_root)
        out = self._exec("dra-gpu", "hardware", "state", "--driver-root", root, "-o", "json")
        state: dict[str, Any] = json.loads(out)
        return state

    def cdi_spec_names(self) -> list[str]:
        out = self._exec("ls", "-1", str(self.settings.cdi_root))
        return sorted(line for line in out.splitlines() if line.strip())

    def cdi_spec(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = yaml.safe_load(self._exec("cat", f"{self.settings.cdi_root}/{name}"))
        return data

    def metrics_text(self) -> str:
        pod = self._plugin_pod()["metadata"]["name"]
        port = self.settings.plugin_port
        return self.kubectl.run(
            "get", "--raw", f"/api/v1/namespaces/{self.namespace}/pods/{pod}:{port}/proxy/metrics"
        ).stdout

    def kill_plugin(self) -> None:
        pod = self._plugin_pod()["metadata"]["name"]
        # PID 1 of a container ignores SIGKILL sent from inside; a forced delete is the nearest thing.
        self.kubectl.run(
            "delete", "pod", "-n", self.namespace, pod, "--grace-period=0", "--force", "--wait=false"
        )

    def start_plugin(self) -> None:
        """The DaemonSet starts a new pod by itself; nothing to do but wait."""

    def wait_plugin_ready(self, timeout_s: float = 120) -> None:
        def ready() -> bool:
            try:
                pod = self._plugin_pod()
            except RuntimeError:
                return False
            return any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in pod.get("status", {}).get("conditions", [])
            )

        wait_until(
            ready, timeout_s=timeout_s, what="the kubelet-plugin pod to be Ready", explain=self.log_tail
        )

    def sigkill_plugin(self) -> None:
        """SIGKILL the plugin process itself, as the node's root would (the kubelet restarts the container in
        place; a forced pod delete would replace the pod instead). kind nodes' processes are this host's."""
        pod = self._plugin_pod()
        cid = container_ids(pod).get("plugin")
        pid = host_pid_of_container(cid or "")
        if pid is None:
            raise RuntimeError(
                f"no host process of the plugin container of {pod['metadata']['name']} ({cid})"
            )
        os.kill(pid, signal.SIGKILL)

    def take_plugin_off_node(self, timeout_s: float = 120) -> None:
        """The node's plugin stopped the way an admin does it with a DaemonSet: the node loses the GPU label
        the chart's DaemonSet selects on, and its pod is deleted. `put_plugin_back_on_node` undoes it."""
        self.kubectl.run("label", "node", self.node_name, f"{GPU_NODE_LABEL}-")
        wait_until(
            lambda: not self.plugin_on_node(), timeout_s=timeout_s,
            what=f"the plugin pod on {self.node_name} gone",
        )  # fmt: skip

    def put_plugin_back_on_node(self) -> None:
        self.kubectl.run("label", "node", self.node_name, f"{GPU_NODE_LABEL}=true", "--overwrite")

    def plugin_on_node(self) -> bool:
        return any(
            p["spec"].get("nodeName") == self.node_name
            for p in self.kubectl.items("pods", self.namespace, PLUGIN_SELECTOR)
        )

    def plugin_restarts(self) -> int:
        statuses = self._plugin_pod().get("status", {}).get("containerStatuses") or []
        return sum(int(c.get("restartCount", 0)) for c in statuses)

    def hardware(self, *args: str) -> str:
        """`dra-gpu hardware <args>` on this node's simulated driver root, run in its plugin pod (the root is
        mounted there read-write, as on the node): the simulator's control tools, reached through kubectl."""
        return self._exec("dra-gpu", "hardware", *args, "--driver-root", str(self.settings.driver_root))

    def slices(self) -> list[dict[str, Any]]:
        return node_slices(self.kubectl, self.node_name)

    def wait_slices(self, timeout_s: float = 90) -> list[dict[str, Any]]:
        return wait_complete_pool(self.kubectl, self.node_name, timeout_s, self.log_tail)

    def upgrade_chart(self, values: Mapping[str, str | None], timeout_s: int = 300) -> None:
        """`helm upgrade --reuse-values --set-string k=v ...` of the release the suite runs against,
        waiting for the plugin DaemonSet's rollout (every node's plugin restarted with the new values)."""
        helm = find_helm()
        if helm is None:
            raise RuntimeError("no helm: build it with `e2e/cluster/build.sh helm`")
        argv = [
            helm, f"--kubeconfig={self.settings.kubeconfig}", "upgrade", self.settings.chart_release,
            str(CHART_DIR), "-n", self.namespace, "--reuse-values", "--wait", f"--timeout={timeout_s}s",
        ]  # fmt: skip
        for key, value in values.items():
            # strings stay strings (an env value "2" is not the number 2); None puts the chart default back
            argv += ["--set", f"{key}=null"] if value is None else ["--set-string", f"{key}={value}"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s + 60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()}")
        self.kubectl.run(
            "rollout", "status", "daemonset", "-n", self.namespace, "-l", PLUGIN_SELECTOR,
            f"--timeout={timeout_s}s", timeout=timeout_s + 30,
        )  # fmt: skip
        self.wait_plugin_ready()

    def restart_kubelet(self) -> None:
        """kind nodes are containers running systemd: restart the kubelet unit in the node container."""
        subprocess.run(["docker", "exec", self.node_name, "systemctl", "restart", "kubelet"], check=True)
