"""The driver as the Helm chart deploys it (kind): the same `DriverControl` seen through kubectl."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import yaml

from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import E2ESettings
from e2e.lib.waiting import wait_until

PLUGIN_SELECTOR = "app.kubernetes.io/component=kubelet-plugin"


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

    def restart_kubelet(self) -> None:
        """kind nodes are containers running systemd: restart the kubelet unit in the node container."""
        subprocess.run(["docker", "exec", self.node_name, "systemctl", "restart", "kubelet"], check=True)
