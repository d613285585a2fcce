"""`--feature-gates` of the kubelet plugin and the webhook: NVIDIA's gate names, in NVIDIA's form
(`NAME=true,NAME=false,`). The webhook reads them for one thing: the sharing strategies refused below are
refused at admission too, with the same message (`refused_sharing_strategies`).

Every gate of NVIDIA's driver (kubernetes-sigs/dra-driver-nvidia-gpu `pkg/featuregates`, plus the logging
gates of Kubernetes' component-base it registers next to them) is accepted, so NVIDIA's `featureGates`
settings work unchanged. Each has one of four kinds:

- FEATURE: a feature dra-gpu has. The gate switches it as NVIDIA's does. NVIDIA keeps these alpha and off by
  default; here they are on by default (dra-gpu ships them as stable), so only `=false` changes anything:
  - TimeSlicingSettings=false: a claim whose config asks for strategy TimeSlicing is refused at prepare.
  - MPSSupport=false: a claim whose config asks for strategy MPS is refused at prepare (the fractional
    `gpu-share.nvidia.com` shares, enforced with MPS without any config, are not NVIDIA's MPS configs and
    stay).
  - DynamicMIG=false: only MIG devices that exist are published (static MIG); no MIG device is made at
    prepare.
  - NVMLDeviceHealthCheck=false: no NVML health monitor, no device taints (as `--device-health-check=false`).
  - ConsumableShares=false: `--consumable-shares` other than `disabled` stops the plugin, as NVIDIA's does.
- CLUSTER: DRAListTypeAttributes (off by default, as there) publishes list-typed attributes as lists; only
  where the cluster has the Kubernetes gate of the same name.
- UNSUPPORTED: a feature dra-gpu does not have (PassthroughSupport, DeviceMetadata,
  FabricManagerPartitioning). `=false` (NVIDIA's default, and what dra-gpu does) is accepted; `=true` stops
  the plugin with a message.
- NO_EFFECT: gates NVIDIA's GPU kubelet plugin registers but does not read either: those of its ComputeDomain
  (IMEX) components, which dra-gpu does not have, and the klog logging gates (dra-gpu logs with structlog).
  Accepted at any value and named in a start-up log line, so that nobody thinks they did something.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_gpu.sharing.interface import AllocatedDevice, GroupResult, SharingError, SharingManager

# NVIDIA's gate names (pkg/featuregates/featuregates.go).
TIME_SLICING_SETTINGS = "TimeSlicingSettings"
MPS_SUPPORT = "MPSSupport"
DYNAMIC_MIG = "DynamicMIG"
NVML_DEVICE_HEALTH_CHECK = "NVMLDeviceHealthCheck"
CONSUMABLE_SHARES = "ConsumableShares"
DRA_LIST_TYPE_ATTRIBUTES = "DRAListTypeAttributes"
PASSTHROUGH_SUPPORT = "PassthroughSupport"


class GateKind(enum.Enum):
    FEATURE = "feature"
    CLUSTER = "cluster"
    UNSUPPORTED = "unsupported"
    NO_EFFECT = "no-effect"


@dataclass(frozen=True)
class Gate:
    kind: GateKind
    default: bool  # dra-gpu's default
    nvidia_default: bool
    why: str  # what it does here, for messages


_COMPUTE_DOMAIN_ONLY = "read only by NVIDIA's ComputeDomain (IMEX) components, which dra-gpu does not have"
_KLOG_ONLY = "a klog option of Kubernetes' component-base; dra-gpu logs with structlog (see --log-verbosity)"

GATES: dict[str, Gate] = {
    TIME_SLICING_SETTINGS: Gate(
        GateKind.FEATURE, True, False, "false refuses claims whose config asks for strategy TimeSlicing"
    ),
    MPS_SUPPORT: Gate(
        GateKind.FEATURE, True, False, "false refuses claims whose config asks for strategy MPS"
    ),
    DYNAMIC_MIG: Gate(
        GateKind.FEATURE, True, False, "false publishes only existing MIG devices and creates none at prepare"
    ),
    NVML_DEVICE_HEALTH_CHECK: Gate(
        GateKind.FEATURE, True, False, "false turns off the NVML device health monitor and its taints"
    ),
    CONSUMABLE_SHARES: Gate(
        GateKind.FEATURE, True, False, "false makes any --consumable-shares mode but 'disabled' an error"
    ),
    DRA_LIST_TYPE_ATTRIBUTES: Gate(
        GateKind.CLUSTER,
        False,
        False,
        "publish list-typed attributes as lists (the cluster needs the gate too)",
    ),
    PASSTHROUGH_SUPPORT: Gate(
        GateKind.UNSUPPORTED,
        False,
        False,
        "VFIO passthrough (vfio.gpu.nvidia.com devices) is not supported by dra-gpu",
    ),
    "DeviceMetadata": Gate(
        GateKind.UNSUPPORTED,
        False,
        False,
        "device metadata files need PassthroughSupport in NVIDIA's driver; not supported by dra-gpu",
    ),
    "FabricManagerPartitioning": Gate(
        GateKind.UNSUPPORTED,
        False,
        False,
        "Fabric Manager (NVSwitch) partitions are not supported by dra-gpu (no gpuModuleID/partitionN "
        "attributes, no partition activation at prepare)",
    ),
    "IMEXDaemonsWithDNSNames": Gate(GateKind.NO_EFFECT, True, True, _COMPUTE_DOMAIN_ONLY),
    "ComputeDomainCliques": Gate(GateKind.NO_EFFECT, True, True, _COMPUTE_DOMAIN_ONLY),
    "CrashOnNVLinkFabricErrors": Gate(GateKind.NO_EFFECT, True, True, _COMPUTE_DOMAIN_ONLY),
    "HostManagedIMEXDaemon": Gate(GateKind.NO_EFFECT, False, False, _COMPUTE_DOMAIN_ONLY),
    "ContextualLogging": Gate(GateKind.NO_EFFECT, True, True, _KLOG_ONLY),
    "LoggingAlphaOptions": Gate(GateKind.NO_EFFECT, False, False, _KLOG_ONLY),
    "LoggingBetaOptions": Gate(GateKind.NO_EFFECT, True, True, _KLOG_ONLY),
}

# name -> dra-gpu's default (kept for callers that only need the values)
KNOWN_GATES: dict[str, bool] = {name: gate.default for name, gate in GATES.items()}


def _given(text: str | None) -> dict[str, bool]:
    given: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or value.strip().lower() not in ("true", "false"):
            raise ValueError(f"--feature-gates {item!r}: expected NAME=true or NAME=false")
        if name not in GATES:
            raise ValueError(f"--feature-gates {name!r}: unknown gate; known: {', '.join(GATES)}")
        given[name] = value.strip().lower() == "true"
    return given


def parse_feature_gates(text: str | None) -> dict[str, bool]:
    """Every known gate with its value; ValueError names the bad entry (malformed, unknown, or a feature
    dra-gpu does not have switched on) and the fix."""
    given = _given(text)
    for name, value in given.items():
        gate = GATES[name]
        if gate.kind is GateKind.UNSUPPORTED and value:
            raise ValueError(
                f"--feature-gates {name}=true: {gate.why}; remove it or set {name}=false (env FEATURE_GATES, "
                "chart value featureGates)"
            )
    return {**KNOWN_GATES, **given}


def no_effect_notes(text: str | None) -> list[str]:
    """One line per gate that was given but does nothing here (NO_EFFECT), for the start-up log."""
    return [
        f"feature gate {name}={str(value).lower()} has no effect: {GATES[name].why}"
        for name, value in _given(text).items()
        if GATES[name].kind is GateKind.NO_EFFECT
    ]


def check_consumable_shares(gates: Mapping[str, bool], mode: str) -> None:
    """NVIDIA's rule: a consumable-shares mode needs the ConsumableShares gate (on by default here)."""
    if (mode or "disabled") != "disabled" and not gates[CONSUMABLE_SHARES]:
        raise ValueError(
            f"--consumable-shares {mode} requires feature gate {CONSUMABLE_SHARES} to be enabled (it is "
            f"set to false in --feature-gates); drop {CONSUMABLE_SHARES}=false or set --consumable-shares "
            "disabled"
        )


# The sharing strategies of NVIDIA's opaque configs that a gate can switch off, with that gate.
SHARING_STRATEGY_GATES: dict[str, str] = {"TimeSlicing": TIME_SLICING_SETTINGS, "MPS": MPS_SUPPORT}


def refused_sharing_strategies(gates: Mapping[str, bool]) -> dict[str, str]:
    """strategy -> NVIDIA's message, for each sharing strategy whose gate is off. One text for both places
    that refuse such a config: the kubelet plugin at prepare and the webhook at admission (both get the
    chart's featureGates)."""
    return {
        strategy: f"{strategy!r} is selected as the GPU sharing strategy, but the {gate!r} feature gate is "
        f"not enabled ({gate}=false in --feature-gates, the chart's featureGates)"
        for strategy, gate in SHARING_STRATEGY_GATES.items()
        if not gates[gate]
    }


class FeatureGatedSharing:
    """The sharing manager with NVIDIA's TimeSlicingSettings / MPSSupport gates in front of prepare: a
    group whose config asks for a strategy whose gate is off is refused with NVIDIA's message before anything
    is touched. The rest of the protocol goes to the wrapped manager unchanged."""

    def __init__(self, inner: SharingManager, gates: Mapping[str, bool]) -> None:
        self._inner = inner
        self._refused = refused_sharing_strategies(gates)

    def prepare_group(
        self, claim_uid: str, config: object | None, devices: Sequence[AllocatedDevice]
    ) -> GroupResult:
        strategy = getattr(config, "strategy", None)
        if isinstance(strategy, str) and strategy in self._refused:
            raise SharingError(self._refused[strategy])
        return self._inner.prepare_group(claim_uid, config, devices)

    def unprepare_group(self, claim_uid: str, state: Mapping[str, Any]) -> None:
        self._inner.unprepare_group(claim_uid, state)  # what was prepared is always undone, gate or not

    def destroy_unowned_mig(self, owned: set[tuple[str, int, int]]) -> list[str]:
        return self._inner.destroy_unowned_mig(owned)

    def release_unowned_time_slices(
        self, owned_states: Mapping[str, Iterable[Mapping[str, Any]]]
    ) -> list[str]:
        return self._inner.release_unowned_time_slices(owned_states)

    def stop_unowned_mps(self, owned_states: Iterable[Mapping[str, Any]]) -> list[str]:
        return self._inner.stop_unowned_mps(owned_states)

    def revive_mps(self, owned_states: Iterable[Mapping[str, Any]]) -> list[str]:
        return self._inner.revive_mps(owned_states)
