"""Reading Kubernetes manifests for the example and chart checks: documents, pod specs, claims."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
DRIVER = "gpu.nvidia.com"
# DeviceClass -> value of the device attribute `type` it selects (the chart's classes).
CLASS_TYPES = {"gpu.nvidia.com": "gpu", "mig.nvidia.com": "mig", "gpu-share.nvidia.com": "gpu-share"}
CLUSTER_SCOPED = {
    "Namespace",
    "DeviceClass",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "PriorityClass",
}
# The substitution contract with the end-to-end suite: images are replaced by a local busybox, so a container
# script may only use shell built-ins and these busybox applets.
SCRIPT_COMMANDS = {
    "echo",
    "env",
    "sort",
    "ls",
    "cat",
    "sleep",
    "trap",
    "wait",
    "true",
    "exit",
    "printf",
    "test",
}


@dataclass(frozen=True)
class Doc:
    file: Path
    index: int
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body.get("kind", ""))

    @property
    def name(self) -> str:
        return str(self.body.get("metadata", {}).get("name", ""))

    @property
    def namespace(self) -> str | None:
        ns = self.body.get("metadata", {}).get("namespace")
        return None if ns is None else str(ns)

    def where(self) -> str:
        return f"{self.file.relative_to(REPO)} document {self.index} ({self.kind} {self.name})"


def load_docs(path: Path) -> list[Doc]:
    docs = []
    for index, body in enumerate(yaml.safe_load_all(path.read_text())):
        if body is None:
            continue
        if not isinstance(body, dict):
            raise ValueError(f"{path} document {index}: expected a mapping, got {type(body).__name__}")
        docs.append(Doc(path, index, body))
    return docs


@dataclass(frozen=True)
class PodSource:
    """A pod spec, from a Pod or a workload's pod template."""

    doc: Doc
    spec: dict[str, Any]
    labels: dict[str, str]
    replicas: int  # how many pods the object makes at most at once


def pod_sources(docs: list[Doc]) -> Iterator[PodSource]:
    for doc in docs:
        body = doc.body
        if doc.kind == "Pod":
            yield PodSource(doc, body["spec"], dict(body["metadata"].get("labels", {})), 1)
        elif doc.kind in ("Deployment", "StatefulSet", "ReplicaSet"):
            template = body["spec"]["template"]
            yield PodSource(
                doc,
                template["spec"],
                dict(template["metadata"].get("labels", {})),
                int(body["spec"].get("replicas", 1)),
            )
        elif doc.kind == "Job":
            template = body["spec"]["template"]
            yield PodSource(
                doc,
                template["spec"],
                dict(template["metadata"].get("labels", {})),
                int(body["spec"].get("parallelism", 1)),
            )


def claim_spec(doc: Doc) -> dict[str, Any] | None:
    """The ResourceClaimSpec of a ResourceClaim or ResourceClaimTemplate."""
    if doc.kind == "ResourceClaim":
        return dict(doc.body.get("spec", {}))
    if doc.kind == "ResourceClaimTemplate":
        return dict(doc.body.get("spec", {}).get("spec", {}))
    return None


def request_names(spec: dict[str, Any]) -> set[str]:
    """Requests and `<request>/<subrequest>` names of a claim spec."""
    names: set[str] = set()
    for req in spec.get("devices", {}).get("requests", []):
        names.add(req["name"])
        for sub in req.get("firstAvailable", []) or []:
            names.add(f"{req['name']}/{sub['name']}")
    return names


def request_classes(spec: dict[str, Any]) -> dict[str, set[str]]:
    """Request (and subrequest) name -> the DeviceClasses it can be satisfied from."""
    out: dict[str, set[str]] = {}
    for req in spec.get("devices", {}).get("requests", []):
        if "exactly" in req:
            out[req["name"]] = {req["exactly"]["deviceClassName"]}
        else:
            subs = req.get("firstAvailable", [])
            out[req["name"]] = {s["deviceClassName"] for s in subs}
            for s in subs:
                out[f"{req['name']}/{s['name']}"] = {s["deviceClassName"]}
    return out


def script_commands(script: str) -> list[str]:
    """The command words of a simple `sh -c` script: the first word of each `;`, `|`, `&` or `&&` part."""
    # Drop quoted strings first so that separators inside them do not count.
    unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "''", script)
    words = []
    for part in re.split(r"\|\||&&|[;|&\n]", unquoted):
        tokens = part.split()
        if tokens:
            words.append(tokens[0])
    return words
