"""MPS control daemons of the host-process driver on a real cluster (issue 12): a daemon killed by hand is
back within 10 s with its limits, a pid that another process holds by then is never signalled, and a claim
whose GPU fell off the bus unprepares and is cleaned up when the GPU returns.

The killed-daemon test is for the host-process driver, whose daemons are processes the plugin signals by pid:
it reads the daemon's record under the plugin directory and kills, and impersonates, processes on this
machine. The chart's daemons are pods (kind): e2e/test_chart_install.py SIGKILLs one and checks it is back
within 10 s. The GPU-gone test runs on both: on kind the simulator's tools run in the node's plugin pod.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu.hardware.sim_tools.mps_records import record_for_pipe_dir
from e2e.lib.claims import pod_claim_names
from e2e.lib.cluster_control import feature_enabled
from e2e.lib.driver import DriverControl, HostDriver, python_cli
from e2e.lib.incluster import InClusterDriver
from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import DRIVER_NAME, E2ESettings
from e2e.lib.waiting import wait_for_pods, wait_until
from e2e.lib.workloads import claim_template, pod_with_template

RESTART_DEADLINE_S = 10.0  # issue 12: a dead daemon is back within 10 s
NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
CLAIMS = "resourceclaims.resource.k8s.io"
SHARING_TAINT_KEY = "gpu.nvidia.com/sharing"  # dra_gpu/plugin/mps_reconciler.py
DEFAULT, EXCLUSIVE_PROCESS = 0, 3  # NVML compute modes, as the simulator state holds them


def _mps_config(threads: int, pinned: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {
            "strategy": "MPS",
            "mpsConfig": {"defaultActiveThreadPercentage": threads, "defaultPinnedDeviceMemoryLimit": pinned},
        },
    }


def _run_mps_pod(
    kubectl: Kubectl, driver: DriverControl, settings: E2ESettings, namespace: str, threads: int, pinned: str
) -> dict[str, Any]:
    """Pod `pod` with a whole-GPU MPS claim (template `mps`) with these limits, Running; returns the pods."""
    docs = [
        claim_template(namespace, "mps", config=_mps_config(threads, pinned)),
        pod_with_template(namespace, "pod", "mps", settings.test_image),
    ]
    kubectl.apply(yaml.safe_dump_all(docs))
    return wait_for_pods(
        kubectl, namespace, ["pod"], phases=("Running",), timeout_s=settings.pod_timeout_s,
        driver_log_tail=driver.log_tail,
    )  # fmt: skip


def _start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _records(settings: E2ESettings) -> dict[str, dict[str, Any]]:
    """daemon id -> the record.json next to each MPS daemon of the host plugin (its latest identity)."""
    base = settings.kubelet_dir / "plugins" / DRIVER_NAME / "mps"
    found = {}
    for path in sorted(base.glob("*/record.json")):
        try:
            found[path.parent.name] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written: the next poll reads it
    return found


def _impostor_with_pid(pid: int) -> subprocess.Popen[bytes] | None:
    """A process that holds `pid` (free again: its owner was killed) and looks like an MPS control daemon:
    what a reused pid looks like from the dead daemon's record. None when someone else got the pid first."""
    deadline = time.monotonic() + 20
    while Path(f"/proc/{pid}").exists():  # a zombie until its new parent (init, here) reaps it
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
    for _ in range(20):
        NS_LAST_PID.write_text(f"{pid - 1}\n")
        process = subprocess.Popen(
            ["nvidia-cuda-mps-control", "-c", "sleep 600; :"], executable="/bin/sh", start_new_session=True
        )
        if process.pid == pid:
            return process
        process.kill()
        process.wait(10)
        if Path(f"/proc/{pid}").exists():
            return None
    return None


@pytest.mark.e2e
@pytest.mark.disruptive
def test_a_killed_daemon_is_back_within_10s_and_a_reused_pid_is_never_signalled(
    kubectl: Kubectl, driver: DriverControl, settings: E2ESettings, namespace: str
) -> None:
    """A pod with a whole-GPU MPS claim (40 % threads, 4Gi pinned). Its daemon is SIGKILLed and another
    process takes its pid as soon as it is free. The plugin's reconcile loop starts the daemon again within
    10 s, in the same pipe directory and with the same limits, without touching the process that now holds
    the old pid; deleting the pod stops the new daemon and still leaves that process alone."""
    if not isinstance(driver, HostDriver):
        pytest.skip(
            "the chart's MPS daemons are pods, not processes the plugin signals by pid: on kind "
            "e2e/test_chart_install.py SIGKILLs a daemon pod's process and checks it is back within 10 s"
        )
    _run_mps_pod(kubectl, driver, settings, namespace, 40, "4Gi")
    (daemon_id, record), *others = [
        (k, r) for k, r in _records(settings).items() if r.get("threadPercentage") == 40
    ]
    assert not others, "one MPS claim prepared, more than one daemon with its limits"
    old_pid, old_start = record["pid"], record["startTime"]
    assert old_pid and _start_time(old_pid) == old_start, record

    impostor: subprocess.Popen[bytes] | None = None
    try:
        os.kill(old_pid, signal.SIGKILL)
        killed = time.monotonic()
        impostor = _impostor_with_pid(old_pid)
        if impostor is None:
            pytest.fail(f"could not place a process at the freed pid {old_pid} (other processes took it)")

        def back() -> dict[str, Any] | None:
            # back = running with a new identity AND holding its limits: the record names the new pid as soon
            # as the daemon starts, a moment before the restart has set its pinned limit
            now = _records(settings).get(daemon_id)
            if now and now["pid"] not in (None, old_pid) and _start_time(now["pid"]) == now["startTime"]:
                # the simulator keys records by the pipe directory's identity, found from its host path
                held = record_for_pipe_dir(settings.driver_root, record["pipeDir"]) or {}
                limits = list((held.get("default_pinned_mem_limits") or {}).values())
                if held.get("pid") == now["pid"] and limits == ["4096M"]:
                    return now
            return None

        revived = wait_until(back, timeout_s=30, interval_s=0.1, what="the daemon back, limits set")
        took = time.monotonic() - killed
        print(f"\n[mps] daemon killed by hand back after {took:.1f}s, pid {old_pid} held by another process")
        assert took < RESTART_DEADLINE_S, f"the daemon was back after {took:.1f}s, not within 10 s"
        assert impostor.poll() is None, "the process holding the dead daemon's pid was signalled"
        assert revived["pipeDir"] == record["pipeDir"]
        sim = record_for_pipe_dir(settings.driver_root, record["pipeDir"]) or {}
        assert sim["running"] and sim["pid"] == revived["pid"]
        assert sim["default_active_thread_percentage"] == 40
        assert list(sim["default_pinned_mem_limits"].values()) == ["4096M"]
        pod = kubectl.get_json("pod", "pod", namespace)
        assert pod["status"]["phase"] == "Running"

        kubectl.run("delete", "pod", "pod", "-n", namespace, "--wait=true", "--timeout=120s")
        wait_until(
            lambda: daemon_id not in _records(settings), timeout_s=60, what="the claim's MPS daemon stopped"
        )
        assert _start_time(revived["pid"]) != revived["startTime"], "the restarted daemon still runs"
        assert impostor.poll() is None, "unprepare signalled the process that holds the old daemon's pid"
    finally:
        if impostor is not None:
            impostor.kill()
            impostor.wait(10)


def _hardware(driver: HostDriver | InClusterDriver, *args: str) -> None:
    """The simulator's control tools on the node's driver root: here, or in the node's plugin pod (kind)."""
    if isinstance(driver, InClusterDriver):
        driver.hardware(*args)
        return
    argv = [*python_cli(), "hardware", *args, "--driver-root", str(driver.settings.driver_root)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, f"`{' '.join(argv)}` failed: {proc.stderr.strip()}"


def _sharing_taints(host: HostDriver | InClusterDriver, uuid: str) -> dict[str, list[str]]:
    """device name -> values of its gpu.nvidia.com/sharing taints, for every device of the GPU `uuid`."""
    found: dict[str, list[str]] = {}
    for s in host.slices():
        for d in s["spec"].get("devices") or []:
            attrs = d.get("attributes") or {}
            if uuid in {(attrs.get(k) or {}).get("string") for k in ("uuid", "parentUUID")}:
                taints = d.get("taints") or []
                found[d["name"]] = [t.get("value", "") for t in taints if t.get("key") == SHARING_TAINT_KEY]
    return found


@pytest.mark.e2e
@pytest.mark.disruptive
def test_unprepare_with_the_gpu_gone_finishes_and_is_cleaned_when_it_returns(
    kubectl: Kubectl, driver: DriverControl, settings: E2ESettings, namespace: str
) -> None:
    """A pod with a whole-GPU MPS claim (its GPU in EXCLUSIVE_PROCESS). The GPU falls off the bus
    (`dra-gpu hardware gpu-lost`) and the pod is deleted: unprepare does not fail on the compute mode it
    cannot restore, so the pod is gone in time; the GPU's devices carry
    `gpu.nvidia.com/sharing=cleanup-pending` (where device taints are on); the GPU comes back (`recover`)
    still in EXCLUSIVE_PROCESS, and the driver's pending restore puts Default back and the taint goes."""
    assert isinstance(driver, HostDriver | InClusterDriver), type(driver)
    host = driver
    pods = _run_mps_pod(kubectl, host, settings, namespace, 50, "8Gi")
    claim_obj = kubectl.get_json(CLAIMS, pod_claim_names(pods["pod"])["gpu"], namespace)
    device = claim_obj["status"]["allocation"]["devices"]["results"][0]["device"]
    by_name = {d["name"]: d for s in host.slices() for d in s["spec"].get("devices") or []}
    uuid = by_name[device]["attributes"]["uuid"]["string"]
    gpu = next(g for g in host.sim_state()["gpus"] if g["uuid"] == uuid)
    minor = int(gpu["minor"])
    assert gpu["compute_mode"] == EXCLUSIVE_PROCESS, gpu
    taints_on = feature_enabled(kubectl, "DRADeviceTaints")
    lost = False
    try:
        _hardware(host, "gpu-lost", "--gpu", str(minor))
        lost = True
        started = time.monotonic()
        kubectl.run("delete", "pod", "pod", "-n", namespace, "--wait=true", "--timeout=60s")
        took = time.monotonic() - started
        print(f"\n[mps] pod on a lost GPU deleted in {took:.1f}s")
        assert took < 30, f"deleting the pod on the lost GPU took {took:.1f}s (grace period 5 s + unprepare)"

        def pending(value: int) -> bool:
            sample = f'dra_gpu_sharing_cleanup_pending{{gpu="{uuid}"}} '
            lines = [ln for ln in host.metrics_text().splitlines() if ln.startswith(sample)]
            return bool(lines) and float(lines[0].rsplit(" ", 1)[1]) == value

        def pending_taints() -> bool:
            # every device of the GPU that is still published (rediscovery drops a lost GPU's devices)
            return all("cleanup-pending" in values for values in _sharing_taints(host, uuid).values())

        wait_until(
            lambda: pending(1), timeout_s=30, what=f"cleanup pending on GPU {minor}", explain=host.log_tail
        )
        if taints_on:
            wait_until(
                pending_taints, timeout_s=30, explain=host.log_tail,
                what=f"gpu.nvidia.com/sharing=cleanup-pending on every device of GPU {minor}",
            )  # fmt: skip
        _hardware(host, "recover", "--gpu", str(minor))
        lost = False

        def mode() -> int:
            return int(next(g for g in host.sim_state()["gpus"] if g["uuid"] == uuid)["compute_mode"])

        # The GPU comes back with the mode the claim set (the simulator's recover, like a bus drop, resets no
        # setting): Default can only come from the driver's pending restore, which also clears the metric.
        back_with = mode()
        assert back_with == EXCLUSIVE_PROCESS or pending(0), (
            f"GPU {minor} came back in compute mode {back_with} with the restore still pending: something "
            "other than the driver put the mode back"
        )

        wait_until(
            lambda: mode() == DEFAULT and pending(0), timeout_s=30, explain=host.log_tail,
            what=f"GPU {minor}'s compute mode put back to Default, nothing pending",
        )  # fmt: skip
        wait_until(
            lambda: not any(_sharing_taints(host, uuid).values()), timeout_s=30, explain=host.log_tail,
            what=f"no gpu.nvidia.com/sharing taint left on GPU {minor}",
        )  # fmt: skip
    finally:
        if lost:
            _hardware(host, "recover", "--gpu", str(minor))
