"""The host-mode kubelet plugin on a real kube-apiserver: started the way run-e2e.sh starts it (the chart's
environment and flags), it publishes the simulated DGX H100's ResourceSlices; killed, it is restarted from
the recorded command line and publishes again."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from e2e.lib.driver import HostDriver
from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import load_settings
from tests.support.control_plane import free_port


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
        plugin_port=free_port(),
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
        shutil.rmtree(kubelet_dir, ignore_errors=True)


@pytest.mark.apiserver
def test_install_then_uninstall_leaves_nothing(kube_apiserver: Any, tmp_path: Path) -> None:
    """`python -m e2e.lib.install up|down` minus the kubelet: DeviceClasses, webhook, plugin, slices."""
    from e2e.lib.chart import ChartUnavailableError, render_chart

    try:
        render_chart({"hardware": "dgx-h100"})
    except ChartUnavailableError as exc:
        pytest.skip(str(exc))
    kubelet_dir = Path(tempfile.mkdtemp(prefix="kl", dir="/tmp"))
    settings = dataclasses.replace(
        load_settings({}),
        kubeconfig=Path(kube_apiserver.kubeconfig),
        artifacts=tmp_path,
        driver_root=tmp_path / "driver-root",
        cdi_root=tmp_path / "cdi",
        kubelet_dir=kubelet_dir,
        plugin_port=free_port(),
        webhook_port=free_port(),
        node_name="sim-node-2",
    )
    kubectl = Kubectl(settings.kubeconfig)
    driver = HostDriver(settings, kubectl)
    try:
        times = driver.install(log=lambda _m: None)
        assert {"deviceclasses_s", "plugin_ready_s", "slices_published_s"} <= set(times)
        classes = {c["metadata"]["name"] for c in kubectl.items("deviceclasses.resource.k8s.io")}
        assert {"gpu.nvidia.com", "mig.nvidia.com", "gpu-share.nvidia.com"} <= classes
        assert driver.webhook_running() and driver.plugin_running()
        assert driver.install(log=lambda _m: None)["slices_published_s"] >= 0  # idempotent: nothing restarted
    finally:
        driver.uninstall()
        kubectl.run("delete", "resourceslices.resource.k8s.io", "--all", check=False)
        shutil.rmtree(kubelet_dir, ignore_errors=True)
    assert not driver.webhook_running() and not driver.plugin_running()
    assert not kubectl.items("deviceclasses.resource.k8s.io")


def test_in_process_sim_state_equals_the_cli(tmp_path: Path) -> None:
    from e2e.lib.driver import read_sim_state, read_sim_state_cli

    settings = dataclasses.replace(load_settings({}), artifacts=tmp_path, driver_root=tmp_path / "root")
    HostDriver(settings, Kubectl(tmp_path / "none"), node_name="n").init_sim()
    cli = read_sim_state_cli(settings.driver_root)
    fast = read_sim_state(settings.driver_root)
    assert cli == fast  # one report, whichever way it is read: static facts and MPS records included
    assert len(fast["gpus"]) == len(fast["devices"]) == 8
    assert fast["mps"] == {}
