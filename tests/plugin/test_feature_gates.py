"""NVIDIA's feature gate names in `--feature-gates`: each does what NVIDIA's does where dra-gpu has the
feature (checked on the real plugin process against a simulated node), is refused when it asks for a feature
dra-gpu lacks, and is named as without effect where NVIDIA's GPU plugin does not read it either."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from dra_gpu.cli import feature_gates as fg
from tests.plugin.kubelet_client import ClaimId, KubeletClient
from tests.plugin.plugin_harness import (
    ClaimFactory,
    PluginProcess,
    Result,
    SimNode,
    mps,
    opaque,
    time_slicing,
)

# kubernetes-sigs/dra-driver-nvidia-gpu 9593204 pkg/featuregates/featuregates.go, and the logging gates that
# component-base's logsapi.AddFeatureGates registers in the same gate set.
NVIDIA_GATES = {
    "TimeSlicingSettings": False,
    "MPSSupport": False,
    "IMEXDaemonsWithDNSNames": True,
    "PassthroughSupport": False,
    "NVMLDeviceHealthCheck": False,
    "DynamicMIG": False,
    "ComputeDomainCliques": True,
    "CrashOnNVLinkFabricErrors": True,
    "DeviceMetadata": False,
    "FabricManagerPartitioning": False,
    "HostManagedIMEXDaemon": False,
    "DRAListTypeAttributes": False,
    "ConsumableShares": False,
    "ContextualLogging": True,
    "LoggingAlphaOptions": False,
    "LoggingBetaOptions": True,
}


def test_every_nvidia_gate_is_known_with_nvidias_default() -> None:
    assert set(fg.GATES) == set(NVIDIA_GATES)
    assert {name: gate.nvidia_default for name, gate in fg.GATES.items()} == NVIDIA_GATES
    # NVIDIA's defaults as a setting: accepted (its chart renders `NAME=value,` with a trailing comma)
    text = "".join(f"{name}={str(value).lower()}," for name, value in NVIDIA_GATES.items())
    gates = fg.parse_feature_gates(text)
    assert gates["MPSSupport"] is False and gates["DynamicMIG"] is False


def test_features_dra_gpu_has_are_on_unless_turned_off() -> None:
    gates = fg.parse_feature_gates("")
    for name in (
        "TimeSlicingSettings",
        "MPSSupport",
        "DynamicMIG",
        "NVMLDeviceHealthCheck",
        "ConsumableShares",
    ):
        assert gates[name] is True, name
        assert fg.parse_feature_gates(f"{name}=false")[name] is False
    assert gates["DRAListTypeAttributes"] is False


@pytest.mark.parametrize("name", ["PassthroughSupport", "DeviceMetadata", "FabricManagerPartitioning"])
def test_gates_of_missing_features_are_refused_when_on(name: str) -> None:
    assert fg.parse_feature_gates(f"{name}=false")[name] is False
    with pytest.raises(ValueError, match=rf"{name}=true: .*not supported.*set {name}=false"):
        fg.parse_feature_gates(f"{name}=true")


def test_gates_without_effect_are_named() -> None:
    notes = fg.no_effect_notes("IMEXDaemonsWithDNSNames=false,MPSSupport=true,ContextualLogging=true")
    assert len(notes) == 2
    assert "IMEXDaemonsWithDNSNames=false has no effect" in notes[0] and "ComputeDomain" in notes[0]
    assert "ContextualLogging=true has no effect" in notes[1] and "klog" in notes[1]


def test_consumable_shares_needs_its_gate_as_in_nvidias_driver() -> None:
    off = fg.parse_feature_gates("ConsumableShares=false")
    fg.check_consumable_shares(off, "disabled")
    fg.check_consumable_shares(fg.parse_feature_gates(""), "memory")
    with pytest.raises(ValueError, match="--consumable-shares memory requires feature gate ConsumableShares"):
        fg.check_consumable_shares(off, "memory")


# ----------------------------------------------------------------------- the plugin process, on the simulator


@pytest.mark.apiserver
def test_mps_support_off_refuses_mps_configs_only(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    start_plugin(extra_args=["--feature-gates", "MPSSupport=false"])
    kubelet = KubeletClient(node.registration_socket)
    name, uid = claims.make("gates", [Result("gpu", "gpu-0")], [opaque(mps(), ["gpu"])])
    answer = kubelet.prepare([ClaimId("gates", uid, name)])
    assert (
        "'MPS' is selected as the GPU sharing strategy, but the 'MPSSupport' feature gate is not enabled"
        in (answer.claims[uid].error)
    )
    assert node.mps_records() == {} and node.checkpoint()["claims"] == {}  # nothing was started
    name, uid = claims.make("gates", [Result("gpu", "gpu-1")], [opaque(time_slicing("Long"), ["gpu"])])
    assert kubelet.prepare([ClaimId("gates", uid, name)]).claims[uid].error == ""
    assert list(node.timeslices().values()) == [3]


@pytest.mark.apiserver
def test_time_slicing_settings_off_refuses_time_slicing_configs(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    process = start_plugin(
        extra_args=["--feature-gates", "TimeSlicingSettings=false,IMEXDaemonsWithDNSNames=false"]
    )
    # a gate NVIDIA's GPU plugin does not read either: accepted, and said so in the log
    assert "feature gate IMEXDaemonsWithDNSNames=false has no effect" in process.log_path.read_text()
    kubelet = KubeletClient(node.registration_socket)
    name, uid = claims.make("gates", [Result("gpu", "gpu-0")], [opaque(time_slicing("Long"), ["gpu"])])
    error = kubelet.prepare([ClaimId("gates", uid, name)]).claims[uid].error
    assert "'TimeSlicing' is selected as the GPU sharing strategy, but the 'TimeSlicingSettings'" in error
    assert node.timeslices() == {}
    name, uid = claims.make("gates", [Result("gpu", "gpu-1")])  # no config: as always
    assert kubelet.prepare([ClaimId("gates", uid, name)]).claims[uid].error == ""


@pytest.mark.apiserver
def test_dynamic_mig_off_publishes_no_mig_placements(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    publish = ["--publish-slices", "true", "--rediscovery-interval", "3600"]
    process = start_plugin(extra_args=publish)
    devices = claims.wait_published(lambda d: "gpu-0" in d)
    assert any("-mig-" in n for n in devices)  # the default: every placement, made at prepare
    process.stop()
    start_plugin(extra_args=[*publish, "--feature-gates", "DynamicMIG=false"])
    devices = claims.wait_published(lambda d: "gpu-0" in d and not any("-mig-" in n for n in d))
    assert {f"gpu-{m}" for m in range(8)} <= set(devices)


@pytest.mark.apiserver
def test_nvml_device_health_check_off_publishes_no_taints(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    start_plugin(
        extra_args=[
            "--publish-slices",
            "true",
            "--device-health-poll-seconds",
            "0.2",
            "--feature-gates",
            "NVMLDeviceHealthCheck=false",
        ]
    )
    claims.wait_published(lambda d: "gpu-3" in d)
    node.hardware_cli("xid", "--gpu", "3", "--xid", "79")
    time.sleep(3)  # the monitor, were it on, taints within a second (test_device_health_taints.py)
    assert not any(d.get("taints") for d in claims.published_devices().values())


@pytest.mark.apiserver
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--feature-gates", "PassthroughSupport=true"], "VFIO passthrough"),
        (
            ["--feature-gates", "ConsumableShares=false", "--consumable-shares", "memory"],
            "requires feature gate ConsumableShares",
        ),
        (["--feature-gates", "NoSuchGate=true"], "unknown gate"),
    ],
)
def test_refused_settings_stop_the_plugin_with_a_message(
    start_plugin: Callable[..., PluginProcess], args: list[str], message: str
) -> None:
    process = start_plugin(wait=False, extra_args=args)
    assert process.wait_dead() == 2
    assert message in process.log_tail()
