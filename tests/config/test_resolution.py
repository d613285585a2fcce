"""Which opaque config applies to which allocation result (k8s-dra-api §4.5, nvidia-conventions §6.6)."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gpu.config.api import GpuConfig, MigDeviceConfig
from dra_gpu.config.resolution import (
    ConfigResolutionError,
    ResultRef,
    ordered_config_entries,
    resolve_configs,
)
from dra_gpu.inventory.model import DeviceKind

V1B1 = "resource.nvidia.com/v1beta1"
GPU = DeviceKind.GPU
MIG = DeviceKind.MIG_DYNAMIC


def gpu_cfg(interval: str) -> dict[str, Any]:
    return {
        "apiVersion": V1B1,
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
    }


def mig_cfg() -> dict[str, Any]:
    return {"apiVersion": V1B1, "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}}


def entry(
    params: dict[str, Any],
    source: str = "FromClaim",
    requests: list[str] | None = None,
    driver: str = "gpu.nvidia.com",
) -> dict[str, Any]:
    raw: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        raw["requests"] = requests
    return raw


def interval_of(config: object) -> str | None:
    assert isinstance(config, GpuConfig)
    return config.time_slice_interval


def resolve(results: list[ResultRef], raw: list[dict[str, Any]]) -> dict[str, object | None]:
    groups = resolve_configs(results, ordered_config_entries(raw))
    by_device: dict[str, object | None] = {}
    for group in groups:
        for index in group.results:
            by_device[results[index].device] = group.config
    assert sorted(by_device) == sorted(r.device for r in results)  # every result in exactly one group
    return by_device


def test_claim_config_beats_class_config_whatever_the_list_order() -> None:
    results = [ResultRef("gpu", "gpu-0", GPU)]
    raw = [entry(gpu_cfg("Long"), source="FromClaim"), entry(gpu_cfg("Short"), source="FromClass")]
    assert interval_of(resolve(results, raw)["gpu-0"]) == "Long"


def test_later_entry_wins_even_if_the_earlier_one_names_the_request() -> None:
    results = [ResultRef("gpu", "gpu-0", GPU)]
    raw = [entry(gpu_cfg("Short"), requests=["gpu"]), entry(gpu_cfg("Medium"))]
    assert interval_of(resolve(results, raw)["gpu-0"]) == "Medium"


def test_entries_naming_requests_apply_only_to_those() -> None:
    results = [ResultRef("a", "gpu-0", GPU), ResultRef("b", "gpu-1", GPU)]
    raw = [entry(gpu_cfg("Short")), entry(gpu_cfg("Long"), requests=["b"])]
    resolved = resolve(results, raw)
    assert interval_of(resolved["gpu-0"]) == "Short"
    assert interval_of(resolved["gpu-1"]) == "Long"


def test_subrequest_is_matched_by_its_parent_request() -> None:
    results = [ResultRef("big/h100", "gpu-0", GPU), ResultRef("other", "gpu-1", GPU)]
    raw = [entry(gpu_cfg("Long"), requests=["big"])]
    resolved = resolve(results, raw)
    assert interval_of(resolved["gpu-0"]) == "Long"
    assert resolved["gpu-1"] is None


def test_subrequest_named_literally() -> None:
    results = [ResultRef("big/h100", "gpu-0", GPU), ResultRef("big/a100", "gpu-1", GPU)]
    raw = [entry(gpu_cfg("Long"), requests=["big/h100"])]
    resolved = resolve(results, raw)
    assert interval_of(resolved["gpu-0"]) == "Long" and resolved["gpu-1"] is None


def test_results_sharing_a_config_form_one_group_and_defaults_another() -> None:
    results = [ResultRef("a", "gpu-0", GPU), ResultRef("a", "gpu-1", GPU), ResultRef("m", "mig-x", MIG)]
    groups = resolve_configs(results, ordered_config_entries([entry(gpu_cfg("Short"), requests=["a"])]))
    assert [(g.config is None, g.results) for g in groups] == [(True, (2,)), (False, (0, 1))]


def test_all_requests_entry_of_the_wrong_kind_is_skipped() -> None:
    results = [ResultRef("g", "gpu-0", GPU), ResultRef("m", "mig-0", MIG)]
    raw = [entry(gpu_cfg("Short")), entry(mig_cfg())]
    resolved = resolve(results, raw)
    assert isinstance(resolved["mig-0"], MigDeviceConfig)
    assert interval_of(resolved["gpu-0"]) == "Short"


def test_named_entry_of_the_wrong_kind_is_an_error_naming_device_and_fix() -> None:
    results = [ResultRef("m", "gpu-0-mig-1g10gb-19-0", MIG)]
    with pytest.raises(ConfigResolutionError) as err:
        resolve(results, [entry(gpu_cfg("Short"), requests=["m"])])
    message = str(err.value)
    assert (
        "gpu-0-mig-1g10gb-19-0" in message and "GpuConfig" in message and "use a MigDeviceConfig" in message
    )


def test_other_drivers_configs_are_ignored_even_if_malformed() -> None:
    results = [ResultRef("g", "gpu-0", GPU)]
    raw = [entry({"whatever": True}, driver="other.example.com")]
    assert resolve(results, raw) == {"gpu-0": None}


def test_malformed_parameters_name_the_entry_and_field() -> None:
    bad = {"apiVersion": V1B1, "kind": "GpuConfig", "sharing": {"strategy": "Sometimes"}}
    with pytest.raises(ConfigResolutionError) as err:
        ordered_config_entries([entry(gpu_cfg("Short")), entry(bad)])
    assert "config[1]" in str(err.value) and "sharing.strategy" in str(err.value)


def test_non_object_parameters_and_missing_opaque_are_errors() -> None:
    with pytest.raises(ConfigResolutionError, match=r"config\[0\].opaque.parameters: must be a JSON object"):
        ordered_config_entries(
            [{"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": 3}}]
        )
    with pytest.raises(ConfigResolutionError, match="no `opaque` member"):
        ordered_config_entries([{"source": "FromClaim"}])
