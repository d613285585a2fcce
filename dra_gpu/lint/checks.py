"""Manifest checks for `dra-gpu lint` (pure): DeviceClass, ResourceClaim, ResourceClaimTemplate, Pod.

Each finding has the file, the line when known, the object, a message and an optional fix hint.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_gpu.allocator.builtin_classes import BUILTIN_CLASS_TYPES, DRIVER
from dra_gpu.cel.environment import compile_selector
from dra_gpu.cel.errors import CelCompileError
from dra_gpu.cel.release import NEWEST, CelRelease
from dra_gpu.cel.syntax import parse
from dra_gpu.lint.cel_hints import MOVED_ATTRIBUTES, hints
from dra_gpu.lint.manifests import Document, Located

RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_KINDS = {"DeviceClass", "ResourceClaim", "ResourceClaimTemplate", "ResourceSlice", "DeviceTaintRule"}
RESOURCE_VERSIONS = {
    "v1": "GA, served by default",
    "v1beta2": "deprecated, not served by default",
    "v1beta1": "deprecated, not served by default",
    "v1alpha3": "alpha",
}
OTHER_KINDS = {
    "Pod": "v1",
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "DaemonSet": "apps/v1",
    "ReplicaSet": "apps/v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
}


@dataclass
class Finding:
    path: str
    line: int | None
    obj: str  # "ResourceClaim/name"
    message: str
    hint: str | None = None

    def render(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        text = f"{where} {self.obj}: {self.message}"
        return text + (f" (hint: {self.hint})" if self.hint else "")


ConfigDecoder = Callable[[Mapping[str, Any]], Any]


class Linter:
    def __init__(
        self,
        documents: Sequence[Document],
        decode_config: ConfigDecoder | None = None,
        release: CelRelease = NEWEST,
    ):
        self.documents = documents
        self.decode_config = decode_config
        self.release = release  # the Kubernetes minor (and list-attribute gate) CEL is checked against
        self.findings: list[Finding] = []
        self.classes = set(BUILTIN_CLASS_TYPES)
        self.claims: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.templates: dict[tuple[str, str], Mapping[str, Any]] = {}

    # ----------------------------------------------------------------------------------------------------
    def run(self) -> list[Finding]:
        objects = []
        for document in self.documents:
            obj = document.obj
            if not isinstance(obj, Mapping) or not obj.get("kind") or not obj.get("apiVersion"):
                self.findings.append(
                    Finding(
                        document.path,
                        document.line,
                        "?",
                        "not a Kubernetes object: apiVersion and kind are required",
                    )
                )
                continue
            objects.append(document)
            kind = obj["kind"]
            key = (str((obj.get("metadata") or {}).get("namespace") or "default"), self._name(obj))
            if kind == "DeviceClass":
                self.classes.add(self._name(obj))
            elif kind == "ResourceClaim":
                self.claims[key] = obj
            elif kind == "ResourceClaimTemplate":
                self.templates[key] = obj
        for document in objects:
            self._check(document)
        return self.findings

    @staticmethod
    def _name(obj: Mapping[str, Any]) -> str:
        return str((obj.get("metadata") or {}).get("name") or "")

    def _add(
        self, document: Document, node: Any, key: str | None, message: str, hint: str | None = None
    ) -> None:
        line = None
        if isinstance(node, Located):
            line = node.line_of(key) if key is not None else node.line
        obj = document.obj
        label = f"{obj.get('kind')}/{self._name(obj) or '<unnamed>'}"
        self.findings.append(Finding(document.path, line or document.line, label, message, hint))

    # ----------------------------------------------------------------------------------------------------
    def _check(self, document: Document) -> None:
        obj = document.obj
        kind = obj["kind"]
        api_version = str(obj["apiVersion"])
        group, _, version = api_version.rpartition("/")
        if not self._name(obj) and not (obj.get("metadata") or {}).get("generateName"):
            self._add(document, obj, "metadata", "metadata.name is required")
        if group == RESOURCE_GROUP:
            if kind not in RESOURCE_KINDS:
                self._add(
                    document,
                    obj,
                    "kind",
                    f"kind {kind!r} does not exist in {RESOURCE_GROUP}",
                    f"one of {', '.join(sorted(RESOURCE_KINDS))}",
                )
                return
            if version not in RESOURCE_VERSIONS:
                self._add(
                    document, obj, "apiVersion", f"unknown version {api_version!r}", "use resource.k8s.io/v1"
                )
                return
            if version != "v1":
                self._add(
                    document,
                    obj,
                    "apiVersion",
                    f"{api_version} is {RESOURCE_VERSIONS[version]} (Kubernetes 1.34+ serves only v1)",
                    "use apiVersion: resource.k8s.io/v1 (requests nest their fields under `exactly:`)",
                )
                return
        elif kind in RESOURCE_KINDS:
            self._add(
                document,
                obj,
                "apiVersion",
                f"{kind} belongs to {RESOURCE_GROUP}, not {api_version!r}",
                f"apiVersion: {RESOURCE_GROUP}/v1",
            )
            return
        elif kind in OTHER_KINDS and api_version != OTHER_KINDS[kind]:
            self._add(
                document, obj, "apiVersion", f"{kind} has apiVersion {OTHER_KINDS[kind]}, not {api_version!r}"
            )
            return
        if kind == "DeviceClass":
            self._device_class(document)
        elif kind == "ResourceClaim":
            self._claim_spec(document, obj.get("spec"), "spec")
        elif kind == "ResourceClaimTemplate":
            spec = obj.get("spec") or {}
            self._claim_spec(document, spec.get("spec"), "spec.spec")
        elif kind == "Pod":
            self._pod(
                document,
                obj.get("spec") or {},
                str((obj.get("metadata") or {}).get("namespace") or "default"),
            )
        elif kind in OTHER_KINDS:
            template = (obj.get("spec") or {}).get("template") or {}
            if kind == "CronJob":
                template = (((obj.get("spec") or {}).get("jobTemplate") or {}).get("spec") or {}).get(
                    "template"
                ) or {}
            namespace = str((obj.get("metadata") or {}).get("namespace") or "default")
            self._pod(document, template.get("spec") or {}, namespace)

    # ----------------------------------------------------------------------------------------------------
    def _selectors(self, document: Document, selectors: Any, where: str) -> None:
        if selectors is None:
            return
        if not isinstance(selectors, list):
            self._add(document, None, None, f"{where}.selectors must be a list")
            return
        for index, selector in enumerate(selectors):
            field = f"{where}.selectors[{index}]"
            cel = selector.get("cel") if isinstance(selector, Mapping) else None
            expression = cel.get("expression") if isinstance(cel, Mapping) else None
            if not isinstance(expression, str):
                self._add(document, selector, None, f"{field}: expected cel.expression (a string)")
                continue
            self._expression(document, cel, field + ".cel.expression", expression)

    def _expression(self, document: Document, node: Any, field: str, expression: str) -> None:
        hint_list: list[str] = []
        with contextlib.suppress(CelCompileError):  # a syntax error is reported below
            hint_list = hints(parse(expression))
        try:
            compile_selector(expression, self.release)
        except CelCompileError as error:
            self._add(
                document,
                node,
                "expression",
                f"{field}: {error.describe()} in {expression!r}",
                "; ".join(hint_list) or None,
            )
            return
        for hint in hint_list:
            self._add(document, node, "expression", f"{field}: suspicious selector {expression!r}", hint)

    def _device_class(self, document: Document) -> None:
        spec = document.obj.get("spec") or {}
        self._selectors(document, spec.get("selectors"), "spec")
        self._configs(document, spec.get("config"), "spec.config", None)

    def _configs(self, document: Document, configs: Any, where: str, request_names: set[str] | None) -> None:
        for index, config in enumerate(configs or ()):
            field = f"{where}[{index}]"
            if not isinstance(config, Mapping):
                self._add(document, None, None, f"{field}: expected an object")
                continue
            for ref in config.get("requests") or ():
                if request_names is not None and str(ref).split("/")[0] not in request_names:
                    self._add(
                        document,
                        config,
                        "requests",
                        f"{field}.requests: {ref!r} is not a request of this "
                        f"claim (requests: {', '.join(sorted(request_names))})",
                    )
            opaque = config.get("opaque")
            if not isinstance(opaque, Mapping):
                self._add(
                    document, config, None, f"{field}: opaque.driver and opaque.parameters are required"
                )
                continue
            if opaque.get("driver") != DRIVER or self.decode_config is None:
                continue
            parameters = opaque.get("parameters")
            try:
                self.decode_config(parameters if isinstance(parameters, Mapping) else {})
            except ValueError as error:
                self._add(document, opaque, "parameters", f"{field}.opaque.parameters: {error}")

    def _claim_spec(self, document: Document, spec: Any, where: str) -> None:
        if not isinstance(spec, Mapping):
            self._add(document, document.obj, "spec", f"{where} is required")
            return
        devices = spec.get("devices") or {}
        names: set[str] = set()
        for index, request in enumerate(devices.get("requests") or ()):
            field = f"{where}.devices.requests[{index}]"
            if not isinstance(request, Mapping):
                self._add(document, None, None, f"{field}: expected an object")
                continue
            name = str(request.get("name") or "")
            if not name:
                self._add(document, request, None, f"{field}.name is required")
            elif name in names:
                self._add(document, request, "name", f"{field}.name {name!r} is used twice")
            names.add(name)
            exactly = request.get("exactly")
            first = request.get("firstAvailable")
            flat = [
                k
                for k in ("deviceClassName", "selectors", "count", "allocationMode", "adminAccess")
                if k in request
            ]
            if flat:
                self._add(
                    document,
                    request,
                    flat[0],
                    f"{field}: {', '.join(flat)} directly under a request is the v1beta1 shape; "
                    f"resource.k8s.io/v1 rejects it",
                    f"move them under `exactly:` (e.g. exactly: {{deviceClassName: "
                    f"{request.get('deviceClassName', 'gpu.nvidia.com')}}})",
                )
            if exactly is not None and first is not None:
                self._add(
                    document, request, "exactly", f"{field}: set either exactly or firstAvailable, not both"
                )
            elif exactly is None and first is None and not flat:
                self._add(document, request, None, f"{field}: one of exactly or firstAvailable is required")
            if isinstance(exactly, Mapping):
                self._device_request(document, exactly, f"{field}.exactly")
            for sub_index, sub in enumerate(first or ()):
                if isinstance(sub, Mapping):
                    self._device_request(document, sub, f"{field}.firstAvailable[{sub_index}]")
        for index, constraint in enumerate(devices.get("constraints") or ()):
            field = f"{where}.devices.constraints[{index}]"
            if not isinstance(constraint, Mapping):
                continue
            for ref in constraint.get("requests") or ():
                if str(ref).split("/")[0] not in names:
                    self._add(
                        document,
                        constraint,
                        "requests",
                        f"{field}.requests: {ref!r} is not a request of this claim "
                        f"(requests: {', '.join(sorted(names)) or 'none'})",
                    )
            for key in ("matchAttribute", "distinctAttribute"):
                value = constraint.get(key)
                if value is not None and "/" not in str(value):
                    self._add(
                        document,
                        constraint,
                        key,
                        f"{field}.{key}: {value!r} must be fully qualified",
                        f"{key}: {DRIVER}/{value}",
                    )
                domain, _, name = str(value).partition("/")
                moved = MOVED_ATTRIBUTES.get((domain, name)) if value is not None else None
                if moved is not None:
                    self._add(
                        document,
                        constraint,
                        key,
                        f"{field}.{key}: attribute {value!r} is not published (nor by NVIDIA's driver): "
                        "no device has it, so the claim cannot be allocated",
                        f"{key}: {moved}",
                    )
                if value is not None and str(value).split("/")[-1] in ("index", "minor"):
                    self._add(
                        document,
                        constraint,
                        key,
                        f"{field}.{key}: attribute {value!r} is not published",
                        "NVIDIA's driver removed index and minor; use gpu.nvidia.com/parentUUID or uuid",
                    )
        self._configs(document, devices.get("config"), f"{where}.devices.config", names)

    def _device_request(self, document: Document, request: Mapping[str, Any], field: str) -> None:
        class_name = request.get("deviceClassName")
        if not class_name:
            self._add(document, request, None, f"{field}.deviceClassName is required")
        elif class_name not in self.classes:
            self._add(
                document,
                request,
                "deviceClassName",
                f"{field}.deviceClassName: DeviceClass {class_name!r} is not defined in the files "
                "nor built in",
                f"one of {', '.join(sorted(self.classes))}",
            )
        mode = request.get("allocationMode", "ExactCount")
        if mode not in ("ExactCount", "All"):
            self._add(
                document,
                request,
                "allocationMode",
                f"{field}.allocationMode: {mode!r} is not ExactCount or All",
            )
        count = request.get("count")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
            self._add(document, request, "count", f"{field}.count must be a positive integer")
        if mode == "All" and count is not None:
            self._add(document, request, "count", f"{field}.count must not be set with allocationMode All")
        self._selectors(document, request.get("selectors"), field)

    def _pod(self, document: Document, spec: Mapping[str, Any], namespace: str) -> None:
        pod_claims: set[str] = set()
        for index, entry in enumerate(spec.get("resourceClaims") or ()):
            field = f"spec.resourceClaims[{index}]"
            if not isinstance(entry, Mapping):
                continue
            pod_claims.add(str(entry.get("name") or ""))
            claim_name = entry.get("resourceClaimName")
            template_name = entry.get("resourceClaimTemplateName")
            if bool(claim_name) == bool(template_name):
                self._add(
                    document,
                    entry,
                    None,
                    f"{field}: exactly one of resourceClaimName or resourceClaimTemplateName is required",
                )
            elif claim_name and (namespace, str(claim_name)) not in self.claims:
                self._add(
                    document,
                    entry,
                    "resourceClaimName",
                    f"{field}.resourceClaimName: ResourceClaim {namespace}/{claim_name} is not in the files",
                )
            elif template_name and (namespace, str(template_name)) not in self.templates:
                self._add(
                    document,
                    entry,
                    "resourceClaimTemplateName",
                    f"{field}.resourceClaimTemplateName: ResourceClaimTemplate {namespace}/{template_name} "
                    f"is not in the files",
                )
        for group in ("initContainers", "containers"):
            for c_index, container in enumerate(spec.get(group) or ()):
                claims = ((container or {}).get("resources") or {}).get("claims") or ()
                for r_index, ref in enumerate(claims):
                    field = f"spec.{group}[{c_index}].resources.claims[{r_index}]"
                    name = str((ref or {}).get("name") or "")
                    if name not in pod_claims:
                        self._add(
                            document,
                            ref,
                            "name",
                            f"{field}.name: {name!r} is not in spec.resourceClaims "
                            f"({', '.join(sorted(pod_claims)) or 'none'})",
                        )
                        continue
                    request = (ref or {}).get("request")
                    if request:
                        self._check_container_request(
                            document, spec, namespace, name, str(request), ref, field
                        )

    def _check_container_request(
        self,
        document: Document,
        spec: Mapping[str, Any],
        namespace: str,
        name: str,
        request: str,
        ref: Any,
        field: str,
    ) -> None:
        for entry in spec.get("resourceClaims") or ():
            if str(entry.get("name")) != name:
                continue
            claim_spec = None
            if entry.get("resourceClaimName"):
                claim = self.claims.get((namespace, str(entry["resourceClaimName"])))
                claim_spec = (claim or {}).get("spec")
            elif entry.get("resourceClaimTemplateName"):
                template = self.templates.get((namespace, str(entry["resourceClaimTemplateName"])))
                claim_spec = ((template or {}).get("spec") or {}).get("spec")
            if not isinstance(claim_spec, Mapping):
                return
            names = {str(r.get("name")) for r in (claim_spec.get("devices") or {}).get("requests") or ()}
            if request.split("/")[0] not in names:
                self._add(
                    document,
                    ref,
                    "request",
                    f"{field}.request: {request!r} is not a request of claim "
                    f"{name!r} ({', '.join(sorted(names))})",
                )
