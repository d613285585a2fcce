"""Parse ResourceClaim specs and DeviceClasses (`resource.k8s.io/v1` shapes) into allocator requests.

Errors name the object and field; CEL selectors are compiled here so that a bad expression is reported with
its position before anything is allocated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_gpu.allocator.model import (
    ClaimSpec,
    Constraint,
    DeviceRequestSpec,
    InputError,
    Request,
    Toleration,
    quantity_of,
)
from dra_gpu.cel.environment import CompiledExpression, compile_selector
from dra_gpu.cel.errors import CelCompileError


@dataclass
class DeviceClassSpec:
    name: str
    selectors: list[CompiledExpression]
    configs: list[Mapping[str, Any]]
    builtin: bool = False
    extended_resource_name: str | None = None  # spec.extendedResourceName (DRAExtendedResource)


def compile_selectors(selectors: Any, where: str) -> list[CompiledExpression]:
    out = []
    for index, selector in enumerate(selectors or ()):
        cel = (selector or {}).get("cel") if isinstance(selector, Mapping) else None
        expression = (cel or {}).get("expression") if isinstance(cel, Mapping) else None
        if not isinstance(expression, str):
            raise InputError(f"{where}.selectors[{index}]: expected {{cel: {{expression: <string>}}}}")
        try:
            out.append(compile_selector(expression))
        except CelCompileError as error:
            raise InputError(
                f"{where}.selectors[{index}].cel.expression: {error.describe()}\n    expression: {expression}"
            ) from None
    return out


def parse_device_class(obj: Mapping[str, Any], builtin: bool = False) -> DeviceClassSpec:
    name = str((obj.get("metadata") or {}).get("name", ""))
    if not name:
        raise InputError("DeviceClass without metadata.name")
    spec = obj.get("spec") or {}
    return DeviceClassSpec(
        name,
        compile_selectors(spec.get("selectors"), f"DeviceClass {name}: spec"),
        [c for c in spec.get("config") or () if isinstance(c, Mapping)],
        builtin,
        str(spec["extendedResourceName"]) if spec.get("extendedResourceName") else None,
    )


def _tolerations(raw: Any, where: str) -> tuple[list[Toleration], list[Mapping[str, Any]]]:
    out = []
    kept: list[Mapping[str, Any]] = []
    for index, item in enumerate(raw or ()):
        if not isinstance(item, Mapping):
            raise InputError(f"{where}.tolerations[{index}]: expected an object")
        operator = str(item.get("operator") or "Equal")
        if operator not in ("Equal", "Exists"):
            raise InputError(f"{where}.tolerations[{index}].operator: {operator!r} is not Equal or Exists")
        out.append(
            Toleration(
                str(item.get("key") or ""),
                operator,
                str(item.get("value") or ""),
                str(item.get("effect") or ""),
            )
        )
        kept.append(dict(item))
    return out, kept


def _device_request(raw: Mapping[str, Any], name: str, where: str, allow_admin: bool) -> DeviceRequestSpec:
    if "deviceClassName" not in raw or not raw.get("deviceClassName"):
        raise InputError(f"{where}.deviceClassName: required")
    mode = str(raw.get("allocationMode") or "ExactCount")
    if mode not in ("ExactCount", "All"):
        raise InputError(f"{where}.allocationMode: {mode!r} is not ExactCount or All")
    count_raw = raw.get("count")
    if mode == "All" and count_raw is not None:
        raise InputError(f"{where}.count: must not be set with allocationMode All")
    count = 1 if count_raw is None else count_raw
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        raise InputError(f"{where}.count: must be a positive integer, got {count_raw!r}")
    admin = raw.get("adminAccess")
    if admin and not allow_admin:
        raise InputError(f"{where}.adminAccess: not allowed in a firstAvailable subrequest")
    tolerations, kept = _tolerations(raw.get("tolerations"), where)
    capacity = (raw.get("capacity") or {}).get("requests") or {}
    if not isinstance(capacity, Mapping):
        raise InputError(f"{where}.capacity.requests: expected a map of quantities")
    return DeviceRequestSpec(
        name=name,
        class_name=str(raw["deviceClassName"]),
        selectors=compile_selectors(raw.get("selectors"), where),
        all_devices=mode == "All",
        count=count,
        admin_access=bool(admin),
        tolerations=tolerations,
        capacity_requests={
            str(k): quantity_of(v, f"{where}.capacity.requests[{k}]") for k, v in capacity.items()
        },
        raw_tolerations=kept,
    )


def parse_claim_spec(spec: Mapping[str, Any], namespace: str, name: str, what: str) -> ClaimSpec:
    """`spec` is a ResourceClaimSpec; `what` names it in messages ("ResourceClaim default/x")."""
    devices = spec.get("devices") or {}
    if not isinstance(devices, Mapping):
        raise InputError(f"{what}: spec.devices must be an object")
    requests: list[Request] = []
    seen: set[str] = set()
    for index, raw in enumerate(devices.get("requests") or ()):
        where = f"{what}: spec.devices.requests[{index}]"
        request_name = str((raw or {}).get("name") or "")
        if not request_name:
            raise InputError(f"{where}.name: required")
        if request_name in seen:
            raise InputError(f"{where}.name: duplicate request name {request_name!r}")
        seen.add(request_name)
        exactly = raw.get("exactly")
        first = raw.get("firstAvailable")
        if "deviceClassName" in raw and exactly is None and first is None:
            raise InputError(
                f"{where}: deviceClassName directly under a request is the v1beta1 shape; "
                f"in resource.k8s.io/v1 "
                f"put it under `exactly:` (exactly: {{deviceClassName: {raw['deviceClassName']}}})"
            )
        if (exactly is None) == (first is None):
            raise InputError(f"{where}: exactly one of `exactly` or `firstAvailable` must be set")
        if exactly is not None:
            requests.append(
                Request(
                    request_name, [_device_request(exactly, request_name, f"{where}.exactly", True)], False
                )
            )
        else:
            subs = []
            sub_names: set[str] = set()
            for sub_index, sub in enumerate(first or ()):
                sub_name = str((sub or {}).get("name") or "")
                sub_where = f"{where}.firstAvailable[{sub_index}]"
                if not sub_name:
                    raise InputError(f"{sub_where}.name: required")
                if sub_name in sub_names:
                    raise InputError(f"{sub_where}.name: duplicate subrequest name {sub_name!r}")
                sub_names.add(sub_name)
                subs.append(_device_request(sub, f"{request_name}/{sub_name}", sub_where, False))
            if not subs:
                raise InputError(f"{where}.firstAvailable: needs at least one subrequest")
            requests.append(Request(request_name, subs, True))
    constraints = []
    for index, raw in enumerate(devices.get("constraints") or ()):
        where = f"{what}: spec.devices.constraints[{index}]"
        names = [str(n) for n in (raw or {}).get("requests") or ()]
        for ref in names:
            if ref.split("/")[0] not in seen:
                raise InputError(f"{where}.requests: {ref!r} is not a request of this claim")
        match = raw.get("matchAttribute")
        distinct = raw.get("distinctAttribute")
        if (match is None) == (distinct is None):
            raise InputError(f"{where}: exactly one of matchAttribute or distinctAttribute must be set")
        attribute = str(match or distinct)
        if "/" not in attribute:
            raise InputError(
                f"{where}: {attribute!r} must be fully qualified (<domain>/<name>), e.g. "
                f"gpu.nvidia.com/{attribute}"
            )
        constraints.append(
            Constraint(names, str(match) if match else None, str(distinct) if distinct else None)
        )
    configs = [c for c in devices.get("config") or () if isinstance(c, Mapping)]
    return ClaimSpec(namespace, name, requests, constraints, configs)


def claim_from_object(obj: Mapping[str, Any]) -> ClaimSpec:
    """A ResourceClaim, or a ResourceClaimTemplate (its spec.spec), as a claim to allocate."""
    kind = obj.get("kind")
    meta = obj.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    name = str(meta.get("name") or "")
    if kind == "ResourceClaimTemplate":
        spec = (obj.get("spec") or {}).get("spec") or {}
        claim = parse_claim_spec(spec, namespace, name, f"ResourceClaimTemplate {namespace}/{name}")
        claim.source = "template"
        return claim
    return parse_claim_spec(obj.get("spec") or {}, namespace, name, f"ResourceClaim {namespace}/{name}")
