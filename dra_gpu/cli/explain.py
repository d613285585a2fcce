"""`dra-gpu explain`: which devices a claim matches, why the others are rejected, what would be allocated.

Inputs: claims, claim templates, pods and DeviceClasses from `-f` (files or directories, multi-document YAML);
the inventory from a live cluster (`--kubeconfig`), from ResourceSlice files (`--slices`), or from a built-in
hardware profile (`--hardware dgx-a100 --nodes 4`). Without DeviceClasses, the chart's built-in ones apply.

Exit codes: 0 every claim is allocatable, 1 some claim is not, 2 bad input (the message names the file, object
and field, and for CEL the expression and the position).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_gpu.allocator.builtin_classes import builtin_device_classes
from dra_gpu.allocator.claims import DeviceClassSpec, claim_from_object, parse_device_class
from dra_gpu.allocator.explain import (
    ClaimExplanation,
    RequestExplanation,
    explain,
    isolation_notes,
    reason_groups,
    result_json,
)
from dra_gpu.allocator.extended_resources import extended_resource_claim
from dra_gpu.allocator.model import ClaimSpec, InputError, Rejection
from dra_gpu.allocator.pools import Node, SliceIndex
from dra_gpu.allocator.replicate import replicate_slices
from dra_gpu.allocator.search import Existing
from dra_gpu.cel.release import MODELED_RELEASE, OLDEST_SUPPORTED, ReleaseError, parse_minor
from dra_gpu.cli.explain_json import write_json
from dra_gpu.config.quantity import format_quantity
from dra_gpu.lint.manifests import Document, ManifestError, load_documents

# What explain models: the kube-scheduler's allocator and CEL environment of this release, with the alpha
# DRAListTypeAttributes behaviour (list attributes reach CEL as lists; matchAttribute needs a value common to
# all devices, distinctAttribute pairwise disjoint values). For scalar attributes that is what every release
# does, and list attributes only exist in clusters that have the gate on.
SEMANTICS = (
    f"kube-scheduler of Kubernetes {MODELED_RELEASE[0]}.{MODELED_RELEASE[1]} "
    "(list attributes as with DRAListTypeAttributes)"
)
EXIT_OK = 0
EXIT_NOT_ALLOCATABLE = 1
EXIT_BAD_INPUT = 2
TEMPLATE_NODE = "dra-gpu-explain-template-node"


class UsageError(Exception):
    pass


PRETTY_JSON_MAX_NODES = 100


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="explain how claims would be allocated (matching devices, rejections, allocation)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        default=[],
        metavar="PATH",
        help="claims, claim templates, pods and DeviceClasses (file or directory; repeatable)",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--kubeconfig", help="read ResourceSlices, ResourceClaims, DeviceClasses and Nodes from this cluster"
    )
    source.add_argument(
        "--slices",
        action="append",
        metavar="PATH",
        help="ResourceSlices (and optionally Nodes and allocated ResourceClaims) from files",
    )
    source.add_argument("--hardware", metavar="PROFILE", help="simulate nodes of a built-in hardware profile")
    parser.add_argument("--nodes", type=int, default=1, help="number of nodes with --hardware (default 1)")
    parser.add_argument(
        "--consumable-shares",
        default="disabled",
        metavar="MODE",
        help="with --hardware: nodes whose plugin runs with --consumable-shares MODE (disabled, memory, "
        "unlimited or N), for NVIDIA's consumable-shares manifests (default disabled)",
    )
    parser.add_argument(
        "--kubernetes-version",
        default=f"{MODELED_RELEASE[0]}.{MODELED_RELEASE[1]}",
        metavar="MAJOR.MINOR",
        help=f"slice layout for --hardware (1.34: counters per GPU slice; 1.35+: split), "
        f"{OLDEST_SUPPORTED[0]}.{OLDEST_SUPPORTED[1]} to {MODELED_RELEASE[0]}.{MODELED_RELEASE[1]}; the "
        f"allocation semantics are always those of {MODELED_RELEASE[0]}.{MODELED_RELEASE[1]}",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "json"),
        default="table",
        help=f"json is indented for up to {PRETTY_JSON_MAX_NODES} nodes and compact above (the same "
        "document; indenting a fleet's matching and rejected devices would take longer than explaining them)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="list every device in the table output")
    parser.set_defaults(func=run)


@dataclass
class Inventory:
    slices: list[Mapping[str, Any]] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    claims: list[Mapping[str, Any]] = field(default_factory=list)  # existing claims (allocations)
    classes: list[Mapping[str, Any]] = field(default_factory=list)
    templates: list[Mapping[str, Any]] = field(default_factory=list)
    description: str = ""


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (InputError, ManifestError, UsageError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as error:  # never a stack trace for the user
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _run(args: argparse.Namespace) -> int:
    if not args.filename:
        raise UsageError("nothing to explain: give claims, claim templates or pods with -f PATH")
    try:
        target = parse_minor(args.kubernetes_version)
    except ReleaseError as error:
        raise UsageError(str(error)) from None
    documents = load_documents(args.filename)
    inventory = _load_inventory(args)
    classes, assumed = _device_classes(documents, inventory)
    groups, notes = _claim_groups(documents, inventory, classes)
    if not groups:
        raise UsageError(
            "no ResourceClaim, ResourceClaimTemplate, Pod with resourceClaims or Pod with an extended "
            "resource of a DeviceClass found in the -f input"
        )
    index = SliceIndex(inventory.slices)
    # Node objects give labels (for nodeSelector slices); slices may name nodes that have no Node object.
    nodes = list(inventory.nodes)
    known = {node.name for node in nodes}
    nodes += [Node(name) for name in sorted(index.node_names - known)]
    skip = {(c.namespace, c.name) for group in groups for c in group}
    existing = Existing.from_claims(inventory.claims, skip)
    explanations = explain(groups, classes, index, nodes, existing)
    if assumed:
        notes.insert(0, f"DeviceClasses not given, built-in ones assumed: {', '.join(assumed)}")
    if target != MODELED_RELEASE:
        notes.append(
            f"--kubernetes-version {target[0]}.{target[1]} sets the slice layout only; allocation follows "
            f"the {SEMANTICS}; check CEL for {target[0]}.{target[1]} with "
            f"`dra-gpu lint --kubernetes-version {target[0]}.{target[1]}`"
        )
    if args.output == "json":
        indent = 2 if len(nodes) <= PRETTY_JSON_MAX_NODES else None  # None: json's C encoder, ~10x faster
        write_json(_to_json(explanations, inventory, notes, len(nodes)), sys.stdout, indent=indent)
    else:
        print(_to_table(explanations, inventory, notes, len(nodes), args.verbose))
    return EXIT_OK if all(e.allocatable for e in explanations) else EXIT_NOT_ALLOCATABLE


# ----------------------------------------------------------------------------------------------------
# Inventory sources


def _load_inventory(args: argparse.Namespace) -> Inventory:
    if args.kubeconfig:
        return _live_inventory(args.kubeconfig)
    if args.slices:
        return _file_inventory(args.slices)
    if args.hardware:
        return _hardware_inventory(
            args.hardware, args.nodes, args.kubernetes_version, getattr(args, "consumable_shares", "disabled")
        )
    raise UsageError("no inventory: use --kubeconfig, --slices PATH, or --hardware PROFILE [--nodes N]")


def _file_inventory(paths: Sequence[str]) -> Inventory:
    inventory = Inventory(description=f"ResourceSlices from {', '.join(paths)}")
    for document in load_documents(paths):
        obj = document.obj
        kind = obj.get("kind") if isinstance(obj, Mapping) else None
        if kind == "ResourceSlice":
            _check_v1(document)
            inventory.slices.append(obj)
        elif kind == "Node":
            meta = obj.get("metadata") or {}
            inventory.nodes.append(Node(str(meta.get("name", "")), dict(meta.get("labels") or {})))
        elif kind == "ResourceClaim":
            inventory.claims.append(obj)
        elif kind == "DeviceClass":
            inventory.classes.append(obj)
    if not inventory.slices:
        raise UsageError(f"no ResourceSlice found in {', '.join(paths)}")
    return inventory


def _check_v1(document: Document) -> None:
    api_version = document.obj.get("apiVersion")
    if api_version != "resource.k8s.io/v1":
        raise InputError(
            f"{document.where}: {document.obj.get('kind')} has apiVersion {api_version!r}; "
            f"explain reads resource.k8s.io/v1 objects"
        )


def _hardware_inventory(
    profile: str, count: int, kubernetes_version: str, consumable_shares: str = "disabled"
) -> Inventory:
    from dra_gpu.hardware.interface import HardwareError
    from dra_gpu.hardware.loader import open_hardware
    from dra_gpu.inventory.consumable_shares import parse_consumable_shares
    from dra_gpu.inventory.device_model import ModelOptions, build_device_model
    from dra_gpu.slices.slice_builder import build_slices

    if count < 1:
        raise UsageError("--nodes must be at least 1")
    try:
        shares = parse_consumable_shares(consumable_shares)
    except ValueError as error:
        raise UsageError(str(error)) from None
    try:
        major, minor = parse_minor(kubernetes_version)
    except ReleaseError as error:
        raise UsageError(str(error)) from None
    root = tempfile.mkdtemp(prefix="dra-gpu-explain-", dir="/tmp")
    try:
        hardware = open_hardware(profile, root, seed="explain")
        try:
            discovery = hardware.discover()
        finally:
            hardware.close()
    except HardwareError as error:
        raise UsageError(f"--hardware {profile}: {error}") from None
    finally:
        shutil.rmtree(root, ignore_errors=True)
    model = build_device_model(discovery, ModelOptions(consumable_shares=shares))
    width = len(str(count - 1))
    names = [f"node-{i:0{width}d}" for i in range(count)]
    inventory = Inventory(
        description=f"hardware profile {profile} x {count} node(s), Kubernetes {major}.{minor} "
        f"slice layout (every node has the same GPUs)"
    )
    # Every node has the same device model, so the slices differ only in the node name: build them once for a
    # placeholder name and replicate them, sharing the device entries (build_slices per node costs ~100 us per
    # device, and 1,000 separate copies of a DGX H100 node take 2 GB).
    template = build_slices(model, TEMPLATE_NODE, (major, minor))
    inventory.slices = replicate_slices(template, TEMPLATE_NODE, names)
    inventory.nodes = [Node(name, {"kubernetes.io/hostname": name}) for name in names]
    return inventory


def _live_inventory(kubeconfig: str) -> Inventory:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    from dra_gpu.kube.client import request_json

    try:
        api_client = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except Exception as error:
        raise UsageError(f"--kubeconfig {kubeconfig}: {error}") from None
    custom = client.CustomObjectsApi(api_client)
    inventory = Inventory(description=f"live cluster ({kubeconfig})")

    def items(plural: str) -> list[Mapping[str, Any]]:
        listed: Any = custom.list_cluster_custom_object("resource.k8s.io", "v1", plural)
        return list(listed["items"])

    try:
        inventory.slices = items("resourceslices")
        inventory.claims = items("resourceclaims")
        inventory.classes = items("deviceclasses")
        inventory.templates = items("resourceclaimtemplates")
        for item in request_json(api_client, "GET", "/api/v1/nodes")["items"]:
            meta = item.get("metadata") or {}
            inventory.nodes.append(Node(str(meta.get("name")), dict(meta.get("labels") or {})))
    except ApiException as error:
        raise UsageError(f"reading the cluster failed: HTTP {error.status} {error.reason}") from None
    except Exception as error:
        raise UsageError(f"reading the cluster failed: {error}") from None
    finally:
        api_client.close()
    return inventory


# ----------------------------------------------------------------------------------------------------
# Claims and classes from the input


def _device_classes(
    documents: Sequence[Document], inventory: Inventory
) -> tuple[dict[str, DeviceClassSpec], list[str]]:
    classes: dict[str, DeviceClassSpec] = {}
    for obj in inventory.classes:
        parsed = parse_device_class(obj)
        classes[parsed.name] = parsed
    for document in documents:
        if isinstance(document.obj, Mapping) and document.obj.get("kind") == "DeviceClass":
            try:
                parsed = parse_device_class(document.obj)
            except InputError as error:
                raise InputError(f"{document.where}: {error}") from None
            classes[parsed.name] = parsed
    assumed = []
    if not classes:
        for obj in builtin_device_classes():
            parsed = parse_device_class(obj, builtin=True)
            classes[parsed.name] = parsed
            assumed.append(parsed.name)
    return classes, assumed


def _claim_groups(
    documents: Sequence[Document], inventory: Inventory, classes: Mapping[str, DeviceClassSpec]
) -> tuple[list[list[ClaimSpec]], list[str]]:
    notes: list[str] = []
    extended_names = {c.extended_resource_name: c.name for c in classes.values() if c.extended_resource_name}
    class_names = frozenset(classes)
    claims: dict[tuple[str, str], tuple[Document | None, Mapping[str, Any]]] = {}
    templates: dict[tuple[str, str], tuple[Document | None, Mapping[str, Any]]] = {}
    pods: list[Document] = []
    for obj in inventory.templates:
        meta = obj.get("metadata") or {}
        templates[(str(meta.get("namespace") or "default"), str(meta.get("name")))] = (None, obj)
    live_claims = {}
    for obj in inventory.claims:
        meta = obj.get("metadata") or {}
        live_claims[(str(meta.get("namespace") or "default"), str(meta.get("name")))] = (None, obj)
    for document in documents:
        obj = document.obj
        if not isinstance(obj, Mapping) or "kind" not in obj:
            raise InputError(f"{document.where}: not a Kubernetes object (no kind)")
        kind = obj["kind"]
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
        if kind in ("ResourceClaim", "ResourceClaimTemplate"):
            _check_v1(document)
            (claims if kind == "ResourceClaim" else templates)[key] = (document, obj)
        elif kind == "Pod":
            pods.append(document)
        elif kind not in ("DeviceClass", "ResourceSlice", "Node"):
            notes.append(f"{document.where}: {kind} ignored")
    groups: list[list[ClaimSpec]] = []
    used: set[tuple[str, str, str]] = set()
    for document in pods:
        pod = document.obj
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        pod_name = str(meta.get("name") or "")
        group = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
            ref_name = entry.get("resourceClaimName")
            template_name = entry.get("resourceClaimTemplateName")
            if ref_name:
                found = claims.get((namespace, ref_name)) or live_claims.get((namespace, ref_name))
                if found is None:
                    raise InputError(
                        f"{document.where}: Pod {namespace}/{pod_name} resourceClaims "
                        f"{entry.get('name')!r}: ResourceClaim {ref_name!r} not found in the input"
                    )
                used.add(("ResourceClaim", namespace, ref_name))
                group.append(_parse_claim(found))
            elif template_name:
                found = templates.get((namespace, template_name))
                if found is None:
                    raise InputError(
                        f"{document.where}: Pod {namespace}/{pod_name} resourceClaims "
                        f"{entry.get('name')!r}: ResourceClaimTemplate {template_name!r} not found"
                    )
                used.add(("ResourceClaimTemplate", namespace, template_name))
                claim = _parse_claim(found)
                claim.name = f"{pod_name}-{entry.get('name')}"  # what the control plane would create
                claim.source = f"template {template_name} of pod {pod_name}"
                group.append(claim)
            else:
                raise InputError(
                    f"{document.where}: Pod {namespace}/{pod_name} resourceClaims "
                    f"{entry.get('name')!r}: needs resourceClaimName or resourceClaimTemplateName"
                )
        try:
            extended = extended_resource_claim(pod, extended_names, class_names)
        except InputError as error:
            raise InputError(f"{document.where}: {error}") from None
        if extended is not None:
            claim = _parse_claim((document, extended))
            claim.source = f"extended resources of pod {pod_name} (made by kube-scheduler)"
            group.append(claim)
        if group:
            groups.append(group)
    for (namespace, name), found in claims.items():
        if ("ResourceClaim", namespace, name) not in used:
            groups.append([_parse_claim(found)])
    for (namespace, name), found in templates.items():
        if ("ResourceClaimTemplate", namespace, name) not in used and found[0] is not None:
            groups.append([_parse_claim(found)])
    return groups, notes


def _parse_claim(found: tuple[Document | None, Mapping[str, Any]]) -> ClaimSpec:
    document, obj = found
    try:
        return claim_from_object(obj)
    except InputError as error:
        if document is not None:
            raise InputError(f"{document.where}: {error}") from None
        raise


# ----------------------------------------------------------------------------------------------------
# Output


def _claim_label(explanation: ClaimExplanation) -> str:
    return f"{explanation.namespace}/{explanation.name}"


def _to_json(
    explanations: Sequence[ClaimExplanation], inventory: Inventory, notes: Sequence[str], node_count: int
) -> dict[str, Any]:
    return {
        "kubernetesVersion": f"{MODELED_RELEASE[0]}.{MODELED_RELEASE[1]}",  # whose scheduler is modeled
        "inventory": {
            "source": inventory.description,
            "nodes": node_count,
            "devices": sum(len(s.get("spec", {}).get("devices") or ()) for s in inventory.slices),
        },
        "notes": list(notes),
        "claims": [
            {
                "name": e.name,
                "namespace": e.namespace,
                "allocatable": e.allocatable,
                "node": e.node,
                "reason": e.reason,
                # each distinct per-node reason once with its node count (added field; `reason` unchanged)
                "reasonGroups": reason_groups(e.node_failures) if not e.allocatable else [],
                "requests": [_request_json(r) for r in e.requests],
                # what MPS cannot isolate, for claims that would share a GPU through it (else empty)
                "isolation": isolation_notes(e.results, e.configs) if e.allocatable else [],
                "allocation": None
                if not e.allocatable
                else {
                    "nodeName": e.node,
                    "devices": {
                        "results": [result_json(r) for r in e.results],
                        "config": e.configs,
                    },
                },
            }
            for e in explanations
        ],
    }


def _request_json(request: RequestExplanation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": request.name,
        "matching": request.matching,
        "rejected": request.rejected,  # streamed by write_json: a list of {device, reason, kind}
        "allocated": request.allocated,
    }
    if request.subrequests:
        out["subrequests"] = [
            {
                "name": s.name,
                "matching": s.matching,
                "allocated": s.allocated,
                "rejected": s.rejected,
            }
            for s in request.subrequests
        ]
    return out


def _quantity_text(value: Any) -> str:
    return format_quantity(value, binary_si=True)


def _sample(labels: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(labels[:limit])
    return shown + (f", ... and {len(labels) - limit} more" if len(labels) > limit else "")


def _to_table(
    explanations: Sequence[ClaimExplanation],
    inventory: Inventory,
    notes: Sequence[str],
    node_count: int,
    verbose: bool,
) -> str:
    lines = [
        f"Inventory: {inventory.description}: {node_count} node(s), "
        f"{sum(len(s.get('spec', {}).get('devices') or ()) for s in inventory.slices)} device(s)",
        f"Semantics: {SEMANTICS}",
    ]
    lines += [f"Note: {note}" for note in notes]
    for explanation in explanations:
        lines.append("")
        if explanation.allocatable:
            lines.append(f"ResourceClaim {_claim_label(explanation)}: ALLOCATABLE on node {explanation.node}")
        else:
            lines.append(f"ResourceClaim {_claim_label(explanation)}: NOT ALLOCATABLE")
            lines.append(f"  why: {explanation.reason}")
            for group in reason_groups(explanation.node_failures):
                lines.append(
                    f"    on {group['nodes']} node(s), e.g. {', '.join(group['examples'])}: {group['reason']}"
                )
        for request in explanation.requests:
            lines.append(f"  request {request.name}:")
            lines.extend(_request_lines(request, verbose, "    "))
            for sub in request.subrequests:
                lines.append(f"    subrequest {sub.name}:")
                lines.extend(_request_lines(sub, verbose, "      "))
        for result in explanation.results:
            extra = ""
            if result.share_id:
                consumed = ", ".join(
                    f"{k}={_quantity_text(v)}" for k, v in (result.consumed_capacity or {}).items()
                )
                extra = f" (shared; consumes {consumed})"
            lines.append(f"  -> {result.request}: {result.pool}/{result.device}{extra}")
        if explanation.allocatable:
            for note in isolation_notes(explanation.results, explanation.configs):
                lines.append(f"  isolation: {note}")
    return "\n".join(lines)


def _request_lines(request: Any, verbose: bool, indent: str) -> list[str]:
    lines = [
        f"{indent}matching: {len(request.matching)} device(s)"
        + (f": {_sample(request.matching, 1000 if verbose else 4)}" if request.matching else "")
    ]
    if request.allocated:
        lines.append(f"{indent}allocated: {', '.join(request.allocated)}")
    if request.rejected:
        lines.append(f"{indent}rejected: {len(request.rejected)} device(s)")
        grouped: dict[str, list[Rejection]] = {}
        for rejection in request.rejected:
            grouped.setdefault(rejection.reason, []).append(rejection)
        for reason, items in sorted(grouped.items(), key=lambda kv: -len(kv[1])):
            labels = [r.device for r in items]
            lines.append(f"{indent}  {len(items)} x {reason}")
            lines.append(f"{indent}      e.g. {_sample(labels, 1000 if verbose else 3)}")
    return lines
