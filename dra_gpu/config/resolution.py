"""Which opaque config applies to which allocated device (pure).

Rules (Kubernetes convention shared by NVIDIA's driver and dra-example-driver, k8s-dra-api §4.5 and
nvidia-conventions §6.6):
- Only `opaque` entries for our driver count; class configs (`FromClass`) come before claim configs
  (`FromClaim`), each in list order; a later entry has higher precedence.
- For each allocation result the entries are walked from the highest precedence down; the first entry whose
  `requests` is empty or names the result's request wins. A result of a `firstAvailable` subrequest
  (`req/sub`) is also matched by an entry naming the parent request `req`.
- A winning entry of the wrong kind for the device (a `GpuConfig` for a MIG device, a `MigDeviceConfig` for a
  GPU) is an error when the entry names the request, and skipped when it applies to all requests.
- Results without a winning entry get the default (`None`: no sharing setting is applied).
Results that share one winning entry form one group; each group is prepared once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dra_gpu.config.names import GPU_CONFIG_KIND, MIG_DEVICE_CONFIG_KIND, ConfigError
from dra_gpu.inventory.model import DRIVER_NAME, DeviceKind

if TYPE_CHECKING:  # the models load with the first config a claim carries (dra_gpu.config.names)
    from dra_gpu.config.api import DeviceConfig

SOURCE_ORDER = ("FromClass", "FromClaim")
_KIND_FOR_CONFIG: Mapping[str, frozenset[DeviceKind]] = {  # by the config's `kind`
    GPU_CONFIG_KIND: frozenset({DeviceKind.GPU, DeviceKind.GPU_SHARE}),
    MIG_DEVICE_CONFIG_KIND: frozenset({DeviceKind.MIG_STATIC, DeviceKind.MIG_DYNAMIC}),
}
_CONFIG_FOR_KIND = {
    DeviceKind.GPU: "GpuConfig",
    DeviceKind.GPU_SHARE: "GpuConfig",
    DeviceKind.MIG_STATIC: "MigDeviceConfig",
    DeviceKind.MIG_DYNAMIC: "MigDeviceConfig",
}


class ConfigResolutionError(ValueError):
    """The claim's configs cannot be applied; the message names the config entry, the device and the fix."""


@dataclass(frozen=True)
class ResultRef:
    """What resolution needs to know about one allocation result of our driver."""

    request: str  # "req" or "req/sub"
    device: str
    kind: DeviceKind


@dataclass(frozen=True)
class ConfigEntry:
    """One opaque config of our driver, decoded, at its precedence position."""

    position: int  # index in precedence order (0 = lowest)
    source: str  # "FromClass" | "FromClaim"
    requests: tuple[str, ...]
    config: DeviceConfig

    def describe(self) -> str:
        scope = f"requests {list(self.requests)}" if self.requests else "all requests"
        return f"config #{self.position} ({self.source}, {scope}, {type(self.config).__name__})"


@dataclass(frozen=True)
class ConfigGroup:
    """Results (indices into the input) that share one winning config; `entry` None means defaults."""

    entry: ConfigEntry | None
    results: tuple[int, ...]

    @property
    def config(self) -> DeviceConfig | None:
        return None if self.entry is None else self.entry.config


def ordered_config_entries(
    raw_configs: Sequence[Mapping[str, Any]],
    *,
    driver: str = DRIVER_NAME,
    decode: Callable[[Mapping[str, Any]], DeviceConfig] | None = None,
) -> list[ConfigEntry]:
    """Our driver's entries of `status.allocation.devices.config`, lowest precedence first, decoded (by
    `decode_opaque_config` unless `decode` is given)."""
    by_source: dict[str, list[tuple[int, Mapping[str, Any]]]] = {s: [] for s in SOURCE_ORDER}
    for index, raw in enumerate(raw_configs):
        source = str(raw.get("source", "FromClaim"))
        opaque = raw.get("opaque")
        if opaque is None:
            raise ConfigResolutionError(
                f"status.allocation.devices.config[{index}]: no `opaque` member; "
                "only opaque configs are supported"
            )
        if opaque.get("driver") != driver:
            continue  # another driver's config: valid, not ours to interpret
        if source not in by_source:
            raise ConfigResolutionError(
                f"status.allocation.devices.config[{index}].source: {source!r} "
                f"is not one of {list(SOURCE_ORDER)}"
            )
        by_source[source].append((index, raw))
    entries: list[ConfigEntry] = []
    for source in SOURCE_ORDER:
        for index, raw in by_source[source]:
            parameters = raw["opaque"].get("parameters")
            if not isinstance(parameters, Mapping):
                raise ConfigResolutionError(
                    f"status.allocation.devices.config[{index}].opaque.parameters: must be a JSON object "
                    f"(apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig|MigDeviceConfig)"
                )
            if decode is None:
                from dra_gpu.config.api import decode_opaque_config

                decode = decode_opaque_config
            try:
                config = decode(parameters)
            except ConfigError as exc:
                raise ConfigResolutionError(
                    f"status.allocation.devices.config[{index}] ({source}) opaque.parameters: {exc}"
                ) from exc
            requests = tuple(str(r) for r in raw.get("requests") or ())
            entry = ConfigEntry(position=len(entries), source=source, requests=requests, config=config)
            entries.append(entry)
    return entries


def _names_request(requests: tuple[str, ...], request: str) -> bool:
    parent = request.split("/", 1)[0]
    return request in requests or parent in requests


def _applies_to(config: DeviceConfig, kind: DeviceKind) -> bool:
    return kind in _KIND_FOR_CONFIG.get(config.kind, frozenset())


def winning_entry(entries: Sequence[ConfigEntry], result: ResultRef) -> ConfigEntry | None:
    for entry in reversed(entries):
        if entry.requests and not _names_request(entry.requests, result.request):
            continue
        if _applies_to(entry.config, result.kind):
            return entry
        if entry.requests:
            raise ConfigResolutionError(
                f"{entry.describe()} names request {result.request!r}, but device {result.device!r} "
                f"is of type {result.kind.value}: use a {_CONFIG_FOR_KIND[result.kind]} for it"
            )
    return None


def resolve_configs(results: Sequence[ResultRef], entries: Sequence[ConfigEntry]) -> list[ConfigGroup]:
    """Group the results by their winning config. Defaults come first, then configs by precedence."""
    by_entry: dict[int | None, list[int]] = {}
    winners: dict[int, ConfigEntry] = {}
    for index, result in enumerate(results):
        entry = winning_entry(entries, result)
        key = None if entry is None else entry.position
        if entry is not None:
            winners[entry.position] = entry
        by_entry.setdefault(key, []).append(index)
    groups: list[ConfigGroup] = []
    if None in by_entry:
        groups.append(ConfigGroup(entry=None, results=tuple(by_entry.pop(None))))
    for position in sorted(k for k in by_entry if k is not None):
        groups.append(ConfigGroup(entry=winners[position], results=tuple(by_entry[position])))
    return groups
