"""The driver under test, behind one small interface so that every test runs on both paths:

- `HostDriver`: the local cluster. The kubelet plugin and the webhook are host processes (no container runtime
  for images here), started with the chart's flags; logs in `e2e/_artifacts/`.
- `InClusterDriver` (`e2e/lib/incluster.py`): kind, where the chart's DaemonSet runs the plugin.
"""

from __future__ import annotations

import json
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import yaml

from e2e.lib import chart
from e2e.lib.kubectl import Kubectl
from e2e.lib.processes import ProcessTable, is_running
from e2e.lib.settings import DRIVER_NAME, E2ESettings
from e2e.lib.tls import make_serving_cert
from e2e.lib.waiting import wait_until
from e2e.lib.webhook_config import WEBHOOK_CONFIG_NAME, WEBHOOK_PATH, host_webhook_configuration

PLUGIN = "kubelet-plugin"
WEBHOOK = "webhook"
HOST_PLUGIN_UID = "00000000-0000-4000-8000-0000000e2e00"
FAULT_ENV = ("DRA_GPU_FAULT_KILL_AT",)


class DriverControl(Protocol):
    """What the tests need from the driver, whichever way it runs."""

    node_name: str

    def log_tail(self, lines: int = 60) -> str: ...
    def sim_state(self) -> dict[str, Any]: ...
    def cdi_spec_names(self) -> list[str]: ...
    def cdi_spec(self, name: str) -> dict[str, Any]: ...
    def metrics_text(self) -> str: ...
    def kill_plugin(self) -> None: ...
    def start_plugin(self) -> None: ...
    def wait_plugin_ready(self, timeout_s: float = 120) -> None: ...


def node_slice_selector(node: str) -> str:
    """kubectl field selector for our driver's ResourceSlices on one node."""
    return f"--field-selector=spec.nodeName={node},spec.driver={DRIVER_NAME}"


def node_slices(kubectl: Kubectl, node: str) -> list[dict[str, Any]]:
    """Our driver's ResourceSlices on one node, as the API server has them now."""
    out = kubectl.run("get", "resourceslices.resource.k8s.io", "-o", "json", node_slice_selector(node)).stdout
    items: list[dict[str, Any]] = json.loads(out).get("items", [])
    return items


def wait_complete_pool(
    kubectl: Kubectl, node: str, timeout_s: float = 90, explain: Callable[[], str] | None = None
) -> list[dict[str, Any]]:
    """The node's pool once complete: every slice of its newest generation is there, with devices."""

    def complete() -> list[dict[str, Any]] | None:
        slices = node_slices(kubectl, node)
        if not slices:
            return None
        newest = max(int(s["spec"]["pool"]["generation"]) for s in slices)
        current = [s for s in slices if int(s["spec"]["pool"]["generation"]) == newest]
        want = int(current[0]["spec"]["pool"]["resourceSliceCount"])
        if len(current) != want or not any(s["spec"].get("devices") for s in current):
            return None
        return current

    return wait_until(
        complete,
        timeout_s=timeout_s,
        what=f"the complete ResourceSlice pool of {DRIVER_NAME} on {node}",
        explain=explain,
    )


def python_cli() -> list[str]:
    """`dra-gpu` run by this interpreter (the venv's), so the recorded argv matches /proc/<pid>/cmdline."""
    return [sys.executable, "-m", "dra_gpu.cli.main"]


def read_sim_state(driver_root: Path) -> dict[str, Any]:
    """The simulated hardware as the plugin left it: the state `dra-gpu hardware state -o json` prints.

    Read in-process through the simulator's own locked store (what the CLI does), because the suite polls it
    every second and a Python start-up per poll would cost a core on this machine.
    """
    from dra_gpu.hardware.sim_driver_root import state_report

    return state_report(driver_root)


def read_sim_state_cli(driver_root: Path) -> dict[str, Any]:
    """The same through the CLI (the contract other tools use); tests check the two agree."""
    argv = [*python_cli(), "hardware", "state", "--driver-root", str(driver_root), "-o", "json"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed: {proc.stderr.strip()}")
    state: dict[str, Any] = json.loads(proc.stdout)
    return state


def single_node_name(kubectl: Kubectl) -> str:
    nodes = kubectl.items("nodes")
    if len(nodes) != 1:
        names = [n["metadata"]["name"] for n in nodes]
        raise RuntimeError(f"expected one node, found {names}; set DRA_GPU_E2E_NODE to choose")
    name: str = nodes[0]["metadata"]["name"]
    return name


class HostDriver:
    def __init__(self, settings: E2ESettings, kubectl: Kubectl, node_name: str | None = None) -> None:
        self.settings = settings
        self.kubectl = kubectl
        self.node_name = node_name or settings.node_name or single_node_name(kubectl)
        self.processes = ProcessTable(settings.artifacts / "driver" / "processes.json")
        self.tls_dir = settings.artifacts / "driver" / "tls"

    # ------------------------------------------------------------------------------------------ plugin
    def plugin_command(self) -> tuple[list[str], dict[str, str]]:
        """argv and environment of the plugin: the chart's container, with host paths for pod paths.

        The chart configures the plugin through its environment (and any args after `kubelet-plugin`); the
        flags from the task's contract are passed too, so the process is fully described by its command line.
        """
        s = self.settings
        flags = {
            "--node-name": self.node_name,
            "--hardware": s.hardware,
            "--nvidia-driver-root": str(s.driver_root),
            "--cdi-root": str(s.cdi_root),
            "--kubelet-registrar-directory-path": str(s.kubelet_dir / "plugins_registry"),
            "--kubelet-plugins-directory-path": str(s.kubelet_dir / "plugins"),
            "--kubeconfig": str(s.kubeconfig),
            "--http-endpoint": s.plugin_endpoint,
        }
        env_overrides: dict[str, str | None] = {
            "NODE_NAME": self.node_name,
            "NAMESPACE": s.chart_namespace,
            # Socket names carry the pod UID in the chart (rolling-update sockets); a host process has one
            # fixed identity, so restarts re-register the same sockets.
            "POD_UID": HOST_PLUGIN_UID,
            "HARDWARE": s.hardware,
            "NVIDIA_DRIVER_ROOT": str(s.driver_root),
            "CONTAINER_DRIVER_ROOT": str(s.driver_root),  # no container: the host path is the same path
            "CDI_ROOT": str(s.cdi_root),
            "KUBELET_REGISTRAR_DIRECTORY_PATH": str(s.kubelet_dir / "plugins_registry"),
            "KUBELET_PLUGINS_DIRECTORY_PATH": str(s.kubelet_dir / "plugins"),
            "HTTP_ENDPOINT": s.plugin_endpoint,
            # The chart runs MPS daemons as pods of the plugin's image; a host process has no image to give
            # them and starts them as detached processes instead (docs/ARCHITECTURE.md "MPS daemons").
            "MPS_DAEMON_MODE": "process",
            "MPS_DAEMON_IMAGE": None,
            # the daemon pods' owner (the chart's DaemonSet, found from the plugin's pod): no pods here
            "POD_NAME": None,
        }
        try:
            docs, _ = chart.render_chart({"hardware": s.hardware})
            container = chart.plugin_container(docs)
            words = chart.container_flags(container)
            env = chart.host_plugin_env(container, env_overrides)
        except chart.ChartUnavailableError:
            words, env = [], {}  # no chart yet: the flags are the whole contract
        return [*python_cli(), "kubelet-plugin", *chart.host_plugin_flags(words, flags)], env

    def init_sim(self) -> None:
        if (self.settings.driver_root / "var" / "lib" / "nvml-sim" / "state.json").exists():
            return
        argv = [
            *python_cli(),
            "hardware",
            "init-sim",
            "--hardware",
            self.settings.hardware,
            "--driver-root",
            str(self.settings.driver_root),
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(argv)}` failed: {proc.stderr.strip()}")

    def start_plugin(self, env: Mapping[str, str] | None = None) -> None:
        """Start the plugin (the recorded argv when there is one), with `env` added (fault injection)."""
        entry = self.processes.get(PLUGIN)
        if entry is not None:
            argv, base_env = entry.argv, {k: v for k, v in entry.env.items() if k not in FAULT_ENV}
        else:
            argv, base_env = self.plugin_command()
        self.processes.start(
            PLUGIN, argv, self.settings.artifacts / "plugin.log", env={**base_env, **(env or {})}
        )

    def wait_plugin_exit(self, timeout_s: float = 60) -> None:
        wait_until(
            lambda: not self.plugin_running(),
            timeout_s=timeout_s,
            what="the kubelet plugin to exit",
            explain=self.log_tail,
        )

    def kill_plugin(self) -> None:
        self.processes.stop(PLUGIN, sig=signal.SIGKILL)

    def stop_plugin(self) -> None:
        self.processes.stop(PLUGIN)

    def plugin_running(self) -> bool:
        entry = self.processes.get(PLUGIN)
        return entry is not None and is_running(entry)

    def _http(self, path: str, timeout: float = 5) -> tuple[int, str]:
        url = f"http://{self.settings.plugin_endpoint}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0, ""

    def wait_plugin_ready(self, timeout_s: float = 120) -> None:
        def ready() -> bool:
            if not self.plugin_running():
                raise RuntimeError("the kubelet plugin exited:\n" + self.log_tail())
            return self._http("/readyz")[0] == 200

        wait_until(ready, timeout_s=timeout_s, what="the kubelet plugin's /readyz", explain=self.log_tail)

    def metrics_text(self) -> str:
        code, body = self._http("/metrics")
        if code != 200:
            raise RuntimeError(f"GET /metrics on {self.settings.plugin_endpoint} answered {code}")
        return body

    def log_tail(self, lines: int = 60) -> str:
        return self.processes.log_tail(PLUGIN, lines)

    # -------------------------------------------------------------------------------------- simulator, CDI
    def sim_state(self) -> dict[str, Any]:
        return read_sim_state(self.settings.driver_root)

    def cdi_spec_names(self) -> list[str]:
        root = self.settings.cdi_root
        return sorted(p.name for p in root.iterdir() if p.is_file()) if root.is_dir() else []

    def cdi_spec(self, name: str) -> dict[str, Any]:
        text = (self.settings.cdi_root / name).read_text()
        data: dict[str, Any] = yaml.safe_load(text)  # JSON is YAML
        return data

    # ------------------------------------------------------------------------------------------ webhook
    def start_webhook(self) -> None:
        cert = make_serving_cert(self.tls_dir)
        argv = [
            *python_cli(),
            "webhook",
            "--tls-cert-file",
            str(cert.cert),
            "--tls-private-key-file",
            str(cert.key),
            "--port",
            str(self.settings.webhook_port),
            "--bind-address",
            "127.0.0.1",  # only the API server on this host calls it
        ]
        self.processes.start(WEBHOOK, argv, self.settings.artifacts / "webhook.log")
        ctx = ssl.create_default_context(cafile=str(cert.ca_cert))

        def serving() -> bool:
            entry = self.processes.get(WEBHOOK)
            if entry is None or not is_running(entry):
                raise RuntimeError("the webhook exited:\n" + self.processes.log_tail(WEBHOOK))
            try:
                urllib.request.urlopen(
                    f"https://127.0.0.1:{self.settings.webhook_port}/healthz", timeout=2, context=ctx
                )
                return True
            except urllib.error.HTTPError:
                return True  # TLS works and something answers; the path may not exist
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False

        wait_until(
            serving,
            timeout_s=60,
            what="the webhook to serve TLS",
            explain=lambda: self.processes.log_tail(WEBHOOK),
        )
        url = f"https://127.0.0.1:{self.settings.webhook_port}{WEBHOOK_PATH}"
        try:
            docs, _ = chart.render_chart({"hardware": self.settings.hardware})
            from_chart = chart.of_kind(docs, "ValidatingWebhookConfiguration")
        except chart.ChartUnavailableError:
            from_chart = []
        config = host_webhook_configuration(from_chart[0] if from_chart else None, url, cert.ca_bundle_b64())
        self.kubectl.apply(yaml.safe_dump(config))

    def stop_webhook(self) -> None:
        self.kubectl.run(
            "delete", "validatingwebhookconfiguration", WEBHOOK_CONFIG_NAME, "--ignore-not-found", check=False
        )
        self.processes.stop(WEBHOOK)

    # ------------------------------------------------------------------------------------- whole driver
    def device_class_docs(self) -> tuple[list[dict[str, Any]], str]:
        docs, source = chart.render_chart({"hardware": self.settings.hardware})
        classes = chart.of_kind(docs, "DeviceClass")
        if not classes:
            raise chart.ChartUnavailableError(f"{source} has no DeviceClass")
        return classes, source

    def install(self, log: Any = print) -> dict[str, float]:
        """DeviceClasses, webhook, plugin; returns how long each step took. Idempotent."""
        times: dict[str, float] = {}
        t0 = time.monotonic()
        classes, source = self.device_class_docs()
        self.kubectl.apply(yaml.safe_dump_all(classes))
        log(f"DeviceClasses {[c['metadata']['name'] for c in classes]} from {source}")
        times["deviceclasses_s"] = time.monotonic() - t0
        self.init_sim()
        if not self._running(WEBHOOK):
            t0 = time.monotonic()
            self.start_webhook()
            times["webhook_start_s"] = time.monotonic() - t0
            log(f"webhook on https://127.0.0.1:{self.settings.webhook_port}{WEBHOOK_PATH}")
        if not self.plugin_running():
            t0 = time.monotonic()
            argv, env = self.plugin_command()
            self.processes.start(PLUGIN, argv, self.settings.artifacts / "plugin.log", env=env)
            self.wait_plugin_ready()
            times["plugin_ready_s"] = time.monotonic() - t0
            log(f"kubelet plugin ready on {self.node_name} (log: {self.settings.artifacts / 'plugin.log'})")
        t0 = time.monotonic()
        self.wait_slices()
        times["slices_published_s"] = time.monotonic() - t0
        return times

    def webhook_running(self) -> bool:
        return self._running(WEBHOOK)

    def _running(self, name: str) -> bool:
        entry = self.processes.get(name)
        return entry is not None and is_running(entry)

    def slices(self) -> list[dict[str, Any]]:
        return node_slices(self.kubectl, self.node_name)

    def wait_slices(self, timeout_s: float = 90) -> list[dict[str, Any]]:
        """The node's pool once complete: every slice of its newest generation is there, with devices."""
        return wait_complete_pool(self.kubectl, self.node_name, timeout_s, self.log_tail)

    def uninstall(self) -> None:
        """Stop what install() started. DeviceClasses stay when examples still use them; delete them last."""
        self.stop_webhook()
        self.stop_plugin()
        try:
            classes, _ = self.device_class_docs()
            names = [c["metadata"]["name"] for c in classes]
            self.kubectl.run(
                "delete", "deviceclasses.resource.k8s.io", *names, "--ignore-not-found", check=False
            )
        except chart.ChartUnavailableError:
            pass
