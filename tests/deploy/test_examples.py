"""Every example parses, uses resource.k8s.io/v1, keeps the e2e substitution contract, and its expect.yaml
fits both the schema and the manifests it describes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dra_gpu.config.api import decode_opaque_config
from dra_gpu.config.names import ConfigError

from .expect_model import SCHEMA_FILE, Expectation, ExpectationError, load_expectation, render_json_schema
from .manifest_walk import (
    CLASS_TYPES,
    CLUSTER_SCOPED,
    DRIVER,
    EXAMPLES,
    REPO,
    SCRIPT_COMMANDS,
    Doc,
    PodSource,
    claim_spec,
    load_docs,
    pod_sources,
    request_classes,
    request_names,
    script_commands,
)

EXAMPLE_DIRS = sorted(p for p in EXAMPLES.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def _load(example: Path) -> tuple[Expectation, list[Doc]]:
    expect = load_expectation(example / "expect.yaml")
    docs: list[Doc] = []
    for name in expect.manifests:
        docs.extend(load_docs(example / name))
    return expect, docs


def _rejected(expect: Expectation) -> set[tuple[str, str]]:
    return {(r.kind, r.name) for r in expect.rejected}


def test_there_are_examples() -> None:
    assert len(EXAMPLE_DIRS) >= 20, [p.name for p in EXAMPLE_DIRS]


def test_json_schema_file_is_current() -> None:
    assert SCHEMA_FILE.read_text() == render_json_schema(), (
        "examples/expect.schema.json is stale: run .venv/bin/python tests/deploy/expect_model.py --write"
    )


@pytest.mark.parametrize("example", EXAMPLE_DIRS, ids=lambda p: p.name)
def test_example_files(example: Path) -> None:
    expect = load_expectation(example / "expect.yaml")
    assert expect.name == example.name, "expect.yaml name must equal the folder name"
    readme = (example / "README.md").read_text()
    assert readme.startswith("# "), f"{example.name}/README.md must start with a title"
    for heading in ("## What it shows", "## What to expect"):
        assert heading in readme, f"{example.name}/README.md lacks the section {heading!r}"
    on_disk = {p.name for p in example.glob("*.yaml")} - {"expect.yaml"}
    assert set(expect.manifests) == on_disk, "expect.yaml manifests must list every manifest of the folder"


@pytest.mark.parametrize("example", EXAMPLE_DIRS, ids=lambda p: p.name)
def test_manifests_are_well_formed(example: Path) -> None:
    expect, docs = _load(example)
    first = docs[0]
    assert (first.kind, first.name) == ("Namespace", expect.namespace), (
        f"{first.where()}: the first object must be the example's Namespace {expect.namespace!r}"
    )
    seen: set[tuple[str, str]] = set()
    for doc in docs:
        assert doc.body.get("apiVersion") and doc.kind and doc.name, f"{doc.where()}: apiVersion/kind/name?"
        assert (doc.kind, doc.name) not in seen, f"{doc.where()}: duplicate object"
        seen.add((doc.kind, doc.name))
        if str(doc.body["apiVersion"]).startswith("resource.k8s.io/"):
            assert doc.body["apiVersion"] == "resource.k8s.io/v1", f"{doc.where()}: use resource.k8s.io/v1"
        if doc.kind in CLUSTER_SCOPED:
            assert doc.namespace is None, f"{doc.where()}: cluster-scoped object with a namespace"
        else:
            assert doc.namespace == expect.namespace, f"{doc.where()}: namespace must be {expect.namespace!r}"


def _check_requests(doc: Doc, spec: dict[str, Any]) -> None:
    requests = spec.get("devices", {}).get("requests", [])
    assert requests, f"{doc.where()}: no device requests"
    for req in requests:
        ways = [k for k in ("exactly", "firstAvailable") if k in req]
        assert len(ways) == 1, f"{doc.where()}: request {req.get('name')}: give exactly or firstAvailable"
        subs = [req["exactly"]] if "exactly" in req else req["firstAvailable"]
        for sub in subs:
            assert sub["deviceClassName"] in CLASS_TYPES, (
                f"{doc.where()}: unknown DeviceClass {sub['deviceClassName']!r}; "
                f"the chart installs {sorted(CLASS_TYPES)}"
            )
    names = request_names(spec)
    for section in ("config", "constraints"):
        for entry in spec.get("devices", {}).get(section, []):
            for name in entry.get("requests", []):
                assert name in names, f"{doc.where()}: {section} names unknown request {name!r}"


def _config_errors(spec: dict[str, Any]) -> list[str]:
    """Messages of the opaque configs this driver would refuse (the same decoder the webhook uses)."""
    errors = []
    for entry in spec.get("devices", {}).get("config", []):
        opaque = entry.get("opaque")
        assert opaque is not None, "only opaque configs are used in the examples"
        if opaque["driver"] != DRIVER:
            continue
        try:
            decode_opaque_config(opaque["parameters"]).validate_semantics()
        except ConfigError as exc:
            errors.append(str(exc))
    return errors


@pytest.mark.parametrize("example", EXAMPLE_DIRS, ids=lambda p: p.name)
def test_claims_and_configs(example: Path) -> None:
    expect, docs = _load(example)
    rejected = {r.name: r for r in expect.rejected}
    for doc in docs:
        spec = claim_spec(doc)
        if spec is None:
            continue
        _check_requests(doc, spec)
        errors = _config_errors(spec)
        if doc.name in rejected:
            want = rejected[doc.name]
            assert want.kind == doc.kind, f"{doc.where()}: rejected entry says kind {want.kind}"
            assert errors, f"{doc.where()}: listed as rejected but the driver's config decoder accepts it"
            assert any(re.search(want.messageRegex, e) for e in errors), (
                f"{doc.where()}: no error matches {want.messageRegex!r}: {errors}"
            )
        else:
            assert not errors, f"{doc.where()}: invalid opaque config: {errors}"
    kinds_names = {(d.kind, d.name) for d in docs}
    for r in expect.rejected:
        assert (r.kind, r.name) in kinds_names, f"rejected object {r.kind}/{r.name} is not in the manifests"


def _check_pod_spec(
    src: PodSource, claims: dict[tuple[str, str], dict[str, Any]], rejected: set[tuple[str, str]]
) -> None:
    where = src.doc.where()
    pod_claims: dict[str, dict[str, Any]] = {}
    for pc in src.spec.get("resourceClaims", []):
        if "resourceClaimTemplateName" in pc:
            key = ("ResourceClaimTemplate", pc["resourceClaimTemplateName"])
        else:
            key = ("ResourceClaim", pc["resourceClaimName"])
        assert key in claims, f"{where}: pod claim {pc['name']} refers to {key}, not in the manifests"
        assert key not in rejected, f"{where}: pod claim {pc['name']} refers to an object the webhook rejects"
        pod_claims[pc["name"]] = claims[key]
    for ctr in src.spec["containers"]:
        cwhere = f"{where} container {ctr['name']}"
        assert "registry.local" not in ctr["image"], f"{cwhere}: use a public image; e2e substitutes it"
        assert "imagePullPolicy" not in ctr, f"{cwhere}: leave imagePullPolicy to the e2e substitution"
        command = ctr.get("command", [])
        assert command[:2] == ["sh", "-c"] and len(command) == 3 and "args" not in ctr, (
            f"{cwhere}: command must be [sh, -c, <script>] so that busybox can run it"
        )
        unknown = set(script_commands(command[2])) - SCRIPT_COMMANDS
        assert not unknown, f"{cwhere}: commands {sorted(unknown)} are outside the busybox contract"
        for ref in ctr.get("resources", {}).get("claims", []):
            assert ref["name"] in pod_claims, f"{cwhere}: claim {ref['name']} is not a pod resourceClaim"
            if "request" in ref:
                assert ref["request"] in request_names(pod_claims[ref["name"]]), (
                    f"{cwhere}: request {ref['request']} is not in claim {ref['name']}"
                )


@pytest.mark.parametrize("example", EXAMPLE_DIRS, ids=lambda p: p.name)
def test_pod_specs(example: Path) -> None:
    expect, docs = _load(example)
    claims = {(d.kind, d.name): spec for d in docs if (spec := claim_spec(d)) is not None}
    for src in pod_sources(docs):
        _check_pod_spec(src, claims, _rejected(expect))


def _find_pods(expect: Expectation, docs: list[Doc]) -> dict[str, PodSource]:
    """Expected pod name (or the selector as text) -> the pod source it refers to; fails on dangling names."""
    sources = list(pod_sources(docs))
    found: dict[str, PodSource] = {}
    for pod in expect.pods:
        if pod.name is not None:
            hits = [s for s in sources if s.doc.kind == "Pod" and s.doc.name == pod.name]
            assert hits, f"expected pod {pod.name} is not in the manifests"
            found[pod.name] = hits[0]
        else:
            assert pod.selector is not None
            hits = [s for s in sources if pod.selector.items() <= s.labels.items()]
            assert len(hits) == 1, f"selector {pod.selector} must match one workload, matched {len(hits)}"
            assert hits[0].replicas == pod.count, (
                f"selector {pod.selector}: count {pod.count}, "
                f"but {hits[0].doc.where()} makes {hits[0].replicas} pods"
            )
            found[str(pod.selector)] = hits[0]
    return found


def _container_names(src: PodSource) -> set[str]:
    return {c["name"] for c in src.spec["containers"]}


@pytest.mark.parametrize("example", EXAMPLE_DIRS, ids=lambda p: p.name)
def test_expectations_match_manifests(example: Path) -> None:
    expect, docs = _load(example)
    pods = _find_pods(expect, docs)
    claims = {(d.kind, d.name): spec for d in docs if (spec := claim_spec(d)) is not None}
    for key, pod in zip(pods, expect.pods, strict=True):
        src = pods[key]
        for ctr in pod.containers:
            assert ctr.name in _container_names(src), f"pod {key}: no container {ctr.name}"
            if ctr.devices is not None:
                _check_device_type(src, ctr.name, ctr.devices.type, ctr.devices.request, claims)
    for group in (*expect.sameDevices, *expect.distinctDevices):
        for ref in group:
            pod_name, ctr_name = ref.split("/")
            assert pod_name in pods, f"{ref}: no expected pod {pod_name} (name it under pods)"
            assert ctr_name in _container_names(pods[pod_name]), f"{ref}: no container {ctr_name}"
    for claim in expect.claims:
        cref = claim.ref
        if cref.name is not None:
            assert ("ResourceClaim", cref.name) in claims, f"claim {cref.name} is not a ResourceClaim here"
            continue
        key = cref.pod if cref.pod is not None else str(cref.podSelector)
        assert key in pods, f"claim ref {cref}: the pod is not listed under pods"
        names = {pc["name"] for pc in pods[key].spec.get("resourceClaims", [])}
        assert cref.podClaim in names, f"claim ref {cref}: no pod claim {cref.podClaim} in {sorted(names)}"


def _check_device_type(
    src: PodSource,
    ctr_name: str,
    dev_type: str,
    request: str | None,
    claims: dict[tuple[str, str], dict[str, Any]],
) -> None:
    """The expected device type must be one the container's requests can produce."""
    ctr = next(c for c in src.spec["containers"] if c["name"] == ctr_name)
    refs = ctr.get("resources", {}).get("claims", [])
    if not refs:  # extended resource: the DeviceClass gpu.nvidia.com serves nvidia.com/gpu
        limits = ctr.get("resources", {}).get("limits", {})
        assert "nvidia.com/gpu" in limits, f"{ctr_name}: neither claims nor nvidia.com/gpu"
        assert dev_type == "gpu"
        return
    possible: set[str] = set()
    by_name = {pc["name"]: pc for pc in src.spec.get("resourceClaims", [])}
    for ref in refs:
        pc = by_name[ref["name"]]
        key = (
            ("ResourceClaimTemplate", pc["resourceClaimTemplateName"])
            if "resourceClaimTemplateName" in pc
            else ("ResourceClaim", pc["resourceClaimName"])
        )
        classes = request_classes(claims[key])
        for req_name, class_names in classes.items():
            if "request" in ref and req_name.split("/")[0] != ref["request"]:
                continue
            if request is not None and req_name != request:
                continue
            possible |= {CLASS_TYPES[c] for c in class_names}
    assert dev_type in possible, f"{ctr_name}: expects type {dev_type}, its requests give {sorted(possible)}"


def test_footprints_fit_the_simulated_node() -> None:
    for example in EXAMPLE_DIRS:
        expect = load_expectation(example / "expect.yaml")
        assert expect.footprint.gpus <= 8, example.name


BAD_EXPECTATIONS = [
    (
        "schemaVersion: 1\nname: x\nsummary: s\nnamespace: x\nmanifests: [a.yaml]\nfootprint: {gpus: 1}\n"
        "pods: [{name: p, phase: Running, containers: [{name: c, devices: {count: 1, typ: gpu}}]}]\n",
        "pods.0.containers.0.devices.typ: Extra inputs are not permitted",
    ),
    (
        "schemaVersion: 1\nname: x\nsummary: s\nnamespace: x\nmanifests: [a.yaml]\nfootprint: {gpus: 1}\n"
        "pods: [{name: p, phase: Running, containers: [{name: c, "
        "devices: {count: 2, type: mig, profiles: [1g.10gb]}}]}]\n",
        "profiles lists 1 entries but count is 2",
    ),
    (
        "schemaVersion: 1\nname: x\nsummary: s\nnamespace: x\nmanifests: [a.yaml]\nfootprint: {gpus: 1}\n"
        "pods: [{selector: {app: a}, count: 3, phases: {Running: 2}}]\n",
        "phases add up to 2 pods but count is 3",
    ),
    (
        "schemaVersion: 1\nname: x\nsummary: s\nnamespace: x\nmanifests: [a.yaml]\nfootprint: {gpus: 1}\n"
        "pods: [{name: p, phase: Running, events: [{reason: R, messageRegex: 'x'}]}]\n",
        "no pod is expected Pending",
    ),
    (
        "schemaVersion: 1\nname: x\nsummary: s\nnamespace: x\nmanifests: [a.yaml]\nfootprint: {gpus: 1}\n"
        "claims: [{ref: {pod: p}, allocated: false}]\n",
        "together with podClaim",
    ),
    (
        "schemaVersion: 1\nname: x\nsummary: s\nnamespace: x\nmanifests: [a.yaml]\nfootprint: {gpus: 1}\n"
        "rejected: [{kind: ResourceClaim, name: c, messageRegex: '(unclosed'}]\n",
        "is not a valid regular expression",
    ),
    (
        "schemaVersion: 1\nname: x\nsummary: s\nnamespace: x\nmanifests: [a.yaml]\nfootprint: {gpus: 1}\n"
        "claims: [{ref: {name: c}, consumedCapacity: {memory: ten}}]\n",
        "claims.0.consumedCapacity.memory",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD_EXPECTATIONS)
def test_schema_rejects_bad_expectations_readably(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "expect.yaml"
    path.write_text(text)
    with pytest.raises(ExpectationError) as err:
        load_expectation(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_docs_index_lists_every_example() -> None:
    index = (REPO / "docs" / "examples.md").read_text()
    for example in EXAMPLE_DIRS:
        assert f"examples/{example.name}/" in index, f"docs/examples.md does not list {example.name}"
