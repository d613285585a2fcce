"""The opaque device configuration API: `resource.nvidia.com/v1beta1` `GpuConfig` and `MigDeviceConfig`.

These are the `parameters` of a ResourceClaim / DeviceClass `config[].opaque` entry whose `driver` is
`gpu.nvidia.com`. Field names are exactly NVIDIA's, so manifests written for NVIDIA's driver work unchanged:

    apiVersion: resource.nvidia.com/v1beta1
    kind: GpuConfig                      # or MigDeviceConfig
    sharing:
      strategy: TimeSlicing              # or MPS
      timeSlicingConfig:                 # GpuConfig only
        interval: Default                # Default | Short | Medium | Long
      mpsConfig:
        defaultActiveThreadPercentage: 50
        defaultPinnedDeviceMemoryLimit: 10Gi
        defaultPerDevicePinnedMemoryLimit: {"0": 5Gi, "GPU-...": 20Gi}

Decoding is strict (unknown fields are rejected, types are not coerced) and every error names the field
path and what is allowed. The same `decode_opaque_config` runs in the admission webhook and in the kubelet
plugin, so a config the webhook admits is one the plugin can apply. Checks that need the allocated devices (a
per-device key that names no allocated device) are made at prepare time by `MpsConfig.pinned_memory_limits`,
still here so that all validation of this API lives in one module. A limit larger than the device is not an
error: NVIDIA's driver accepts it (its only check is "at least 1 MiB") and MPS cannot pin more than the device
has, so it is clamped to the device's memory and the caller is told (the plugin logs a warning).

The deprecated `gpu.nvidia.com/v1alpha1` spelling (older talks and examples) is accepted and converted, with a
deprecation warning in the log. Unlike the old driver, a config without `sharing` does not imply time-slicing:
`--set-timeslice` fails on some GPUs, and a setting nobody asked for should not be applied (NVIDIA PR #1183).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, TypeAlias

import structlog
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
)
from pydantic_core import PydanticCustomError

from dra_gpu.config.names import (
    API_VERSION,
    GPU_CONFIG_KIND,
    LEGACY_API_VERSION,
    MIG_DEVICE_CONFIG_KIND,
    SUPPORTED_API_VERSIONS,
    SUPPORTED_KINDS,
    ConfigError,
    SharingStrategy,
    TimeSliceInterval,
)
from dra_gpu.config.quantity import MIB, QUANTITY_HELP, QuantityError, format_bytes, parse_quantity

log = structlog.get_logger(__name__)

# A per-device key is a GPU/MIG UUID or an index into the group's sorted UUID list.
_DEVICE_KEY_RE = re.compile(r"^(?:(?:GPU|MIG)-[0-9A-Za-z-]{1,80}|[0-9]{1,4})$")
_DEVICE_KEY_HELP = 'a GPU/MIG UUID ("GPU-…", "MIG-…") or an index ("0", "1", …) into the sorted devices'


def _quantity(value: Any) -> Any:
    """Quantities arrive as strings ("10Gi") or, from JSON, as integers (bytes); keep them as strings."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise PydanticCustomError(
            "config", "must be {help}; got {kind}", {"help": QUANTITY_HELP, "kind": type(value).__name__}
        )
    try:
        num_bytes = parse_quantity(value)
    except QuantityError:
        raise PydanticCustomError(
            "config", "{value} is not {help}", {"value": repr(value), "help": QUANTITY_HELP}
        ) from None
    if num_bytes < MIB:
        # MPS takes pinned-memory limits in whole MiB; 0 would mean "no memory at all", not "unlimited".
        raise PydanticCustomError(
            "config",
            "must be at least 1Mi (MPS limits are set in whole MiB); got {value}",
            {"value": repr(value)},
        )
    return value


_QUANTITY_SCHEMA = {
    "anyOf": [
        {
            "type": "string",
            "pattern": r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$",
        },
        {"type": "integer", "minimum": MIB},
    ],
    "description": "Kubernetes quantity, at least 1Mi",
}
Quantity = Annotated[str, BeforeValidator(_quantity), WithJsonSchema(_QUANTITY_SCHEMA)]


class _StrictModel(BaseModel):
    # defer_build: schemas are built at first use, not at import (see dra_gpu.config.names for why)
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)

    def to_dict(self) -> dict[str, Any]:
        """Wire form (camelCase, unset fields left out), e.g. for the checkpoint."""
        return self.model_dump(mode="json", exclude_none=True)


class TimeSlicingConfig(_StrictModel):
    interval: TimeSliceInterval | None = Field(
        default=None, description="CUDA time-slice length: Default, Short, Medium or Long."
    )


class MpsConfig(_StrictModel):
    defaultActiveThreadPercentage: int | None = Field(
        default=None, ge=0, le=100, description="Share of the SMs each MPS client may use, percent (0..100)."
    )
    defaultPinnedDeviceMemoryLimit: Quantity | None = Field(
        default=None, description="Pinned device memory limit for every device of the claim."
    )
    defaultPerDevicePinnedMemoryLimit: dict[str, Quantity] | None = Field(
        default=None,
        description="Per-device pinned memory limit, keyed by UUID or by index into the sorted UUIDs; "
        "overrides defaultPinnedDeviceMemoryLimit for that device.",
    )
    multiUser: bool | None = Field(
        default=None,
        description="Start the MPS control daemon in multi-user mode (`-M`): clients running as different "
        "uids may share it (as in NVIDIA's driver; Volta or newer).",
    )

    @field_validator("defaultPerDevicePinnedMemoryLimit", mode="before")
    @classmethod
    def _check_device_keys(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            for key in value:
                if not isinstance(key, str) or not _DEVICE_KEY_RE.match(key):
                    raise PydanticCustomError(
                        "config", "key {key} is not {help}", {"key": repr(key), "help": _DEVICE_KEY_HELP}
                    )
        return value

    def pinned_memory_limits(
        self,
        uuids: Sequence[str],
        memory_bytes: Mapping[str, int],
        field_prefix: str = "sharing.mpsConfig",
        clamped: list[str] | None = None,
    ) -> dict[str, int]:
        """Resolve the limits for the allocated devices: UUID -> bytes (rounded down to whole MiB).

        `uuids` are the devices MPS runs on (indices refer to them sorted); `memory_bytes`: each one's memory.
        Raises ConfigError for a key that names no allocated device. A limit larger than its device is
        clamped to the device's memory (NVIDIA's driver accepts such a limit; it cannot be reached anyway),
        with one message per clamped device appended to `clamped` for the caller to report.
        """
        ordered = sorted(uuids)
        limits: dict[str, int] = {}
        errors: list[ConfigError] = []
        if self.defaultPinnedDeviceMemoryLimit is not None:
            default = parse_quantity(self.defaultPinnedDeviceMemoryLimit)
            for uuid in ordered:
                limits[uuid] = default
        for key, text in (self.defaultPerDevicePinnedMemoryLimit or {}).items():
            path = f"{field_prefix}.defaultPerDevicePinnedMemoryLimit[{key!r}]"
            if key.isdigit():
                index = int(key)
                if index >= len(ordered):
                    reason = (
                        f"index {index} is out of range: the claim has {len(ordered)} device(s) here, "
                        f"indices 0..{len(ordered) - 1}"
                    )
                    errors.append(ConfigError(path, reason))
                    continue
                uuid = ordered[index]
            elif key in ordered:
                uuid = key
            else:
                reason = f"{key} is not one of the allocated devices ({', '.join(ordered)})"
                errors.append(ConfigError(path, reason))
                continue
            limits[uuid] = parse_quantity(text)
        if errors:
            raise ConfigError.combine(errors)
        for uuid, limit in limits.items():
            total = memory_bytes.get(uuid)
            if total is not None and limit > total:
                which = (
                    "defaultPerDevicePinnedMemoryLimit"
                    if self._per_device_names(uuid, ordered)
                    else "defaultPinnedDeviceMemoryLimit"
                )
                limits[uuid] = total
                if clamped is not None:
                    clamped.append(
                        f"{field_prefix}.{which}: limit {format_bytes(limit)} is larger than device {uuid} "
                        f"({format_bytes(total)}); clamped to {format_bytes(total - total % MIB)}"
                    )
        return {uuid: limit - limit % MIB for uuid, limit in limits.items()}

    def _per_device_names(self, uuid: str, ordered: Sequence[str]) -> bool:
        keys = set(self.defaultPerDevicePinnedMemoryLimit or {})
        return uuid in keys or str(ordered.index(uuid)) in keys


class GpuSharing(_StrictModel):
    strategy: SharingStrategy = Field(description="TimeSlicing or MPS.")
    timeSlicingConfig: TimeSlicingConfig | None = None
    mpsConfig: MpsConfig | None = None


class MigDeviceSharing(_StrictModel):
    # A MIG device has no time-slice setting of its own: processes sharing one MIG device are time-sliced by
    # default, so "TimeSlicing" here means "share it that way", with nothing to configure.
    strategy: SharingStrategy = Field(description="TimeSlicing or MPS.")
    mpsConfig: MpsConfig | None = None


def _check_strategy_fields(sharing: GpuSharing | MigDeviceSharing) -> list[ConfigError]:
    errors: list[ConfigError] = []
    has_ts = isinstance(sharing, GpuSharing) and sharing.timeSlicingConfig is not None
    if has_ts and sharing.strategy != "TimeSlicing":
        reason = f"only allowed with strategy TimeSlicing, but strategy is {sharing.strategy}"
        errors.append(ConfigError("sharing.timeSlicingConfig", reason))
    if sharing.mpsConfig is not None and sharing.strategy != "MPS":
        errors.append(
            ConfigError(
                "sharing.mpsConfig", f"only allowed with strategy MPS, but strategy is {sharing.strategy}"
            )
        )
    return errors


class GpuConfig(_StrictModel):
    """Configuration for full GPUs (and fractional GPU shares)."""

    apiVersion: Literal["resource.nvidia.com/v1beta1"] = API_VERSION
    kind: Literal["GpuConfig"] = GPU_CONFIG_KIND
    sharing: GpuSharing | None = None

    def validate_semantics(self) -> None:
        if self.sharing is not None and (errors := _check_strategy_fields(self.sharing)):
            raise ConfigError.combine(errors)

    def normalize(self) -> GpuConfig:
        """Fill implied defaults: TimeSlicing without interval means Default; MPS without mpsConfig, {}."""
        sharing = self.sharing
        if sharing is None:
            return self
        ts = sharing.timeSlicingConfig
        if sharing.strategy == "TimeSlicing" and (ts is None or ts.interval is None):
            sharing = sharing.model_copy(update={"timeSlicingConfig": TimeSlicingConfig(interval="Default")})
        if sharing.strategy == "MPS" and sharing.mpsConfig is None:
            sharing = sharing.model_copy(update={"mpsConfig": MpsConfig()})
        return self.model_copy(update={"sharing": sharing})

    @property
    def strategy(self) -> SharingStrategy | None:
        return self.sharing.strategy if self.sharing else None

    @property
    def time_slice_interval(self) -> TimeSliceInterval | None:
        """The interval when TimeSlicing was asked for (Default when left out), else None."""
        if self.sharing is None or self.sharing.strategy != "TimeSlicing":
            return None
        ts = self.sharing.timeSlicingConfig
        return ts.interval if ts is not None and ts.interval is not None else "Default"

    @property
    def mps_config(self) -> MpsConfig | None:
        if self.sharing is None or self.sharing.strategy != "MPS":
            return None
        return self.sharing.mpsConfig or MpsConfig()


class MigDeviceConfig(_StrictModel):
    """Configuration for MIG devices (static or created on demand)."""

    apiVersion: Literal["resource.nvidia.com/v1beta1"] = API_VERSION
    kind: Literal["MigDeviceConfig"] = MIG_DEVICE_CONFIG_KIND
    sharing: MigDeviceSharing | None = None

    def validate_semantics(self) -> None:
        if self.sharing is not None and (errors := _check_strategy_fields(self.sharing)):
            raise ConfigError.combine(errors)

    def normalize(self) -> MigDeviceConfig:
        if self.sharing is not None and self.sharing.strategy == "MPS" and self.sharing.mpsConfig is None:
            sharing = self.sharing.model_copy(update={"mpsConfig": MpsConfig()})
            return self.model_copy(update={"sharing": sharing})
        return self

    @property
    def strategy(self) -> SharingStrategy | None:
        return self.sharing.strategy if self.sharing else None

    @property
    def time_slice_interval(self) -> TimeSliceInterval | None:
        return None  # MIG devices have no time-slice setting (see MigDeviceSharing)

    @property
    def mps_config(self) -> MpsConfig | None:
        if self.sharing is None or self.sharing.strategy != "MPS":
            return None
        return self.sharing.mpsConfig or MpsConfig()


DeviceConfig: TypeAlias = GpuConfig | MigDeviceConfig


def config_settings(config: DeviceConfig | None) -> dict[str, Any]:
    """What a config asks of a device, to compare two configs as NVIDIA's driver does (normalized, then equal
    or not): the normalized wire form without `apiVersion` and `kind`, so that no config and the default
    config both give {}."""
    if config is None:
        return {}
    return {k: v for k, v in config.normalize().to_dict().items() if k not in ("apiVersion", "kind")}


_MODELS: Mapping[str, type[GpuConfig] | type[MigDeviceConfig]] = {
    GPU_CONFIG_KIND: GpuConfig,
    MIG_DEVICE_CONFIG_KIND: MigDeviceConfig,
}


def decode_opaque_config(parameters: Mapping[str, Any]) -> DeviceConfig:
    """Strictly decode, validate and normalize the `parameters` of an opaque config for `gpu.nvidia.com`.

    Raises ConfigError naming the field path and the allowed values.
    """
    if not isinstance(parameters, Mapping):
        got = type(parameters).__name__
        raise ConfigError("parameters", f"must be an object with apiVersion and kind; got {got}")
    api_version = parameters.get("apiVersion")
    kind = parameters.get("kind")
    allowed_versions = ", ".join(SUPPORTED_API_VERSIONS)
    if api_version is None:
        raise ConfigError("apiVersion", f"required; allowed: {allowed_versions}")
    if not isinstance(api_version, str) or api_version not in SUPPORTED_API_VERSIONS:
        raise ConfigError("apiVersion", f"{api_version!r} is not supported; allowed: {allowed_versions}")
    if kind is None:
        raise ConfigError("kind", f"required; allowed: {', '.join(SUPPORTED_KINDS)}")
    if not isinstance(kind, str) or kind not in _MODELS:
        allowed_kinds = ", ".join(SUPPORTED_KINDS)
        raise ConfigError("kind", f"{kind!r} is not supported by this driver; allowed: {allowed_kinds}")
    renamed: dict[str, str] = {}
    data: Mapping[str, Any] = parameters
    if api_version == LEGACY_API_VERSION:
        data, renamed = _convert_legacy(parameters)
    model = _MODELS[str(kind)]
    try:
        config: DeviceConfig = model.model_validate(dict(data))
    except ValidationError as exc:
        raise _config_error(exc, model, renamed) from None
    config.validate_semantics()
    return config.normalize()


def _convert_legacy(parameters: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """`gpu.nvidia.com/v1alpha1` -> v1beta1: same shape, but early versions called `interval` `timeSlice`."""
    data = dict(parameters)
    data["apiVersion"] = API_VERSION
    renamed: dict[str, str] = {}
    sharing = data.get("sharing")
    if isinstance(sharing, Mapping):
        sharing = dict(sharing)
        ts = sharing.get("timeSlicingConfig")
        if isinstance(ts, Mapping) and "timeSlice" in ts:
            ts = dict(ts)
            if "interval" in ts:
                raise ConfigError(
                    "sharing.timeSlicingConfig",
                    "set either interval or its deprecated name timeSlice, not both",
                )
            ts["interval"] = ts.pop("timeSlice")
            renamed["interval"] = "timeSlice"
            sharing["timeSlicingConfig"] = ts
        data["sharing"] = sharing
    log.warning(
        "deprecated opaque config apiVersion",
        api_version=LEGACY_API_VERSION,
        kind=parameters.get("kind"),
        replacement=API_VERSION,
        note="converted; a config without sharing no longer implies time-slicing"
        if parameters.get("sharing") is None
        else "converted",
    )
    return data, renamed


# ---- pydantic errors -> one clear message per field --------------------------------------------------------


def _config_error(exc: ValidationError, model: type[BaseModel], renamed: Mapping[str, str]) -> ConfigError:
    errors = [_one_error(err, model, renamed) for err in exc.errors(include_url=False)]
    return ConfigError.combine(errors)


def _one_error(err: Any, model: type[BaseModel], renamed: Mapping[str, str]) -> ConfigError:
    loc: tuple[str | int, ...] = tuple(err["loc"])
    if loc and loc[-1] == "[key]":  # pydantic marks an invalid dict key this way
        loc = loc[:-2] if len(loc) >= 2 else ()
    path = _format_path(loc, renamed)
    kind = err["type"]
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "config":
        return ConfigError(path, str(err["msg"]))
    if kind == "extra_forbidden" and model is MigDeviceConfig and loc == ("sharing", "timeSlicingConfig"):
        reason = (
            "MigDeviceConfig has no timeSlicingConfig: processes that share a MIG device are time-sliced by "
            "default and there is no interval to set; remove timeSlicingConfig (strategy TimeSlicing alone "
            "is accepted)"
        )
        return ConfigError(path, reason)
    if kind == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        allowed = ", ".join(parent.model_fields) if parent is not None else "see the API reference"
        return ConfigError(path, f"unknown field; allowed fields here: {allowed}")
    if kind == "missing":
        return ConfigError(path, "required field is missing")
    if kind == "literal_error":
        return ConfigError(path, f"{value!r} is not allowed; allowed values: {ctx.get('expected', '')}")
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        return ConfigError(path, f"must be an integer from 0 to 100; got {value!r}")
    expected = _EXPECTED_TYPES.get(kind)
    if expected is not None:
        return ConfigError(path, f"must be {expected}; got {_type_name(value)} {value!r}"[:300])
    return ConfigError(path, str(err.get("msg", "invalid value")))


_EXPECTED_TYPES = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "string_type": "a string",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "dict_type": "an object (map)",
}


def _type_name(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}
    return names.get(type(value), type(value).__name__)


def _format_path(loc: Sequence[str | int], renamed: Mapping[str, str]) -> str:
    parts: list[str] = []
    previous: str | int | None = None
    for item in loc:
        if previous == "defaultPerDevicePinnedMemoryLimit":
            parts[-1] += f"[{item!r}]"
        elif isinstance(item, int):
            parts[-1 if parts else 0 :] = [f"{parts[-1] if parts else ''}[{item}]"]
        else:
            parts.append(renamed.get(item, item))
        previous = item
    return ".".join(parts)


def _model_at(model: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The model class that sits at `loc` inside `model` (for listing the allowed fields)."""
    current: type[BaseModel] = model
    for item in loc:
        field = current.model_fields.get(str(item))
        if field is None:
            return None
        nested = _model_in(field.annotation)
        if nested is None:
            return None
        current = nested
    return current


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
