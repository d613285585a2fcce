"""Arbitrary JSON never makes the decoder fail with anything but ConfigError."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dra_gpu.config.api import GpuConfig, MigDeviceConfig, decode_opaque_config
from dra_gpu.config.names import ConfigError

FIELDS = [
    "apiVersion",
    "kind",
    "sharing",
    "strategy",
    "timeSlicingConfig",
    "interval",
    "mpsConfig",
    "defaultActiveThreadPercentage",
    "defaultPinnedDeviceMemoryLimit",
    "defaultPerDevicePinnedMemoryLimit",
    "timeSlice",
    "0",
    "GPU-1",
]
VALUES = [
    "resource.nvidia.com/v1beta1",
    "gpu.nvidia.com/v1alpha1",
    "GpuConfig",
    "MigDeviceConfig",
    "MPS",
    "TimeSlicing",
    "Long",
    "1Gi",
    "-5",
    "1e3",
]

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False),
        st.text(max_size=8),
        st.sampled_from(VALUES),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=6)), inner, max_size=4),
    ),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(st.one_of(json_values, st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=5)))
def test_arbitrary_json_decodes_or_raises_config_error(parameters: Any) -> None:
    try:
        config = decode_opaque_config(parameters)
    except ConfigError as err:
        assert str(err)
        assert "errors.pydantic.dev" not in str(err)
        return
    assert isinstance(config, GpuConfig | MigDeviceConfig)
    assert decode_opaque_config(config.to_dict()) == config  # normalized output is a fixed point
