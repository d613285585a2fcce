"""Strict decoding, defaulting and validation of the opaque config kinds."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import structlog

from dra_gpu.config.api import (
    ConfigError,
    GpuConfig,
    MigDeviceConfig,
    MpsConfig,
    decode_opaque_config,
)

V1B1 = "resource.nvidia.com/v1beta1"
GIB = 2**30


def gpu(sharing: Any = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": V1B1, "kind": "GpuConfig", **extra}
    if sharing is not None:
        body["sharing"] = sharing
    return body


def mig(sharing: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": V1B1, "kind": "MigDeviceConfig"}
    if sharing is not None:
        body["sharing"] = sharing
    return body


def error_of(parameters: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        decode_opaque_config(parameters)
    return info.value


def test_no_sharing_stays_without_sharing() -> None:
    config = decode_opaque_config(gpu())
    assert isinstance(config, GpuConfig)
    assert config.sharing is None
    assert config.strategy is None
    assert config.time_slice_interval is None  # no implicit time-slicing


def test_time_slicing_without_interval_defaults_to_default() -> None:
    config = decode_opaque_config(gpu({"strategy": "TimeSlicing"}))
    assert isinstance(config, GpuConfig)
    assert config.to_dict()["sharing"] == {
        "strategy": "TimeSlicing",
        "timeSlicingConfig": {"interval": "Default"},
    }
    assert config.time_slice_interval == "Default"


@pytest.mark.parametrize("interval", ["Default", "Short", "Medium", "Long"])
def test_every_interval_is_accepted(interval: str) -> None:
    config = decode_opaque_config(
        gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}})
    )
    assert config.time_slice_interval == interval


def test_mps_without_config_gets_empty_config() -> None:
    config = decode_opaque_config(gpu({"strategy": "MPS"}))
    assert config.to_dict()["sharing"] == {"strategy": "MPS", "mpsConfig": {}}
    assert config.mps_config == MpsConfig()


def test_full_mps_config_round_trips() -> None:
    sharing = {
        "strategy": "MPS",
        "mpsConfig": {
            "defaultActiveThreadPercentage": 50,
            "defaultPinnedDeviceMemoryLimit": "10Gi",
            "defaultPerDevicePinnedMemoryLimit": {
                "0": "5Gi",
                "GPU-1234abcd-0000-0000-0000-000000000000": "2Gi",
            },
        },
    }
    config = decode_opaque_config(gpu(sharing))
    assert config.to_dict()["sharing"] == sharing


def test_quantity_given_as_json_integer_is_accepted() -> None:
    config = decode_opaque_config(
        gpu({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": 2 * GIB}})
    )
    assert config.mps_config is not None
    assert config.mps_config.defaultPinnedDeviceMemoryLimit == str(2 * GIB)


def test_mig_device_config_accepts_both_strategies() -> None:
    ts = decode_opaque_config(mig({"strategy": "TimeSlicing"}))
    assert isinstance(ts, MigDeviceConfig)
    assert ts.strategy == "TimeSlicing"
    assert ts.time_slice_interval is None
    mps = decode_opaque_config(mig({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 20}}))
    assert mps.mps_config == MpsConfig(defaultActiveThreadPercentage=20)


@pytest.mark.parametrize(
    ("parameters", "field", "words"),
    [
        ({"kind": "GpuConfig"}, "apiVersion", ["resource.nvidia.com/v1beta1", "gpu.nvidia.com/v1alpha1"]),
        (
            {"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
            "apiVersion",
            ["resource.nvidia.com/v1beta1"],
        ),
        ({"apiVersion": V1B1}, "kind", ["GpuConfig", "MigDeviceConfig"]),
        ({"apiVersion": V1B1, "kind": "VfioDeviceConfig"}, "kind", ["GpuConfig", "MigDeviceConfig"]),
        (gpu({"strategy": "Partitioning"}), "sharing.strategy", ["TimeSlicing", "MPS"]),
        (gpu({}), "sharing.strategy", ["required"]),
        (
            gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Huge"}}),
            "sharing.timeSlicingConfig.interval",
            ["Default", "Short", "Medium", "Long"],
        ),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}),
            "sharing.mpsConfig.defaultActiveThreadPercentage",
            ["0", "100"],
        ),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": -1}}),
            "sharing.mpsConfig.defaultActiveThreadPercentage",
            ["0", "100"],
        ),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": "50"}}),
            "sharing.mpsConfig.defaultActiveThreadPercentage",
            ["integer"],
        ),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": True}}),
            "sharing.mpsConfig.defaultActiveThreadPercentage",
            ["integer"],
        ),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "-1Gi"}}),
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
            ["1Mi"],
        ),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "0"}}),
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
            ["1Mi"],
        ),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "ten gigs"}}),
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
            ["quantity", "10Gi"],
        ),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"first": "1Gi"}}}),
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit",
            ["UUID", "index"],
        ),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "12Q"}}}),
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit['0']",
            ["quantity"],
        ),
        (
            gpu({"strategy": "MPS", "mpsConfig": {"unknown": 1}}),
            "sharing.mpsConfig.unknown",
            ["unknown field", "defaultActiveThreadPercentage"],
        ),
        (gpu({"strategy": "MPS"}, metadata={"name": "x"}), "metadata", ["unknown field", "sharing"]),
        (
            gpu({"strategy": "MPS", "timeSlicingConfig": {"interval": "Long"}}),
            "sharing.timeSlicingConfig",
            ["TimeSlicing"],
        ),
        (gpu({"strategy": "TimeSlicing", "mpsConfig": {}}), "sharing.mpsConfig", ["MPS"]),
        (
            mig({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
            "sharing.timeSlicingConfig",
            ["MIG", "remove timeSlicingConfig"],
        ),
        (gpu([]), "sharing", ["object"]),
        (["not", "an", "object"], "parameters", ["object"]),
        ({"apiVersion": V1B1, "kind": ["GpuConfig"]}, "kind", ["GpuConfig", "MigDeviceConfig"]),
        ({"apiVersion": {"group": "x"}, "kind": "GpuConfig"}, "apiVersion", ["resource.nvidia.com/v1beta1"]),
    ],
)
def test_bad_config_names_field_and_allowed_values(parameters: Any, field: str, words: list[str]) -> None:
    err = error_of(parameters)
    assert err.field == field, str(err)
    for word in words:
        assert word in str(err), str(err)
    assert "pydantic" not in str(err)
    assert "errors.pydantic.dev" not in str(err)


def test_several_bad_fields_are_all_reported() -> None:
    err = error_of(gpu({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 500, "x": 1}}))
    assert "defaultActiveThreadPercentage" in str(err)
    assert "mpsConfig.x" in str(err)


def test_legacy_api_version_is_converted_with_a_warning() -> None:
    with structlog.testing.capture_logs() as logs:
        config = decode_opaque_config(
            {
                "apiVersion": "gpu.nvidia.com/v1alpha1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"timeSlice": "Long"}},
            }
        )
    assert config.apiVersion == V1B1
    assert config.time_slice_interval == "Long"
    assert any(entry["log_level"] == "warning" and "deprecated" in entry["event"] for entry in logs)


def test_legacy_interval_spelling_also_accepted() -> None:
    config = decode_opaque_config(
        {"apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}
    )
    assert isinstance(config, MigDeviceConfig)
    assert config.mps_config == MpsConfig()


def test_legacy_error_uses_the_legacy_field_name() -> None:
    err = error_of(
        {
            "apiVersion": "gpu.nvidia.com/v1alpha1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"timeSlice": "Forever"}},
        }
    )
    assert err.field == "sharing.timeSlicingConfig.timeSlice"


def test_legacy_without_sharing_does_not_imply_time_slicing() -> None:
    config = decode_opaque_config({"apiVersion": "gpu.nvidia.com/v1alpha1", "kind": "GpuConfig"})
    assert config.time_slice_interval is None


# ---- prepare-time limits ----------------------------------------------------------------------------------

UUID_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
UUID_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
MEMORY = {UUID_A: 80 * GIB, UUID_B: 40 * GIB}


def test_default_limit_applies_to_every_device_and_index_overrides_sorted_order() -> None:
    mps = MpsConfig(defaultPinnedDeviceMemoryLimit="10Gi", defaultPerDevicePinnedMemoryLimit={"1": "20Gi"})
    assert mps.pinned_memory_limits([UUID_B, UUID_A], MEMORY) == {UUID_A: 10 * GIB, UUID_B: 20 * GIB}


def test_uuid_key_overrides_default() -> None:
    mps = MpsConfig(defaultPinnedDeviceMemoryLimit="1Gi", defaultPerDevicePinnedMemoryLimit={UUID_A: "3Gi"})
    assert mps.pinned_memory_limits([UUID_A, UUID_B], MEMORY) == {UUID_A: 3 * GIB, UUID_B: GIB}


def test_limits_are_rounded_down_to_whole_mib() -> None:
    mps = MpsConfig(defaultPinnedDeviceMemoryLimit="1.5G")
    assert mps.pinned_memory_limits([UUID_A], MEMORY) == {UUID_A: 1500000000 - 1500000000 % 2**20}


def test_limit_larger_than_device_is_clamped_and_reported() -> None:
    # NVIDIA's driver accepts any limit of at least 1 MiB (api/nvidia.com/resource/v1beta1/sharing.go,
    # limit.Megabyte: the only check is v > 0 MiB); we clamp to the device and say so.
    mps = MpsConfig(defaultPinnedDeviceMemoryLimit="50Gi", defaultPerDevicePinnedMemoryLimit={UUID_A: "90Gi"})
    clamped: list[str] = []
    assert mps.pinned_memory_limits([UUID_A, UUID_B], MEMORY, clamped=clamped) == {
        UUID_A: 80 * GIB,
        UUID_B: 40 * GIB,
    }
    assert sorted(clamped) == [
        f"sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit: limit 90Gi is larger than device {UUID_A} "
        "(80Gi); clamped to 80Gi",
        f"sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: limit 50Gi is larger than device {UUID_B} "
        "(40Gi); clamped to 40Gi",
    ]
    default_only = MpsConfig(defaultPinnedDeviceMemoryLimit="50Gi")
    assert default_only.pinned_memory_limits([UUID_B], MEMORY) == {UUID_B: 40 * GIB}  # no list: clamped too


def test_index_out_of_range_is_rejected() -> None:
    mps = MpsConfig(defaultPerDevicePinnedMemoryLimit={"2": "1Gi"})
    with pytest.raises(ConfigError, match=r"index 2 is out of range.*0\.\.1"):
        mps.pinned_memory_limits([UUID_A, UUID_B], MEMORY)


def test_uuid_not_allocated_is_rejected() -> None:
    mps = MpsConfig(defaultPerDevicePinnedMemoryLimit={"GPU-cccccccc": "1Gi"})
    with pytest.raises(ConfigError, match="GPU-cccccccc is not one of the allocated devices"):
        mps.pinned_memory_limits([UUID_A], MEMORY)


def test_type_checks_answer_while_another_thread_is_still_importing_the_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A gRPC thread's first claim with a config starts importing `dra_gpu.config.api`; the module is in
    sys.modules before its classes exist, and a second thread's planner asked it for `GpuConfig` and had its
    prepare refused ("partially initialized module", 2 in 2,500 soak steps)."""
    from dra_gpu.config.names import is_gpu_config, is_mig_device_config

    monkeypatch.setitem(sys.modules, "dra_gpu.config.api", types.ModuleType("dra_gpu.config.api"))
    assert not is_gpu_config(object())
    assert not is_mig_device_config(None)
