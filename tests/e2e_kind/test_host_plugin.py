"""The host-mode kubelet plugin on a real kube-apiserver: started the way run-e2e.sh starts it (the chart's
environment and flags), it publishes the simulated DGX H100's ResourceSlices; killed, it is restarted from
the recorded command line and publishes again."""

from __future__ import annotations

import dataclasses
import socket
import tempfile
from pathlib import Path
from typing import Any

import pytest

from e2e.lib.driver import HostDriver
from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import load_settings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.apiserver
def test_plugin_host_process_publishes_slices_and_survives_sigkill(
    kube_apiserver: Any, tmp_path: Path
) -> None:
    kubelet_dir = Path(tempfile.mkdtemp(prefix="kl", dir="/tmp"))  # short: sockets live here
    settings = dataclasses.replace(
        load_settings({}),
        kubeconfig=Path(kube_apiserver.kubeconfig),
        artifacts=tmp_path,
        driver_root=tmp_path / "driver-root",
        cdi_root=tmp_path / "cdi",
        kubelet_dir=kubelet_dir,
        plugin_port=_free_port(),
        node_name="sim-node-1",
    )
    kubectl = Kubectl(settings.kubeconfig)
    driver = HostDriver(settings, kubectl)
    driver.init_sim()
    argv, env = driver.plugin_command()
    assert env.get("NODE_NAME", "sim-node-1") == "sim-node-1"  # the chart's env, when helm renders it
    assert "--node-name" in argv and argv[argv.index("--node-name") + 1] == "sim-node-1"
    driver.start_plugin()
    try:
        slices = driver.wait_slices(timeout_s=120)
        devices = {d["name"] for s in slices for d in s["spec"].get("devices") or []}
        assert {f"gpu-{i}" for i in range(8)} <= devices, sorted(devices)
        assert driver.sim_state()["hardware"] == "dgx-h100"
        first_pid = driver.processes.get("kubelet-plugin")
        driver.kill_plugin()
        assert not driver.plugin_running()
        driver.start_plugin()
        again = driver.processes.get("kubelet-plugin")
        assert first_pid is not None and again is not None and again.pid != first_pid.pid
        assert again.argv == first_pid.argv
        driver.wait_slices(timeout_s=120)
        assert "Traceback" not in driver.log_tail(400)
    finally:
        driver.stop_plugin()
        kubectl.run("delete", "resourceslices.resource.k8s.io", "--all", check=False)
