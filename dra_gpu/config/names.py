"""The names of the opaque config API and its error type, without the pydantic models of `dra_gpu.config.api`.

The kubelet plugin's start-up path (the sharing planner, config resolution) needs only these; the models, and
pydantic with them (~0.1 s and ~10 MB of a plugin's start), load with the first claim that carries an opaque
config. `dra_gpu.config.api` re-exports every name here.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final, Literal, TypeAlias, TypeGuard

if TYPE_CHECKING:
    from dra_gpu.config.api import GpuConfig, MigDeviceConfig

API_VERSION: Final = "resource.nvidia.com/v1beta1"
LEGACY_API_VERSION = "gpu.nvidia.com/v1alpha1"
SUPPORTED_API_VERSIONS = (API_VERSION, LEGACY_API_VERSION)
GPU_CONFIG_KIND: Final = "GpuConfig"
MIG_DEVICE_CONFIG_KIND: Final = "MigDeviceConfig"
SUPPORTED_KINDS = (GPU_CONFIG_KIND, MIG_DEVICE_CONFIG_KIND)

SharingStrategy: TypeAlias = Literal["TimeSlicing", "MPS"]
TimeSliceInterval: TypeAlias = Literal["Default", "Short", "Medium", "Long"]
SHARING_STRATEGIES: tuple[SharingStrategy, ...] = ("TimeSlicing", "MPS")
TIME_SLICE_INTERVALS: tuple[TimeSliceInterval, ...] = ("Default", "Short", "Medium", "Long")
# `nvidia-smi compute-policy --set-timeslice` takes the position in this list.
TIME_SLICE_VALUES: Mapping[TimeSliceInterval, int] = {name: i for i, name in enumerate(TIME_SLICE_INTERVALS)}


class ConfigError(ValueError):
    """An opaque config is invalid. `field` is the path, e.g. "sharing.strategy"."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        self.problems: tuple[tuple[str, str], ...] = ((field, reason),)  # all (field, reason); see combine()
        super().__init__(f"{field}: {reason}" if field else reason)

    @classmethod
    def combine(cls, errors: Sequence[ConfigError]) -> ConfigError:
        """One error that reports all of `errors` (the first one's field is `field`)."""
        if len(errors) == 1:
            return errors[0]
        combined = cls(errors[0].field, errors[0].reason)
        combined.problems = tuple(p for e in errors for p in e.problems)
        combined.args = ("; ".join(str(e) for e in errors),)
        return combined


# Type checks that do not load the models: while `dra_gpu.config.api` is not imported, no decoded config can
# exist, so the answer is False without importing it (the sharing planner asks for every prepared group).
# The module is in sys.modules from the moment another thread starts importing it, before its classes exist
# (the soak's "partially initialized module" refusals): a class not defined yet has no instances either.
def is_gpu_config(config: object) -> TypeGuard[GpuConfig]:
    return _is_model_instance(config, "GpuConfig")


def is_mig_device_config(config: object) -> TypeGuard[MigDeviceConfig]:
    return _is_model_instance(config, "MigDeviceConfig")


def _is_model_instance(config: object, class_name: str) -> bool:
    model = getattr(sys.modules.get("dra_gpu.config.api"), class_name, None)
    return isinstance(model, type) and isinstance(config, model)
