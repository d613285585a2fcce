"""Admission decisions for objects that carry opaque configs for `gpu.nvidia.com` (pure, no I/O).

ResourceClaims (`spec.devices.config`), ResourceClaimTemplates (`spec.spec.devices.config`) and DeviceClasses
(`spec.config`) hold `{opaque: {driver, parameters}}` entries in all served shapes (`resource.k8s.io` v1,
v1beta1, v1beta2 agree on where config lives). Every entry whose driver is ours is decoded with the same
`decode_opaque_config` the kubelet plugin uses, so what is admitted here is what Prepare accepts. Entries for
other drivers are skipped, as the DRA API requires.

A sharing strategy whose feature gate is off (TimeSlicingSettings=false, MPSSupport=false: the webhook gets
the chart's featureGates, as the plugin does) would be refused at prepare; `refused_strategies` maps each such
strategy to the plugin's message, so that the claim is refused at admission with it instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_gpu.config.api import decode_opaque_config
from dra_gpu.config.names import API_VERSION, LEGACY_API_VERSION, ConfigError
from dra_gpu.inventory.model import DRIVER_NAME

ADMISSION_API_VERSION = "admission.k8s.io/v1"
RESOURCE_GROUP = "resource.k8s.io"

# kind -> path from the object root to its config list
CONFIG_PATHS: Mapping[str, tuple[str, ...]] = {
    "ResourceClaim": ("spec", "devices", "config"),
    "ResourceClaimTemplate": ("spec", "spec", "devices", "config"),
    "DeviceClass": ("spec", "config"),
}


@dataclass(frozen=True)
class Problem:
    """One rejected opaque config: where it is and why."""

    path: str  # "spec.devices.config[1].opaque.parameters.sharing.strategy"
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def object_label(kind: str, obj: Mapping[str, Any]) -> str:
    """`ResourceClaim ns/name` (or `DeviceClass name`), as a user would look the object up."""
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    assert isinstance(metadata, Mapping)
    generated = f"{metadata.get('generateName')}*" if metadata.get("generateName") else "<unnamed>"
    name = metadata.get("name") or generated
    namespace = metadata.get("namespace")
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def check_object(
    kind: str, obj: Mapping[str, Any], refused_strategies: Mapping[str, str] | None = None
) -> list[Problem]:
    """Every problem with the object's opaque configs for our driver; [] when all are fine or it has none.
    `refused_strategies`: sharing strategy -> why it is refused (its feature gate is off)."""
    path = CONFIG_PATHS.get(kind)
    if path is None:
        return []
    node: Any = obj
    for step in path:
        if not isinstance(node, Mapping):
            return []  # structure errors are the apiserver's business (it validates the schema)
        node = node.get(step)
    if node is None:
        return []
    prefix = ".".join(path)
    if not isinstance(node, list):
        return [Problem(prefix, "must be a list")]
    problems: list[Problem] = []
    for index, entry in enumerate(node):
        where = f"{prefix}[{index}]"
        opaque = entry.get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != DRIVER_NAME:
            continue
        parameters = opaque.get("parameters")
        if parameters is None:
            problems.append(Problem(f"{where}.opaque.parameters", "required for driver gpu.nvidia.com"))
            continue
        try:
            config = decode_opaque_config(parameters)
        except ConfigError as err:
            problems.extend(_problems_from(err, f"{where}.opaque.parameters"))
            continue
        strategy = getattr(config, "strategy", None)
        if refused_strategies and isinstance(strategy, str) and strategy in refused_strategies:
            problems.append(
                Problem(f"{where}.opaque.parameters.sharing.strategy", refused_strategies[strategy])
            )
    return problems


def _our_configs(kind: str, obj: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(path, parameters) of every opaque config entry for our driver."""
    node: Any = obj
    for step in CONFIG_PATHS.get(kind, ()):
        node = node.get(step) if isinstance(node, Mapping) else None
    if not isinstance(node, list):
        return []
    prefix = ".".join(CONFIG_PATHS[kind])
    return [
        (f"{prefix}[{i}].opaque.parameters", e["opaque"].get("parameters"))
        for i, e in enumerate(node)
        if isinstance(e, Mapping)
        and isinstance(e.get("opaque"), Mapping)
        and e["opaque"].get("driver") == DRIVER_NAME
    ]


def deprecation_warnings(kind: str, obj: Mapping[str, Any]) -> list[str]:
    """Admission warnings (kubectl prints them) for configs that use the deprecated API version."""
    return [
        f"{path}: apiVersion {LEGACY_API_VERSION} is deprecated; use {API_VERSION} (same fields, "
        "timeSlicingConfig.timeSlice is now interval)"
        for path, parameters in _our_configs(kind, obj)
        if isinstance(parameters, Mapping) and parameters.get("apiVersion") == LEGACY_API_VERSION
    ]


def _problems_from(err: ConfigError, prefix: str) -> list[Problem]:
    # "parameters" is how the decoder names the whole object; the prefix already ends with it.
    return [
        Problem(f"{prefix}.{field}" if field not in ("", "parameters") else prefix, reason)
        for field, reason in err.problems
    ]


def review(
    request_body: Mapping[str, Any], refused_strategies: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Answer one AdmissionReview (admission.k8s.io/v1). Raises ValueError for a body that is not one.
    `refused_strategies`: as in `check_object`."""
    if request_body.get("kind") != "AdmissionReview":
        raise ValueError("body is not an AdmissionReview")
    request = request_body.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise ValueError("AdmissionReview has no request.uid")
    uid = request["uid"]
    obj = request.get("object")
    kind_info = request.get("kind") if isinstance(request.get("kind"), Mapping) else {}
    assert isinstance(kind_info, Mapping)
    kind = str(kind_info.get("kind") or (obj.get("kind") if isinstance(obj, Mapping) else "") or "")
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if _needs_validation(request) and isinstance(obj, Mapping):
        problems = check_object(kind, obj, refused_strategies)
        warnings = deprecation_warnings(kind, obj)
        if warnings:
            response["warnings"] = warnings
        if problems:
            message = deny_message(object_label(kind, obj), problems)
            response = {
                "uid": uid,
                "allowed": False,
                "status": {"code": 422, "reason": "Invalid", "message": message},
            }
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response}


def _needs_validation(request: Mapping[str, Any]) -> bool:
    """CREATE always; UPDATE only when the spec changed.

    An UPDATE that leaves the spec alone (a finalizer removed, a label or annotation added, the deletion
    bookkeeping) must pass even when the stored config is invalid by today's rules: refusing it would leave
    an object that can never be deleted. The chart's matchConditions already keep such updates away; this is
    the second guard for a configuration that lacks them (an older chart, a hand-written one).
    """
    operation = request.get("operation")
    if operation == "CREATE":
        return True
    if operation != "UPDATE":
        return False
    old, new = request.get("oldObject"), request.get("object")
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return True  # no old object to compare with: validate as before
    return bool(old.get("spec") != new.get("spec"))


def deny_message(label: str, problems: list[Problem]) -> str:
    noun = "opaque config" if len(problems) == 1 else "opaque configs"
    return f"{label}: invalid {noun} for driver {DRIVER_NAME}: " + "; ".join(str(p) for p in problems)
