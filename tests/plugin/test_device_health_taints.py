"""Device health end to end: XIDs and lost GPUs injected into the simulator reach the published ResourceSlices
as device taints and the kubelet's health stream as UNHEALTHY, and go again after a GPU reset (real plugin
process, real kube-apiserver)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.plugin.kubelet_client import KubeletClient
from tests.plugin.plugin_harness import ClaimFactory, PluginProcess, SimNode

pytestmark = pytest.mark.apiserver

FAST = [
    "--publish-slices",
    "true",
    "--rediscovery-interval",
    "3600",
    "--device-health-poll-seconds",
    "0.2",
    "--device-health-recovery-seconds",
    "1",
]
HEALTHY, UNHEALTHY = 1, 2

Taints = dict[str, list[dict[str, Any]]]


def _taints(claims: ClaimFactory) -> Taints:
    return {name: d.get("taints", []) for name, d in claims.published_devices().items()}


def _wait(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not reached in {timeout}s"
        time.sleep(0.1)


def _tainted(
    claims: ClaimFactory, node: SimNode, minor: int, key: str, value: str | None = None
) -> Callable[[], Any]:
    """Every device of GPU `minor` carries the taint (and no other GPU's device any taint)."""

    def check() -> Taints | None:
        taints = _taints(claims)
        mine = {n: t for n, t in taints.items() if n == f"gpu-{minor}" or n.startswith(f"gpu-{minor}-")}
        others = {n: t for n, t in taints.items() if n not in mine}
        ok = (
            len(taints) > len(mine) > 0
            and all(any(t["key"] == key and t.get("value") == value for t in ts) for ts in mine.values())
            and not any(others.values())
        )
        return taints if ok else None

    return check


def _untainted(claims: ClaimFactory, node: SimNode) -> Callable[[], bool]:
    def check() -> bool:
        taints = _taints(claims)
        return bool(taints) and not any(taints.values())

    return check


def _health(kubelet: KubeletClient) -> dict[str, tuple[int, str]]:
    message = kubelet.first_health_message()
    return {d.device.device_name: (d.health, d.message) for d in message.devices}


@pytest.fixture
def plugin(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> Iterator[KubeletClient]:
    process = start_plugin(extra_args=FAST)
    _wait("first publication", _untainted(claims, node), timeout=60)
    kubelet = KubeletClient(node.registration_socket)
    yield kubelet
    kubelet.close()
    # the server kept our taints as written (timeAdded included): nothing looked like a dropped field
    assert "dropped fields" not in process.log_path.read_text()


def test_xid_79_taints_gpu_and_everything_on_it_until_reset(
    plugin: KubeletClient, node: SimNode, claims: ClaimFactory
) -> None:
    started = time.monotonic()
    node.hardware_cli("xid", "--gpu", "3", "--xid", "79")
    taints = _wait("XID 79 taint on gpu-3", _tainted(claims, node, 3, "gpu.nvidia.com/xid", "79"), timeout=10)
    print(f"XID 79 -> taint published in {time.monotonic() - started:.2f}s")
    assert {"gpu-3", "gpu-3-shared", "gpu-3-mig-1g10gb-19-0", "gpu-3-mig-7g80gb-0-0"} <= set(taints)
    (taint,) = taints["gpu-3"]
    assert taint["effect"] == "NoSchedule" and taint["timeAdded"].endswith("Z")

    health = _wait(
        "UNHEALTHY in the health stream", lambda: (h := _health(plugin))["gpu-3"][0] == UNHEALTHY and h
    )
    assert all(
        health[n][0] == UNHEALTHY and "gpu.nvidia.com/xid=79" in health[n][1]
        for n in taints
        if n.startswith("gpu-3")
    )
    assert health["gpu-2"] == (HEALTHY, "")

    time.sleep(1.5)  # past the quiet period: the driver still asks for a reset, so the taint stays
    assert _tainted(claims, node, 3, "gpu.nvidia.com/xid", "79")()

    node.hardware_cli("recover", "--gpu", "3")
    _wait("taints gone after the reset", _untainted(claims, node), timeout=10)
    _wait("HEALTHY again", lambda: all(h == HEALTHY for h, _m in _health(plugin).values()))


def test_ignorable_xid_13_taints_with_effect_none_only(
    plugin: KubeletClient, node: SimNode, claims: ClaimFactory
) -> None:
    node.hardware_cli("xid", "--gpu", "2", "--xid", "13")
    taints = _wait("XID 13 taint on gpu-2", _tainted(claims, node, 2, "gpu.nvidia.com/xid", "13"), timeout=10)
    assert {t["effect"] for ts in taints.values() for t in ts} == {"None"}
    health = _wait("message for gpu-2", lambda: (h := _health(plugin))["gpu-2"][1] and h)
    assert health["gpu-2"][0] == HEALTHY and "xid=13 (None" in health["gpu-2"][1]
    node.hardware_cli("recover", "--gpu", "2")
    _wait("taints gone after the reset", _untainted(claims, node), timeout=10)


def test_lost_gpu_is_tainted_and_comes_back(
    plugin: KubeletClient, node: SimNode, claims: ClaimFactory
) -> None:
    node.hardware_cli("gpu-lost", "--gpu", "5")
    taints = _wait(
        "gpu-lost taint on gpu-5", _tainted(claims, node, 5, "gpu.nvidia.com/gpu-lost"), timeout=10
    )
    assert {t["effect"] for ts in taints.values() for t in ts} == {"NoSchedule"}
    _wait("UNHEALTHY", lambda: _health(plugin)["gpu-5"][0] == UNHEALTHY)
    node.hardware_cli("recover", "--gpu", "5")
    _wait("taints gone once NVML answers", _untainted(claims, node), timeout=10)


def test_health_check_off_publishes_no_taints(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    start_plugin(extra_args=FAST, env={"DEVICE_HEALTH_CHECK": "false"})
    _wait("first publication", _untainted(claims, node), timeout=60)
    node.hardware_cli("xid", "--gpu", "3", "--xid", "79")
    time.sleep(2.0)  # several poll periods of a monitor that would run
    assert _untainted(claims, node)()


def test_taints_survive_a_plugin_restart_until_the_gpu_is_reset(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    first = start_plugin(extra_args=FAST)
    _wait("first publication", _untainted(claims, node), timeout=60)
    node.hardware_cli("xid", "--gpu", "1", "--xid", "48")
    before = _wait("XID 48 taint", _tainted(claims, node, 1, "gpu.nvidia.com/xid", "48"), timeout=10)
    assert first.stop() == 0
    assert (node.plugin_dir / "device-health.json").is_file()

    start_plugin(extra_args=FAST)
    # the new process's own view (its health stream), not the slices the old one left behind
    kubelet = KubeletClient(node.registration_socket)
    try:
        health = _health(kubelet)
    finally:
        kubelet.close()
    assert health["gpu-1"][0] == UNHEALTHY and "xid=48" in health["gpu-1"][1]
    time.sleep(1.5)  # past the quiet period: the GPU still waits for its reset
    after = _tainted(claims, node, 1, "gpu.nvidia.com/xid", "48")()
    assert after is not None and after["gpu-1"] == before["gpu-1"]  # same taint, same timeAdded

    first_reset = time.monotonic()
    node.hardware_cli("recover", "--gpu", "1")
    _wait("taints gone after the reset", _untainted(claims, node), timeout=10)
    print(f"reset -> taints removed in {time.monotonic() - first_reset:.2f}s")


def test_double_bit_ecc_taints_noexecute_and_only_a_reset_clears_it(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    """A DBE (as an NVML ECC event) on a driver that cannot report the recovery action: NoExecute taint, and
    the quiet period passing proves nothing; the reset does."""
    start_plugin(extra_args=[*FAST, "--device-health-taint-effect", "NoExecute"])
    _wait("first publication", _untainted(claims, node), timeout=60)
    # older driver: NVML_FI_DEV_GET_GPU_RECOVERY_ACTION not supported (NVML_ERROR_NOT_SUPPORTED = 3)
    node.hardware_cli("fault", "--index", "4", "--function", "nvmlDeviceGetFieldValues", "--error", "3")
    node.hardware_cli("xid", "--gpu", "4", "--xid", "48", "--ecc-event", "--no-reset-required")
    taints = _wait("DBE taint on gpu-4", _tainted(claims, node, 4, "gpu.nvidia.com/xid", "48"), timeout=10)
    assert {t["effect"] for n, ts in taints.items() if n.startswith("gpu-4") for t in ts} == {"NoExecute"}
    kubelet = KubeletClient(node.registration_socket)
    try:
        _wait("UNHEALTHY", lambda: _health(kubelet)["gpu-4"][0] == UNHEALTHY)
        time.sleep(2.0)  # well past the 1 s quiet period: NVML answers, no reset asked, yet nothing proven
        assert _tainted(claims, node, 4, "gpu.nvidia.com/xid", "48")()
        assert _health(kubelet)["gpu-4"][0] == UNHEALTHY
        node.hardware_cli("recover", "--gpu", "4")
        _wait("taints gone after the reset", _untainted(claims, node), timeout=10)
        _wait("HEALTHY again", lambda: _health(kubelet)["gpu-4"][0] == HEALTHY)
    finally:
        kubelet.close()
